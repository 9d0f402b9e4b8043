"""Shared fixtures: offline mode, and small HF models built once per session."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Keep the trace cache's entries of the tests out of the user's cache folder: a folder of
# this process's own (each pytest-xdist worker has one), removed when it exits.
os.environ["INTROSPECT_CACHE_DIR"] = tempfile.mkdtemp(prefix="introspect-tests-")
atexit.register(shutil.rmtree, os.environ["INTROSPECT_CACHE_DIR"], ignore_errors=True)
# OpenMP threads that wait for work sleep instead of spinning: with a pytest-xdist worker a
# core (make test), or any other load, spinning threads take the cores the other workers
# need (measured here: 4x the CPU time on tests/diff/test_faults.py and tests/render). The
# thread count stays, and with it the rounding of the numeric tests. Set before torch is
# imported (libgomp reads it once); the CLI processes the tests start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The tests expect piped output with no COLUMNS (the CLI wraps prose only where it is set).
# pytest's debugger imports readline, which exports COLUMNS=80 and LINES=24 to every process
# started after it: a pytest-xdist worker started with them wrapped the verdicts at 80.
for name in ("COLUMNS", "LINES"):
    os.environ.pop(name, None)

import pytest  # noqa: E402
import torch  # noqa: E402

TEXTS = ("I love cats!", "He hates pineapple pizza.")


def make_batch(batch: int, seq: int, *, padded: bool, choices: int = 0,
               seed: int = 0) -> dict[str, torch.Tensor]:
    """Random token ids with both segments; the last rows padded when ``padded``."""
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, choices, seq) if choices else (batch, seq)
    input_ids = torch.randint(1000, 30000, shape, generator=generator)
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[..., seq // 2:] = 1
    attention_mask = torch.ones_like(input_ids)
    if padded:
        attention_mask[1:, ..., seq - 3:] = 0  # every row but the first is padded
        input_ids[1:, ..., seq - 3:] = 0
    return {"input_ids": input_ids, "token_type_ids": token_type_ids,
            "attention_mask": attention_mask}


@pytest.fixture(scope="session")
def tiny_models():
    """Loaded bert-tiny models by (head, attn), built on first use."""
    from introspect.models.load import load_model

    cache: dict[tuple[str, str], object] = {}

    def get(head: str = "base", attn: str = "sdpa"):
        if (head, attn) not in cache:
            cache[(head, attn)] = load_model("bert-tiny", head=head, attn=attn)
        return cache[(head, attn)]

    return get


@pytest.fixture(scope="session")
def minilm():
    from introspect.models.load import load_model

    return load_model("minilm", head="base")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` need a GPU: skipped, with the reason, where torch sees none."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _module_init_as_found():
    """torch.compile patches ``nn.Module.__init__`` and ``__setstate__`` for good on first
    use (dynamo's generation tagging). Where a test compiled in this process, both are put
    back afterwards, with dynamo's flag, so the tests after it on this worker see torch as
    installed (the trace cache refuses a patched class, rightly)."""
    module = torch.nn.Module
    init, setstate = module.__init__, module.__setstate__
    flag = module.__dict__.get("___needs_generation_tag_patch", None)
    yield
    if module.__init__ is not init or module.__setstate__ is not setstate:
        module.__init__, module.__setstate__ = init, setstate  # type: ignore[method-assign]
        if flag is None:
            delattr(module, "___needs_generation_tag_patch")
        else:
            setattr(module, "___needs_generation_tag_patch", flag)
