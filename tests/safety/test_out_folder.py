"""`--out` never harms a user's folder (issue 34, R5): every step of writing the report set
made to fail half way, a mount point, an immutable file, the working folder.

The folder holds the user's files, links and subfolders (first and last in name order,
so that a failure half way through carrying them over leaves some moved and some not),
and a previous report set. After any failure the user's entries are all there with their
content and the previous set is unchanged; after a success the new set is there; no temp
folder is ever left beside it.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from introspect import files
from introspect.errors import InputError

OLD_SET = {"diff.json": "old json", "diff.md": "old md"}
NEW_SET = {"diff.json": "new json", "diff.md": "new md"}
USER = {"a_first/important.txt": "keep me", "m_mid/deep/x.txt": "x", "notes.txt": "notes",
        "z_last/y.txt": "y", "zz.txt": "zz"}


def user_folder(tmp_path: Path) -> Path:
    rep = tmp_path / "rep"
    for name, text in {**USER, **OLD_SET}.items():
        (rep / name).parent.mkdir(parents=True, exist_ok=True)
        (rep / name).write_text(text)
    (rep / "link").symlink_to("notes.txt")
    return rep


def assert_intact(rep: Path, reports: dict[str, str]) -> None:
    for name, text in {**USER, **reports}.items():
        assert (rep / name).read_text() == text, name
    assert os.readlink(rep / "link") == "notes.txt"
    assert [p.name for p in rep.parent.iterdir() if p.name.startswith(".rep")] == []


def fail_on(monkeypatch, owner, name: str, call: int, error: int = errno.EACCES):
    """``owner.name`` raises OSError(error) on its ``call``-th call (counting from 1)."""
    real = getattr(owner, name)
    calls = []

    def failing(*args, **kwargs):
        calls.append(args)
        if len(calls) == call:
            raise OSError(error, os.strerror(error), str(args[0]) if args else None)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, failing)
    return calls


# Steps that, failing, leave the swap impossible: the set is written in place instead.
FALLS_BACK = {
    "moving the second subfolder": (os, "rename", 2),
    "linking the second file": (os, "link", 2),
    "making the link": (os, "symlink", 1),
    "swapping the folders": (files, "_exchange", 1),
}


@pytest.mark.parametrize("step", FALLS_BACK, ids=list(FALLS_BACK))
def test_a_step_of_the_swap_failing_half_way_writes_in_place(step, tmp_path, monkeypatch):
    rep = user_folder(tmp_path)
    owner, name, call = FALLS_BACK[step]
    calls = fail_on(monkeypatch, owner, name, call)
    files.write_folder(rep, NEW_SET)
    assert len(calls) >= call  # the failure did happen
    assert_intact(rep, NEW_SET)


# Steps whose failure fails the write: the previous set and the user's files unchanged.
FAILS = {
    "writing the second report": (files, "_write_new", 2, errno.ENOSPC),
    "moving a subfolder, then writing in place": (os, "rename", 2, errno.EACCES),
    "renaming a report in place": (os, "replace", 1, errno.EIO),
}


@pytest.mark.parametrize("step", FAILS, ids=list(FAILS))
def test_a_failed_write_puts_back_everything_it_moved(step, tmp_path, monkeypatch):
    rep = user_folder(tmp_path)
    owner, name, call, error = FAILS[step]
    if step.startswith("moving"):  # the swap fails, then the fallback's first file too
        fail_on(monkeypatch, files, "_new_file", 3, errno.ENOSPC)
    if step.startswith("renaming"):  # no swap at all: the fallback's rename fails
        fail_on(monkeypatch, files, "_exchange", 1, errno.EBUSY)
    fail_on(monkeypatch, owner, name, call, error)
    with pytest.raises(InputError, match="the previous reports in it are unchanged"):
        files.write_folder(rep, NEW_SET)
    monkeypatch.undo()
    assert_intact(rep, OLD_SET)


def test_a_late_entry_that_cannot_go_back_is_kept_not_deleted(tmp_path, monkeypatch):
    """An entry another program adds while the set is built: after the swap it is in the
    previous folder; if it cannot be moved back, that folder stays, and the next write puts
    it back."""
    rep = user_folder(tmp_path)
    real_exchange = files._exchange

    def exchange_after_a_late_write(new, current):
        (current / "late.txt").write_text("late")
        real_exchange(new, current)

    monkeypatch.setattr(files, "_exchange", exchange_after_a_late_write)
    real_rename = os.rename

    def rename(source, destination):  # moving it back fails, after the swap and after
        if Path(source).name == "late.txt":
            raise OSError(errno.EACCES, "Permission denied", str(source))
        real_rename(source, destination)

    monkeypatch.setattr(os, "rename", rename)
    files.write_folder(rep, NEW_SET)
    monkeypatch.undo()
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".rep")]
    assert [(p / "late.txt").read_text() for p in left] == ["late"]
    files.write_folder(rep, NEW_SET)  # the next write recovers it
    assert (rep / "late.txt").read_text() == "late"
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".rep")] == []


def test_an_immutable_user_file_is_kept_and_leaves_no_temp_folder(tmp_path):
    rep = user_folder(tmp_path)
    frozen = rep / "frozen.txt"
    frozen.write_text("frozen")
    if subprocess.run(["chattr", "+i", str(frozen)], capture_output=True).returncode:
        pytest.skip("chattr +i is not permitted here")
    try:
        files.write_folder(rep, NEW_SET)
        assert_intact(rep, NEW_SET)
        assert frozen.read_text() == "frozen"
        files.write_folder(rep, OLD_SET)  # and every later run works too
        assert_intact(rep, OLD_SET)
    finally:
        subprocess.run(["chattr", "-i", str(frozen)], capture_output=True)


@pytest.fixture
def mounted(tmp_path):
    """``rep`` and ``rep/data`` as tmpfs mount points, where mounting is permitted."""
    rep = tmp_path / "rep"
    rep.mkdir()
    points = []
    try:
        for point in (rep, rep / "data"):
            point.mkdir(exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(point)],
                           check=True, capture_output=True, timeout=30)
            points.append(point)
    except (OSError, subprocess.SubprocessError) as e:
        for point in reversed(points):
            subprocess.run(["umount", str(point)], capture_output=True, timeout=30)
        pytest.skip(f"cannot mount a tmpfs here: {e}")
    try:
        yield rep
    finally:
        for point in reversed(points):
            subprocess.run(["umount", str(point)], capture_output=True, timeout=30)


def test_a_mount_point_and_one_inside_it_work(mounted):
    (mounted / "data" / "volume.txt").write_text("volume")
    (mounted / "mine.txt").write_text("mine")
    files.write_folder(mounted, OLD_SET)
    files.write_folder(mounted, NEW_SET)
    assert {n: (mounted / n).read_text() for n in NEW_SET} == NEW_SET
    assert (mounted / "data" / "volume.txt").read_text() == "volume"
    assert (mounted / "mine.txt").read_text() == "mine"
    assert os.path.ismount(mounted / "data")


def test_a_mount_point_inside_the_folder_is_not_moved(tmp_path):
    rep = user_folder(tmp_path)
    data = rep / "data"
    data.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(data)],
                      capture_output=True, timeout=30).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (data / "volume.txt").write_text("volume")
        files.write_folder(rep, NEW_SET)
        assert_intact(rep, NEW_SET)
        assert os.path.ismount(data) and (data / "volume.txt").read_text() == "volume"
    finally:
        subprocess.run(["umount", str(data)], capture_output=True, timeout=30)


def test_a_report_file_inside_out_under_another_set_name_is_refused(tmp_path, capsys):
    from introspect.cli.main import main

    rep = tmp_path / "rep"
    code = main(["diff", "--model", "bert-tiny", "-q", "--out", str(rep), "--json",
                 str(rep / "nodes.csv")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "inside --out" in err and not rep.exists()
