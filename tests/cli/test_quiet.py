"""-q prints the verdict only: transformers' logging and warnings are quiet too.

Before, ``-q`` still printed transformers' long-input advice ("Token indices sequence
length is longer than the specified maximum ...") and whatever a port's transformers
calls logged.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests import launch

ROOT = Path(__file__).resolve().parents[2]

NOISY_PORT = '''
import copy
import warnings

from transformers.utils import logging


def build(reference):
    logging.get_logger("transformers.modeling_utils").warning("NOISE from transformers' logging")
    warnings.warn_explicit("NOISE from transformers' warnings", FutureWarning, "modeling.py", 1,
                           module="transformers.modeling_utils")
    return copy.deepcopy(reference.model)
'''


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    path = tmp_path_factory.mktemp("ports") / "noisy.py"
    path.write_text(NOISY_PORT)
    return f"{path}:build"


def run(*argv: str) -> tuple[int, str, str]:
    """In a process of its own: transformers' handler holds the stderr of its first use."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = launch.run([sys.executable, "-m", "introspect", "diff", "--model", "bert-tiny",
                       *argv], env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout, done.stderr


def test_quiet_silences_transformers(port):
    code, out, err = run("--candidate", port, "-q")
    assert code == 0, err
    assert "NOISE" not in err + out
    assert len(out.strip().splitlines()) == 1, out


def test_without_quiet_transformers_still_speaks(port):
    code, out, err = run("--candidate", port)
    assert code == 0, err
    assert "NOISE from transformers' logging" in err


def test_quiet_puts_transformers_settings_back(capsys, tmp_path):
    from transformers.utils import logging

    from introspect.cli.main import main

    before = logging.get_verbosity()
    main(["diff", "--model", "bert-tiny", "--candidate", "hf", "-q", "--device", "mps"])
    assert logging.get_verbosity() == before


def test_quiet_hides_the_long_input_advice():
    long = "word " * 700
    code, out, err = run("--candidate", "hf", "-q", "--text-pair", long, long)
    assert code == 0, err
    assert err == "" and "Token indices" not in out
    assert len(out.strip().splitlines()) == 1, out
