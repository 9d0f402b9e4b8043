"""The tenth call costs what the first did: no mode keeps memory from one call to the next.

A notebook runs ``introspect.diff`` in a loop. Each mode (forward, ``backward=True``,
``generate=N``, a capture diffed against a dump, and ``introspect.trace`` of a model
loaded anew) runs five times in a fresh process, and the process's resident memory after
the fifth call may exceed that after the first by ``BOUND_MIB`` at most. Before the fixes,
each backward call kept its recording alive (a cycle through autograd's C++ graph:
~1 GB a call at BERT-base 8x32), and each model traced for real was kept alive by the
trace cache (it held torch.fx's ``Module.__call__`` wrapper, which holds the tracer).

The calls run in a child process (this file, run as a script), so that what the rest of
the suite holds cannot blur the numbers; freed heap is handed back to the system
(``malloc_trim``) before each reading, so the allocator's own caches do not count.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import os
import subprocess
import sys
import time
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CALLS = 5
BOUND_MIB = 50.0  # growth allowed from the first call's end to the last's
BATCH, SEQ = 4, 32
# Modes whose leaks were fixed (each would fail without its fix: backward grew ~28 MiB a
# call here, and every model traced lived on), and modes measured flat, kept as guards.
FIXED = ("backward", "trace")
GUARDED = ("forward", "generate", "dump")
# One worker runs the module: each fixture's child process measures several modes once.
pytestmark = pytest.mark.xdist_group("repeated_calls")


def _can_measure() -> bool:
    """Linux with glibc: /proc/self/statm for the reading, malloc_trim before it."""
    libc = ctypes.util.find_library("c")
    return Path("/proc/self/statm").exists() and libc is not None \
        and hasattr(ctypes.CDLL(libc), "malloc_trim")


def _measure(modes: tuple[str, ...]) -> dict[str, dict[str, object]]:
    """Each mode's resident memory after each call, from one child process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, __file__, *modes], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check(measured: dict[str, dict[str, object]], mode: str) -> None:
    readings = measured[mode]["rss_mib"]
    growth = readings[-1] - readings[0]
    assert growth < BOUND_MIB, (
        f"{mode}: resident memory after each of {CALLS} calls {readings} MiB grows by "
        f"{growth:.0f} MiB after the first (bound {BOUND_MIB:.0f})")
    alive = measured[mode]["models_alive"]
    assert alive == 0, f"{mode}: {alive} model(s) outlived the calls once dropped"


@pytest.fixture(scope="module")
def fixed() -> dict[str, dict[str, object]]:
    return _measure(FIXED)


@pytest.fixture(scope="module")
def guarded() -> dict[str, dict[str, object]]:
    return _measure(GUARDED)


@pytest.mark.skipif(not _can_measure(), reason="reads /proc/self/statm, trims glibc's heap")
@pytest.mark.parametrize("mode", FIXED)
def test_repeated_calls_keep_no_memory(fixed, mode):
    _check(fixed, mode)


@pytest.mark.slow
@pytest.mark.skipif(not _can_measure(), reason="reads /proc/self/statm, trims glibc's heap")
@pytest.mark.parametrize("mode", GUARDED)
def test_repeated_calls_keep_no_memory_in_other_modes(guarded, mode):
    _check(guarded, mode)


# ---------------------------------------------------------------------------------------
# The child process


def _rss_mib() -> float:
    """Resident memory, once freed heap has gone back to the system."""
    gc.collect()
    ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _bert(seed: int = 0):
    """A random BERT, big enough for a leak to show: 2 layers of width 256."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=1024,
                        max_position_embeddings=128)
    return BertModel(config).eval()


def _bert_inputs(batch: int, seq: int) -> dict[str, object]:
    import torch

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 1000, (batch, seq), generator=generator)
    mask = torch.ones_like(ids)
    mask[1:, seq - 3:] = 0  # padded rows, as a batch of texts has
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask}


def _calls(mode: str, made: list[weakref.ref]) -> Callable[[int], object]:
    """One call of ``mode`` (its models built once, as a notebook holds them; ``trace``
    loads a new model each time, as a notebook cell run again does). Each model made is
    noted in ``made``: none may outlive the calls once they are dropped."""
    import torch

    import introspect
    import introspect.scratch as scratch

    if mode in ("forward", "backward"):
        reference = _bert()
        candidate = scratch.BertModel.from_hf(reference)
        made += [weakref.ref(reference), weakref.ref(candidate)]
        inputs = _bert_inputs(BATCH, SEQ)
        return lambda i: introspect.diff(reference, candidate, inputs,
                                         backward=mode == "backward")
    if mode == "generate":
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=1000,
                                n_positions=128, bos_token_id=0, eos_token_id=0)
        model = GPT2LMHeadModel(config).eval()
        made.append(weakref.ref(model))
        prompt = {"input_ids": torch.randint(1, 1000, (4, 16))}
        return lambda i: introspect.diff(model, model, prompt, generate=3)
    if mode == "dump":
        from introspect.dump import capture, diff_dump
        from introspect.dump.formats import Dump

        reference = _bert()
        made.append(weakref.ref(reference))
        inputs = _bert_inputs(BATCH, SEQ)

        def dump_diff(i: int) -> object:
            taken = capture(reference, inputs)
            values = {f"t{n}": taken.values[e.name] for n, e in enumerate(taken.entries)}
            dtypes = {name: "float32" for name in values}
            return diff_dump(taken, Dump("port", values, dtypes, True, dict(taken.inputs)))

        return dump_diff

    def trace(i: int) -> object:
        model = _bert(seed=i)
        made.append(weakref.ref(model))
        return introspect.trace(model, _bert_inputs(BATCH, SEQ + i))  # new shapes: traced for real

    return trace


def main(modes: list[str]) -> None:
    measured: dict[str, dict[str, object]] = {}
    for mode in modes:
        made: list[weakref.ref] = []
        call = _calls(mode, made)
        readings = []
        started = time.process_time()
        for i in range(CALLS):
            result = call(i)
            if not getattr(result, "passed", True):
                raise SystemExit(f"{mode}: call {i + 1} did not pass:\n{result.summary()}")
            del result
            readings.append(round(_rss_mib(), 1))
        del call
        gc.collect()
        measured[mode] = {"rss_mib": readings,
                          "models_alive": sum(ref() is not None for ref in made)}
        print(f"{mode}: {readings} MiB, {time.process_time() - started:.1f} s of CPU",
              file=sys.stderr, flush=True)
    print(json.dumps(measured))


if __name__ == "__main__":
    main(sys.argv[1:])
