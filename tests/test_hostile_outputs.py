"""Output paths through the real CLI: devices survive, report sets never mix, errors are one line.

Device nodes are replicas made with mknod in a temp folder (skipped where not permitted).
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from introspect import files
from introspect.cli.main import main
from tests.refusals import shows

ROOT = Path(__file__).parents[1]
DIFF = ["diff", "--model", "bert-tiny", "-q"]


def _device(tmp_path: Path, name: str, major: int, minor: int) -> Path:
    node = tmp_path / name
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    except OSError as e:
        pytest.skip(f"mknod not permitted here: {e}")
    return node


def _one_line(err: str, command: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"introspect {command}: "), err
    return lines[0]


@pytest.fixture(scope="module")
def old_report(tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    """A report folder from a previous run, plus a file of the user's."""
    folder = tmp_path_factory.mktemp("old") / "report"
    assert main([*DIFF, "--out", str(folder)]) == 0
    (folder / "notes.txt").write_text("mine")
    (folder / "diff.json").write_text('{"old": true}')  # tell the old set from a new one
    return folder, {p.name: p.read_bytes() for p in folder.iterdir()}


def _copy(old_report, tmp_path: Path) -> Path:
    import shutil

    folder = tmp_path / "report"
    shutil.copytree(old_report[0], folder)
    return folder


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def _no_temp(folder: Path) -> None:
    assert not [p.name for p in folder.parent.iterdir() if ".introspect-" in p.name
                or p.name.endswith(".tmp")]


def test_trace_onto_a_dev_null_replica_leaves_it_a_device(tmp_path, capsys):
    null = _device(tmp_path, "null", 1, 3)
    assert main(["trace", "--model", "bert-tiny", "--format", "csv", "-o", str(null)]) == 0
    assert stat.S_ISCHR(os.lstat(null).st_mode) and os.lstat(null).st_rdev == os.makedev(1, 3)


@pytest.mark.parametrize("path, message", [
    ("/proc/introspect.csv", "cannot write '/proc/introspect.csv'"),
    ("{tmp}/" + "x" * 300 + ".csv", "File name too long"),
])
def test_unwritable_outputs_are_one_line_before_loading(tmp_path, capsys, monkeypatch, path,
                                                        message):
    import introspect.models.load

    monkeypatch.setattr(introspect.models.load, "load_model", lambda *a, **k: pytest.fail("loaded"))
    code = main(["trace", "--model", "bert-tiny", "-o", path.format(tmp=tmp_path)])
    assert code == 2 and message in _one_line(capsys.readouterr().err, "trace")


def test_a_report_name_taken_by_a_folder_is_refused_before_loading(old_report, tmp_path,
                                                                   capsys, monkeypatch):
    import introspect.models.load

    folder = _copy(old_report, tmp_path)
    (folder / "diff.svg").unlink()
    (folder / "diff.svg").mkdir()
    monkeypatch.setattr(introspect.models.load, "load_model", lambda *a, **k: pytest.fail("loaded"))
    assert main([*DIFF, "--out", str(folder)]) == 2
    assert "diff.svg' is a folder" in _one_line(capsys.readouterr().err, "diff")
    assert (folder / "diff.json").read_text() == '{"old": true}'


def test_interrupts_at_every_file_leave_the_old_or_the_new_set(old_report, tmp_path, capsys,
                                                               monkeypatch):
    count = len([n for n in old_report[1] if n != "notes.txt"])
    write_new = files._write_new
    for fail_at in range(count):
        for how in ("KeyboardInterrupt", "SIGINT", "ENOSPC"):
            folder = _copy(old_report, tmp_path / f"{how}{fail_at}")
            calls: list[Path] = []

            def interrupted(path, payload, old, fail_at=fail_at, how=how, calls=calls):
                calls.append(path)
                if len(calls) == fail_at + 1:
                    if how == "KeyboardInterrupt":
                        raise KeyboardInterrupt
                    if how == "ENOSPC":
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
                    signal.raise_signal(signal.SIGINT)  # held until the set is in
                write_new(path, payload, old)

            monkeypatch.setattr(files, "_write_new", interrupted)
            code = main([*DIFF, "--out", str(folder)])
            err = _one_line(capsys.readouterr().err, "diff")
            now = _snapshot(folder)
            if how == "SIGINT":  # the new set went in, then the interrupt
                assert code == 130 and f"only {folder}/ ({count} files) was written" in err
                assert now["diff.json"] != old_report[1]["diff.json"]
                assert set(now) == set(old_report[1])
            else:
                assert code == (130 if how == "KeyboardInterrupt" else 2)
                assert ("no file was written" if code == 130 else
                        "No space left on device (ENOSPC)") in err
                assert now == old_report[1]
            assert now["notes.txt"] == b"mine"
            _no_temp(folder)


