"""The tests' launcher (tests/launch.py) stands in for a fresh ``python -m introspect``:
the same output and exit code, a fresh hash and torch seed per run, nothing left behind by
one run for the next, and a timeout that stops the run."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests import launch

PORT = '''
import os
import torch
left = getattr(torch, "LEFT", "-")
with open(os.path.join({folder!r}, "seen.txt"), "a") as seen:
    seen.write(f"{{hash('introspect')}} {{torch.initial_seed()}} {{left}}\\n")
torch.LEFT = "left behind"  # a process-wide change: it must die with the run


def build(reference):
    if os.environ.get("INTROSPECT_TEST_SLEEP"):
        import time
        time.sleep(120)
    raise ValueError("not a port")
'''


def _port(tmp_path) -> str:
    path = tmp_path / "seen_port.py"
    path.write_text(PORT.format(folder=str(tmp_path)))
    return f"{path}:build"


def _diff(spec: str) -> list[str]:
    return [sys.executable, "-m", "introspect", "diff", "--model", "bert-tiny", "-q",
            "--candidate", spec]


def test_a_forked_run_says_what_a_fresh_process_says(tmp_path):
    spec = _port(tmp_path)
    fresh = subprocess.run(_diff(spec), capture_output=True, text=True, timeout=300)
    forked = launch.run(_diff(spec), capture_output=True, text=True, timeout=300)
    assert (forked.returncode, forked.stdout, forked.stderr) == \
        (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.returncode == 2 and "not a port" in forked.stderr


def test_each_run_draws_its_seeds_afresh_and_inherits_no_change(tmp_path):
    spec = _port(tmp_path)
    for _ in range(3):
        launch.run(_diff(spec), capture_output=True, text=True, timeout=300)
    runs = [line.split() for line in (tmp_path / "seen.txt").read_text().splitlines()]
    assert len(runs) == 3
    assert all(left == "-" for _, _, left in runs)
    assert len({seed for _, seed, _ in runs}) == 3
    assert runs[0][0] != runs[1][0]  # two runs in a row: two hash seeds, as two processes


def test_a_timeout_stops_the_run(tmp_path):
    spec = _port(tmp_path)
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        launch.run(_diff(spec), capture_output=True, text=True, timeout=15,
                   env={**os.environ, "INTROSPECT_TEST_SLEEP": "1"})
    assert time.monotonic() - began < 60
    again = launch.run(_diff(spec), capture_output=True, text=True, timeout=300)
    assert again.returncode == 2  # the launcher goes on after a timeout


@pytest.mark.parametrize("change, stands_in", [
    ({"COLUMNS": "200"}, True),
    ({"INTROSPECT_DEBUG": "1"}, True),
    ({"PYTEST_CURRENT_TEST": "another"}, True),
    ({"PYTHONPATH": "/nowhere"}, True),
    ({"HF_HOME": "/elsewhere"}, False),  # read when transformers is imported
    ({"OMP_NUM_THREADS": "1"}, False),  # read when torch loads OpenMP
    ({"PYTHONHASHSEED": "0"}, False),
])
def test_only_variables_read_at_run_time_may_differ(change, stands_in):
    base = {"PATH": "/usr/bin", "HOME": "/root"}
    assert launch._stands_in({**base, **change}, base) is stands_in


def test_a_python_path_with_a_site_customization_gets_a_fresh_process(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("")
    assert not launch._stands_in({"PYTHONPATH": str(tmp_path)}, {})


def test_a_zygote_whose_imports_fail_is_not_used(tmp_path, monkeypatch):
    # (a module added under introspect/ before the editable install links it: the zygote
    # ended at its imports, and every forked run raised instead of running afresh)
    broken = tmp_path / "transformers"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('broken on purpose')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    zygote = launch._Zygote(1)
    try:
        assert zygote.start() is False
    finally:
        zygote.close()
