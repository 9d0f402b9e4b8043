"""Captures made once per session: bert-tiny (fast) and the embedded MiniLM (real weights)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_capture(tiny_models):
    import introspect
    from introspect.dump import capture

    loaded = tiny_models("base")
    return capture(loaded.model, introspect.tokenize(loaded.tokenizer), noise=True)


@pytest.fixture(scope="session")
def minilm_capture_file(tmp_path_factory, minilm):
    """The embedded MiniLM on the tutorial's texts, written as `introspect capture` does."""
    import introspect
    from introspect.dump import capture, capture_bytes

    path = tmp_path_factory.mktemp("capture") / "ref.safetensors"
    taken = capture(minilm.model, introspect.tokenize(minilm.tokenizer), noise=True)
    path.write_bytes(capture_bytes(taken))
    return path