SIGTERM_SCRIPT = """
import os, signal, sys
from introspect import files
from introspect.cli.main import main
fail_at, write_new, calls = int(sys.argv[1]), files._write_new, []
def terminated(path, payload, old):
    calls.append(path)
    if len(calls) == fail_at + 1:
        os.kill(os.getpid(), signal.SIGTERM)
    write_new(path, payload, old)
files._write_new = terminated
sys.exit(main(sys.argv[2:]))
"""


def test_sigterm_at_every_file_of_the_real_cli_leaves_a_complete_set(old_report, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for fail_at in (0, 3, 6):  # the first, a middle and the last file of the set
        folder = _copy(old_report, tmp_path / str(fail_at))
        run = subprocess.run([sys.executable, "-c", SIGTERM_SCRIPT, str(fail_at), *DIFF,
                              "--out", str(folder)], env=env, capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == -signal.SIGTERM, run.stderr
        now = _snapshot(folder)
        assert set(now) == set(old_report[1]) and now["notes.txt"] == b"mine"
        assert now["diff.json"] != old_report[1]["diff.json"]  # the complete new set
        _no_temp(folder)


def test_stdout_to_a_dev_full_replica_is_one_line_and_exit_2(tmp_path):
    full = _device(tmp_path, "full", 1, 7)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(full, "wb") as stdout:
        run = subprocess.run([sys.executable, "-m", "introspect", "trace", "--model",
                              "bert-tiny", "--format", "csv", "-q"], stdout=stdout,
                             stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    assert run.returncode == 2, run.stderr
    line = _one_line(run.stderr, "trace")
    assert "cannot write to standard output: No space left on device (ENOSPC)" in line


def test_a_later_output_that_fails_says_what_was_written(tmp_path, capsys, monkeypatch):
    replace = files._replace_atomically

    def full_for_json(target, payload, old, label):
        if target.name == "d.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))
        replace(target, payload, old, label)

    monkeypatch.setattr(files, "_replace_atomically", full_for_json)
    folder, json_path = tmp_path / "report", tmp_path / "d.json"
    assert main([*DIFF, "--out", str(folder), "--json", str(json_path)]) == 2
    line = _one_line(capsys.readouterr().err, "diff")
    assert line.startswith("introspect diff: error: cannot write '") and len(line) < 200
    assert shows(str(json_path), line) and "': No space left on device (ENOSPC)" in line
    assert shows(f"{folder}/", line) and "/ (8 files) was written)" in line
    assert (folder / "diff.json").exists() and not json_path.exists()


def test_a_rerun_without_a_drawing_leaves_no_old_drawing(old_report, tmp_path, capsys,
                                                         monkeypatch):
    import introspect.report

    folder = _copy(old_report, tmp_path)
    assert (folder / "diff.svg").exists()
    monkeypatch.setattr(introspect.report, "overlay_svg", lambda result: None)  # no Graphviz
    assert main([*DIFF, "--out", str(folder)]) == 0
    now = _snapshot(folder)
    assert "diff.svg" not in now and now["notes.txt"] == b"mine"
    assert now["diff.json"] != old_report[1]["diff.json"]


def test_a_really_full_disk_exits_2_with_the_old_set_intact(old_report, tmp_path, capsys):
    """A tmpfs with room for the old set and half another: the new set cannot fit."""
    import math
    import shutil

    pages = sum(math.ceil(len(data) / 4096) for data in old_report[1].values())
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    size = f"size={(pages * 3 // 2 + 2) * 4}k"
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", size, "tmpfs", str(mount_point)],
                       check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"cannot mount a tmpfs here: {e}")
    try:
        folder = mount_point / "report"
        shutil.copytree(old_report[0], folder)
        assert main([*DIFF, "--out", str(folder)]) == 2
        line = _one_line(capsys.readouterr().err, "diff")
        assert "No space left on device (ENOSPC)" in line
        assert "the previous reports in it are unchanged" in line
        assert _snapshot(folder) == old_report[1]
        _no_temp(folder)
    finally:
        subprocess.run(["umount", str(mount_point)], capture_output=True, timeout=30)
