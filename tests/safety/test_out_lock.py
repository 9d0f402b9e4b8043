"""One writer per report folder: two real processes made to overlap by the writer's test seam.

``INTROSPECT_TEST_PAUSE=STAGE:FOLDER`` makes a writer stop at a stage (``swap``: the set is
built and the folder listed, the swap not yet done) until the test creates
``FOLDER/STAGE.go``; ``lock-busy`` marks that a second writer found the lock taken. No test
here sleeps to make two runs overlap: each waits for the marker the other process writes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from introspect import files
from tests.refusals import shows

ROOT = Path(__file__).parents[2]
OLD_SET = {"diff.json": "old json", "diff.md": "old md"}

WRITER = textwrap.dedent("""
    import sys
    from introspect import files
    from introspect.errors import InputError
    folder, tag = sys.argv[1], sys.argv[2]
    try:
        files.write_folder(folder, {"diff.json": tag + " json", "diff.md": tag + " md"})
    except InputError as e:
        sys.stderr.write(f"error: {e}\\n")
        raise SystemExit(2)
""")


def _writer(folder: Path, tag: str, control: Path, stages: str,
            **env: str) -> subprocess.Popen[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    if stages:
        environment["INTROSPECT_TEST_PAUSE"] = f"{stages}:{control}"
    return subprocess.Popen([sys.executable, "-c", WRITER, str(folder), tag], env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(control: Path, stage: str, process: subprocess.Popen[str]) -> None:
    """Until ``process`` has reached ``stage`` (its marker file exists)."""
    deadline = time.monotonic() + 60
    while not list(control.glob(f"{stage}.{process.pid}.paused")):
        if process.poll() is not None:
            raise AssertionError(f"the writer ended before {stage}: {process.communicate()}")
        assert time.monotonic() < deadline, f"the writer never reached {stage}"
        time.sleep(0.01)


def _users_folder(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "rep"
    files.write_folder(folder, OLD_SET)
    (folder / "keep").mkdir()
    (folder / "keep" / "plot.png").write_bytes(b"png")
    (folder / "notes.txt").write_text("mine")
    control = tmp_path / "control"
    control.mkdir()
    return folder, control


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".introspect-" in p.name)


def _user_entries_survive(folder: Path) -> None:
    assert (folder / "keep" / "plot.png").read_bytes() == b"png"
    assert (folder / "notes.txt").read_text() == "mine"


def test_a_second_writer_waits_for_the_first_and_nothing_of_the_user_is_lost(tmp_path):
    folder, control = _users_folder(tmp_path)
    first = _writer(folder, "A", control, "swap")
    _wait_for(control, "swap", first)  # A listed the folder and moved keep/ into its set
    (control / "lock-busy.go").touch()  # B only marks that it waits
    second = _writer(folder, "B", control, "lock-busy")
    _wait_for(control, "lock-busy", second)  # B is waiting for A's lock
    (control / "swap.go").touch()
    assert first.wait(60) == 0, first.communicate()
    assert second.wait(60) == 0, second.communicate()
    assert (folder / "diff.json").read_text() == "B json"
    _user_entries_survive(folder)
    assert _leftovers(tmp_path) == []


def test_a_second_writer_refuses_in_one_line_after_its_wait(tmp_path):
    folder, control = _users_folder(tmp_path)
    first = _writer(folder, "A", control, "swap")
    _wait_for(control, "swap", first)
    second = _writer(folder, "B", control, "", INTROSPECT_LOCK_WAIT="0.3")
    _, err = second.communicate(timeout=60)
    assert second.returncode == 2
    assert err.count("\n") == 1 and "another introspect run is writing" in err
    assert "nothing was written" in err
    (control / "swap.go").touch()
    assert first.wait(60) == 0, first.communicate()
    assert (folder / "diff.json").read_text() == "A json"
    _user_entries_survive(folder)
    assert _leftovers(tmp_path) == []


def test_entries_another_program_adds_during_the_swap_survive(tmp_path):
    folder, control = _users_folder(tmp_path)
    first = _writer(folder, "A", control, "swap")
    _wait_for(control, "swap", first)  # listed: what follows is after the listing
    (folder / "late.txt").write_text("late")
    (folder / "late-dir").mkdir()
    (folder / "late-dir" / "x").write_text("x")
    replacement = tmp_path / "notes.new"
    replacement.write_text("edited")
    os.replace(replacement, folder / "notes.txt")  # an editor saving the user's notes
    (control / "swap.go").touch()
    assert first.wait(60) == 0, first.communicate()
    assert (folder / "late.txt").read_text() == "late"
    assert (folder / "late-dir" / "x").read_text() == "x"
    assert (folder / "notes.txt").read_text() == "edited"
    assert (folder / "keep" / "plot.png").read_bytes() == b"png"
    assert (folder / "diff.json").read_text() == "A json"
    assert _leftovers(tmp_path) == []


def test_a_kill_9_during_the_swap_is_repaired_by_the_next_run(tmp_path):
    folder, control = _users_folder(tmp_path)
    first = _writer(folder, "A", control, "swap")
    _wait_for(control, "swap", first)
    first.send_signal(signal.SIGKILL)
    first.wait(60)
    left = _leftovers(tmp_path)
    assert len(left) == 2  # the temp folder, holding keep/, and the (free) lock file
    assert not (folder / "keep").exists()  # the user's subfolder sits in the temp folder
    files.write_folder(folder, {"diff.json": "next json", "diff.md": "next md"})
    _user_entries_survive(folder)
    assert (folder / "diff.json").read_text() == "next json"
    assert _leftovers(tmp_path) == []


def test_two_threads_of_one_process_take_turns(tmp_path):
    import threading

    folder, _ = _users_folder(tmp_path)
    errors: list[BaseException] = []

    def write(tag: str) -> None:
        try:
            for _ in range(20):
                files.write_folder(folder, {"diff.json": tag, "diff.md": tag})
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(t,)) for t in "AB"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert (folder / "diff.json").read_text() == (folder / "diff.md").read_text()
    _user_entries_survive(folder)
    assert _leftovers(tmp_path) == []


@pytest.mark.slow
def test_two_introspect_diff_runs_on_one_out_folder(tmp_path):
    folder, control = _users_folder(tmp_path)
    command = [sys.executable, "-m", "introspect", "diff", "--model", "bert-tiny", "--out",
               str(folder)]
    base = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    first = subprocess.Popen(command, env={**base, "INTROSPECT_TEST_PAUSE": f"swap:{control}"},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(control, "swap", first)
    second = subprocess.run(command, env={**base, "INTROSPECT_LOCK_WAIT": "0.5"},
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 2
    errors = [line for line in second.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in second.stderr
    assert errors[0].startswith("introspect diff: error: another introspect run is writing '")
    assert shows(str(folder), errors[0]) and len(errors[0]) < 200
    (control / "swap.go").touch()
    assert first.wait(300) == 0, first.communicate()
    assert {"diff.json", "diff.md", "nodes.csv", "keep", "notes.txt"} <= {
        p.name for p in folder.iterdir()}
    _user_entries_survive(folder)
    assert _leftovers(tmp_path) == []
