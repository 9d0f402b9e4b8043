"""A capture is one set: .safetensors, .index.json and .index.csv together or not at all.

Faults are injected in the writer (a full disk is an ``OSError(ENOSPC)`` raised where a
file is written or renamed; no small tmpfs is needed) and signals are sent to real
processes paused by the writer's test seam (``INTROSPECT_TEST_PAUSE=set:FOLDER``).
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from introspect import files
from introspect.cli.main import main
from introspect.errors import InputError

ROOT = Path(__file__).parents[2]
NAMES = ("ref.safetensors", "ref.index.json", "ref.index.csv")


def _old_set(folder: Path) -> dict[str, bytes]:
    folder.mkdir(exist_ok=True)
    old = {name: f"old {name}".encode() for name in NAMES}
    for name, data in old.items():
        (folder / name).write_bytes(data)
    return old


def _state(folder: Path, names: tuple[str, ...] = NAMES) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in names if (folder / name).exists()}


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()
                  if ".introspect-" in p.name or p.name.endswith(".tmp"))


def _full_disk(path: object = None) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


@pytest.mark.parametrize("fail_at", range(3))
@pytest.mark.parametrize("where", ["write", "rename"])
def test_a_failure_at_any_file_keeps_the_whole_old_set(tmp_path, monkeypatch, fail_at, where):
    old = _old_set(tmp_path)
    calls: list[object] = []
    if where == "write":
        original = files._write_all

        def failing(fd, payload):
            calls.append(fd)
            if len(calls) > fail_at:
                raise _full_disk()
            original(fd, payload)

        monkeypatch.setattr(files, "_write_all", failing)
    else:
        original_replace = os.replace

        def failing_replace(source, target):
            if str(target).endswith(NAMES) and not str(source).endswith(".old.tmp"):
                calls.append(target)
                if len(calls) > fail_at:
                    raise _full_disk(str(target))
            original_replace(source, target)

        monkeypatch.setattr(files.os, "replace", failing_replace)
    new = [(tmp_path / name, f"new {name}") for name in NAMES]
    with pytest.raises(InputError, match=r"No space left on device \(ENOSPC\).*nothing was "
                                         r"written \(any previous files are unchanged\)") as caught:
        files.write_set(new)
    assert "\n" not in str(caught.value)
    assert _state(tmp_path) == old
    assert _leftovers(tmp_path) == []


def test_a_failed_first_set_leaves_no_file(tmp_path, monkeypatch):
    original = files._write_all
    calls: list[int] = []

    def failing(fd, payload):
        calls.append(fd)
        if len(calls) == 3:
            raise _full_disk()
        original(fd, payload)

    monkeypatch.setattr(files, "_write_all", failing)
    with pytest.raises(InputError, match="ENOSPC"):
        files.write_set([(tmp_path / name, "new") for name in NAMES])
    assert list(tmp_path.iterdir()) == []


def test_a_set_member_that_is_not_a_regular_file_is_refused_before_writing(tmp_path):
    old = _old_set(tmp_path)
    os.unlink(tmp_path / "ref.index.csv")
    os.mkfifo(tmp_path / "ref.index.csv")
    with pytest.raises(InputError, match=r"ref.index.csv' is not a regular file"):
        files.write_set([(tmp_path / name, "new") for name in NAMES])
    assert _state(tmp_path, NAMES[:2]) == {k: old[k] for k in NAMES[:2]}


def test_capture_on_a_full_disk_exits_2_in_one_line_and_keeps_the_old_set(
        tmp_path, monkeypatch, capsys):
    old = _old_set(tmp_path)
    original = files._write_all
    calls: list[int] = []

    def failing(fd, payload):
        calls.append(fd)
        if len(calls) == 2:  # the tensors are written, the first index is not
            raise _full_disk()
        original(fd, payload)

    monkeypatch.setattr(files, "_write_all", failing)
    code = main(["capture", "--model", "bert-tiny", "--select", "layers", "-o",
                 str(tmp_path / "ref.safetensors")])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert code == 2
    assert len(errors) == 1 and errors[0].startswith("introspect capture: error: cannot write")
    assert "ref.index.json" in errors[0] and "ENOSPC" in errors[0]
    assert _state(tmp_path) == old
    assert _leftovers(tmp_path) == []


SIGNALLED = """
import os, signal, sys
from introspect import files
folder, at = sys.argv[1], int(sys.argv[2])
original, calls = files._write_all, []
def signalled(fd, payload):
    calls.append(fd)
    if len(calls) == at + 1:
        os.kill(os.getpid(), signal.SIGTERM)
    original(fd, payload)
files._write_all = signalled
files.write_set([(os.path.join(folder, n), "new " + n) for n in {names!r}])
print("finished")
"""


def test_a_sigterm_while_any_file_is_written_gives_the_whole_new_set(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for at in range(3):
        folder = tmp_path / str(at)
        _old_set(folder)
        run = subprocess.run([sys.executable, "-c", SIGNALLED.format(names=NAMES), str(folder),
                              str(at)], env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == -signal.SIGTERM, run.stderr  # delivered once the set is in
        assert "finished" not in run.stdout
        assert _state(folder) == {name: f"new {name}".encode() for name in NAMES}
        assert _leftovers(folder) == []


@pytest.mark.slow
def test_a_sigterm_to_introspect_capture_between_its_files_leaves_one_whole_set(tmp_path):
    old = _old_set(tmp_path)
    control = tmp_path / "control"
    control.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "INTROSPECT_TEST_PAUSE": f"set:{control}"}
    process = subprocess.Popen([sys.executable, "-m", "introspect", "capture", "--model",
                                "bert-tiny", "-o", str(tmp_path / "ref.safetensors")],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list(control.glob("set.*.paused")):  # its files written, none renamed yet
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    (control / "set.go").touch()
    assert process.wait(60) == -signal.SIGTERM
    state = _state(tmp_path)
    assert set(state) == set(NAMES)
    assert all(state[name] != old[name] for name in NAMES)  # all three new, none old
    assert state["ref.index.json"].startswith(b"{")
    assert _leftovers(tmp_path) == []


SET_WRITER = """
import os, sys
from introspect import files
from introspect.errors import InputError
folder, tag = sys.argv[1], sys.argv[2]
try:
    files.write_set([(os.path.join(folder, n), tag + " " + n) for n in {names!r}])
except InputError as e:
    sys.stderr.write(f"error: {{e}}\\n")
    raise SystemExit(2)
"""


def test_a_second_capture_to_the_same_file_waits_then_refuses_in_one_line(tmp_path):
    _old_set(tmp_path)
    control = tmp_path / "control"
    control.mkdir()
    script = SET_WRITER.format(names=NAMES)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen([sys.executable, "-c", script, str(tmp_path), "A"],
                             env={**env, "INTROSPECT_TEST_PAUSE": f"set:{control}"},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(control.glob(f"set.{first.pid}.paused")):  # A holds the lock
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    second = subprocess.run([sys.executable, "-c", script, str(tmp_path), "B"],
                            env={**env, "INTROSPECT_LOCK_WAIT": "0.3"}, capture_output=True,
                            text=True, timeout=60)
    assert second.returncode == 2
    assert second.stderr.count("\n") == 1
    assert "another introspect run is writing" in second.stderr
    (control / "set.go").touch()
    assert first.wait(60) == 0, first.communicate()
    assert _state(tmp_path) == {name: f"A {name}".encode() for name in NAMES}
    assert _leftovers(tmp_path) == []
