"""Where models come from, and the checks they pass before anything runs.

- ``load``: ``load_model`` and ``tokenize``: the embedded MiniLM, a local folder, a
  random-init configuration (BERT-tiny/base/large and the cousins).
- ``cuts``: texts cut before the tokenizer truncates them, so memory stays linear.
- ``validate``: checkpoint folders and configurations checked before loading.
- ``ports``: a user's port (``file.py:build``) imported, built and guarded.
- ``families``: the BERT family and the decoders: configurations, heads, what traces.
"""
