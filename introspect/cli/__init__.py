"""The ``introspect`` command line: one module per subcommand, dispatched by ``main``.

Only this package touches files and the terminal. Subcommand modules import torch and
transformers inside ``run`` so that ``introspect --help`` starts fast.
"""
