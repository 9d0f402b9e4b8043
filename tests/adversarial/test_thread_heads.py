"""Heads computed in threads started together (``ports/thread_heads.py``, probe round n):
a verdict with nothing printed beside it. On the CLI's FAIL path the threads also ran
inside introspect's fx trace of the port, where they failed, and Python printed each
failure's traceback (``threading.excepthook``: 22 of them) beside a right verdict; the
recording that stood in for the trace took what the threads handed back for weights
matching none of the reference's (12 hints "weight _tensor_constant0 matches no
weight")."""

from __future__ import annotations

import os
import sys
import threading

from tests import launch
from tests.adversarial.corpus import PORTS, port


def test_the_threaded_heads_pass_with_no_thread_error_left(mini, monkeypatch):
    import introspect

    reference, inputs = mini
    reached_python = []  # what Python would print: a thread's error no one kept
    monkeypatch.setattr(threading, "excepthook", reached_python.append)
    result = introspect.diff(reference.model, port("thread_heads.py").correct(reference),
                             inputs)
    assert result.passed, result.summary()
    assert reached_python == []


def test_threaded_heads_without_the_mask_fail_on_the_cli_with_no_traceback():
    done = launch.run(
        [sys.executable, "-m", "introspect", "diff", "--candidate",
         f"{PORTS / 'thread_heads.py'}:faulty"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"})
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "Exception in thread" not in done.stderr, \
        done.stderr[-2000:]
    assert "first divergence:" in done.stdout and "encoder.layer.0" in done.stdout
    assert "does not apply the attention mask" in done.stdout, done.stdout
    assert "_tensor_constant" not in done.stdout, done.stdout
