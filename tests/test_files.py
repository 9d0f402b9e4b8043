"""Writing files: atomic for regular files, in place for devices and pipes, sets all or nothing.

Device nodes are replicas made with mknod inside a temp folder (skipped where not
permitted); the real /dev is never written.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from introspect import files
from introspect.errors import InputError

OLD_SET = {"diff.json": "old json", "diff.md": "old md", "nodes.csv": "old nodes"}
NEW_SET = {"diff.json": "new json", "diff.md": "new md", "nodes.csv": "new nodes",
           "junit.xml": "new junit"}


def _device(tmp_path: Path, name: str, major: int, minor: int) -> Path:
    node = tmp_path / name
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    except (PermissionError, OSError) as e:
        pytest.skip(f"mknod not permitted here: {e}")
    return node


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".introspect-" in p.name
                  or p.name.endswith(".tmp"))


@pytest.fixture
def umask_027():
    previous = os.umask(0o027)
    yield
    os.umask(previous)


# ----------------------------------------------------------------------------------------
# One file


def test_a_new_file_follows_the_umask_and_leaves_no_temp(tmp_path, umask_027):
    target = files.write_file(tmp_path / "a.json", "{}")
    assert target.read_text() == "{}"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert _leftovers(tmp_path) == []


def test_an_existing_file_keeps_its_mode(tmp_path):
    target = tmp_path / "secret.json"
    target.write_text("old")
    target.chmod(0o600)
    files.write_file(target, b"new")
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_a_replica_of_dev_null_survives(tmp_path):
    null = _device(tmp_path, "null", 1, 3)
    files.check_writable(null)
    files.write_file(null, "discarded")
    info = os.lstat(null)
    assert stat.S_ISCHR(info.st_mode) and info.st_rdev == os.makedev(1, 3)
    assert _leftovers(tmp_path) == []


def test_a_link_to_a_device_writes_through_and_stays_a_link(tmp_path):
    null = _device(tmp_path, "null", 1, 3)
    link = tmp_path / "out.svg"
    link.symlink_to(null)
    files.write_file(link, "<svg/>")
    assert link.is_symlink() and stat.S_ISCHR(os.stat(link).st_mode)


def test_a_replica_of_dev_full_is_one_line_and_survives(tmp_path):
    full = _device(tmp_path, "full", 1, 7)
    with pytest.raises(InputError, match=r"cannot write .*full': No space left on device "
                                         r"\(ENOSPC\); free some space") as caught:
        files.write_file(full, "x")
    assert "\n" not in str(caught.value)
    assert stat.S_ISCHR(os.lstat(full).st_mode)


def test_a_fifo_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    files.write_file(fifo, "through the pipe")
    reader.join(timeout=10)
    assert received == [b"through the pipe"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_descriptor_path_writes_to_that_descriptor(tmp_path):
    read_end, write_end = os.pipe()
    try:
        files.write_file(f"/dev/fd/{write_end}", "via fd")
        assert os.read(read_end, 100) == b"via fd"
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_link_to_a_regular_file_updates_the_target_atomically(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    real.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to("real.json")
    files.write_file(link, "new")
    assert link.is_symlink() and os.readlink(link) == "real.json"
    assert real.read_text() == "new" and stat.S_IMODE(real.stat().st_mode) == 0o640


def test_a_dangling_link_creates_its_target(tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to("made.json")
    files.write_file(link, "made")
    assert link.is_symlink() and (tmp_path / "made.json").read_text() == "made"


def test_a_folder_is_refused(tmp_path):
    with pytest.raises(InputError, match="is a folder; give a file name"):
        files.write_file(tmp_path, "x")


def test_a_block_device_is_refused(tmp_path):
    block = tmp_path / "disk"
    try:
        os.mknod(block, 0o600 | stat.S_IFBLK, os.makedev(7, 200))
    except OSError as e:
        pytest.skip(f"mknod not permitted here: {e}")
    with pytest.raises(InputError, match="is a block device"):
        files.check_writable(block)
    with pytest.raises(InputError, match="is a block device"):
        files.write_file(block, "x")


def test_a_full_disk_is_one_line_and_the_old_file_stays(tmp_path, monkeypatch):
    target = tmp_path / "d.json"
    target.write_text("old")

    def full(fd, payload):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files, "_write_all", full)
    with pytest.raises(InputError, match=r"d.json': No space left on device \(ENOSPC\); free "
                                         r"some space .*; any previous file is unchanged"):
        files.write_file(target, "new")
    assert target.read_text() == "old"
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("path, message", [
    ("{tmp}/" + "n" * 300 + ".json", "File name too long"),
    ("/proc/introspect-test.json", "cannot write '/proc/introspect-test.json'"),
    ("/proc/version", "cannot write '/proc/version'"),
    ("{tmp}/no/such/d.json", "does not exist"),
])
def test_unwritable_paths_are_one_line_before_and_at_writing(tmp_path, path, message):
    path = path.format(tmp=tmp_path)
    for attempt in (files.check_writable, lambda p: files.write_file(p, "x")):
        with pytest.raises(InputError, match=message) as caught:
            attempt(path)
        assert "\n" not in str(caught.value)


def test_two_outputs_on_one_path_are_refused_up_front(tmp_path):
    (tmp_path / "real.xml").write_text("")
    (tmp_path / "link.xml").symlink_to("real.xml")
    with pytest.raises(InputError, match="--json and --junit both write to"):
        files.check_outputs({"--json": tmp_path / "a.json", "--junit": tmp_path / "a.json"})
    with pytest.raises(InputError, match="--json and --junit both write to"):
        files.check_outputs({"--json": tmp_path / "real.xml", "--junit": tmp_path / "link.xml"})
    with pytest.raises(InputError, match="--json and --junit both write to '-'"):
        files.check_outputs({"--json": "-", "--junit": "-"})
    files.check_outputs({"--json": tmp_path / "a.json", "--junit": "-", "-o": None},
                        {"--out": tmp_path / "report"})


# ----------------------------------------------------------------------------------------
# A set of files in a folder


def _old_folder(tmp_path: Path) -> Path:
    tmp_path.mkdir(exist_ok=True)
    folder = tmp_path / "report"
    files.write_folder(folder, OLD_SET)
    (folder / "notes.txt").write_text("mine")
    (folder / "attachments").mkdir()
    (folder / "attachments" / "a.png").write_bytes(b"png")
    return folder


def _contents(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in folder.iterdir() if p.is_file()}


def test_a_new_set_replaces_the_old_one_and_keeps_other_files(tmp_path, umask_027):
    folder = _old_folder(tmp_path)
    folder.chmod(0o750)
    notes_inode = (folder / "notes.txt").stat().st_ino
    paths = files.write_folder(folder, NEW_SET)
    assert paths == [folder / name for name in NEW_SET]
    assert _contents(folder) == {**NEW_SET, "notes.txt": "mine"}
    assert (folder / "notes.txt").stat().st_ino == notes_inode  # the same file, not a copy
    assert (folder / "attachments" / "a.png").read_bytes() == b"png"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o750
    assert stat.S_IMODE((folder / "junit.xml").stat().st_mode) == 0o640
    assert _leftovers(tmp_path) == []


def test_a_link_to_a_folder_is_swapped_where_it_points(tmp_path):
    real = _old_folder(tmp_path)
    link = tmp_path / "latest"
    link.symlink_to("report")
    files.write_folder(link, NEW_SET)
    assert link.is_symlink() and _contents(real) == {**NEW_SET, "notes.txt": "mine"}


def test_without_rename_exchange_the_two_renames_give_the_same_result(tmp_path, monkeypatch):
    folder = _old_folder(tmp_path)
    monkeypatch.setattr(files.sys, "platform", "other")
    files.write_folder(folder, NEW_SET)
    assert _contents(folder) == {**NEW_SET, "notes.txt": "mine"}
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("fail_at", range(len(NEW_SET)))
@pytest.mark.parametrize("failure", [KeyboardInterrupt, "ENOSPC"])
def test_a_failure_at_any_file_leaves_the_complete_old_set(tmp_path, monkeypatch, fail_at,
                                                          failure):
    folder = _old_folder(tmp_path)
    calls = []
    write_new = files._write_new

    def failing(path, payload, old):
        calls.append(path)
        if len(calls) > fail_at:
            if failure == "ENOSPC":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            raise KeyboardInterrupt
        write_new(path, payload, old)

    monkeypatch.setattr(files, "_write_new", failing)
    expected = KeyboardInterrupt if failure is KeyboardInterrupt else InputError
    with pytest.raises(expected) as caught:
        files.write_folder(folder, NEW_SET)
    if expected is InputError:
        assert "previous reports in it are unchanged" in str(caught.value)
    assert _contents(folder) == {**OLD_SET, "notes.txt": "mine"}
    assert (folder / "attachments" / "a.png").read_bytes() == b"png"
    assert _leftovers(tmp_path) == []


def test_a_failed_first_set_leaves_no_folder(tmp_path, monkeypatch):
    def full(path, payload, old):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(files, "_write_new", full)
    with pytest.raises(InputError, match="no report was written"):
        files.write_folder(tmp_path / "report", NEW_SET)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("make", [os.mkdir, os.mkfifo,
                                  lambda p: os.symlink("/etc/hostname", p)])
def test_a_report_name_taken_by_something_else_is_refused_before_writing(tmp_path, make):
    folder = _old_folder(tmp_path)
    make(folder / "junit.xml")
    kind = stat.S_IFMT(os.lstat(folder / "junit.xml").st_mode)
    with pytest.raises(InputError, match=r"junit.xml' is .*; the report set replaces"):
        files.write_folder(folder, NEW_SET)
    assert stat.S_IFMT(os.lstat(folder / "junit.xml").st_mode) == kind
    assert {k: v for k, v in _contents(folder).items() if k != "junit.xml"} == {
        **OLD_SET, "notes.txt": "mine"}


SIGNAL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from introspect import files
    folder, fail_at, signum = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    write_new, calls = files._write_new, []
    def signalled(path, payload, old):
        calls.append(path)
        if len(calls) == fail_at + 1:
            os.kill(os.getpid(), signum)
        write_new(path, payload, old)
    files._write_new = signalled
    files.write_folder(folder, {new!r})
    print("finished")
""")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_at_any_file_leaves_a_complete_set_and_no_temp(tmp_path, signum):
    script = SIGNAL_SCRIPT.format(new=NEW_SET)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    for fail_at in range(len(NEW_SET)):
        folder = _old_folder(tmp_path / str(fail_at))
        run = subprocess.run([sys.executable, "-c", script, str(folder), str(fail_at),
                              str(int(signum))], env=env, capture_output=True, text=True,
                             timeout=60)
        # held until the set is in, then delivered: killed by the signal as before
        assert run.returncode in (-signal.SIGTERM, -signal.SIGINT, 1), run.stderr
        assert "finished" not in run.stdout
        assert _contents(folder) == {**NEW_SET, "notes.txt": "mine"}
        assert _leftovers(folder.parent) == []


def test_the_handlers_are_restored_after_a_write(tmp_path):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    files.write_folder(tmp_path / "r", NEW_SET)
    files.write_file(tmp_path / "f", "x")
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_writes_from_another_thread_work(tmp_path):
    errors: list[BaseException] = []

    def write() -> None:
        try:
            files.write_folder(tmp_path / "r", NEW_SET)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    thread = threading.Thread(target=write)
    thread.start()
    thread.join(timeout=30)
    assert errors == [] and _contents(tmp_path / "r") == NEW_SET


def test_the_journal_says_what_was_written(tmp_path):
    mark = files.written_count()
    assert files.describe_written(mark) == "no file was written"
    files.write_file(tmp_path / "a.json", "x")
    files.write_folder(tmp_path / "r", {"b.md": "y"})
    assert files.describe_written(mark) == (
        f"only {tmp_path / 'a.json'}, {tmp_path / 'r'}/ (1 file) were written"
    )


def test_an_owned_name_this_set_lacks_does_not_linger(tmp_path):
    folder = _old_folder(tmp_path)
    files.write_folder(folder, {"diff.json": "new json"}, owned=list(OLD_SET))
    assert _contents(folder) == {"diff.json": "new json", "notes.txt": "mine"}


def test_a_report_name_taken_by_a_folder_is_found_before_the_work(tmp_path):
    folder = _old_folder(tmp_path)
    (folder / "diff.svg").mkdir()
    with pytest.raises(InputError, match=r"diff.svg' is a folder; the report set replaces"):
        files.check_writable_folder(folder, ["diff.json", "diff.svg"])


def test_two_outputs_may_share_a_character_device(tmp_path):
    null = _device(tmp_path, "null", 1, 3)
    files.check_outputs({"--json": null, "--junit": null})


def test_a_link_to_a_descriptor_path_writes_to_the_descriptor(tmp_path):
    read_end, write_end = os.pipe()
    link = tmp_path / "out"
    link.symlink_to(f"/dev/fd/{write_end}")
    try:
        files.check_writable(link)
        files.write_file(link, "via link")
        assert os.read(read_end, 100) == b"via link"
    finally:
        os.close(read_end)
        os.close(write_end)
    assert link.is_symlink()


def test_the_current_folder_and_one_holding_it_are_written_in_place(tmp_path, monkeypatch):
    """`--out .` (a CI workspace is often the working folder, or a mount point): the set is
    written into the folder itself, which is never swapped; the user's entries stay."""
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "mine.txt").write_text("mine")
    monkeypatch.chdir(work / "sub")
    for folder in (".", str(work)):
        files.write_folder(folder, NEW_SET)
    assert _contents(work / "sub") == NEW_SET
    assert {k: v for k, v in _contents(work).items() if k in NEW_SET} == NEW_SET
    assert (work / "mine.txt").read_text() == "mine" and Path.cwd() == work / "sub"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]  # no temp left beside it


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 256 KiB tmpfs: a real full disk, where mounting is permitted (root, a container)."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
                       check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"cannot mount a tmpfs here: {e}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], capture_output=True, timeout=30)


def test_a_really_full_disk_keeps_the_old_file_and_the_old_set(small_tmpfs):
    target = small_tmpfs / "d.json"
    target.write_text("old")
    big = "x" * 400_000
    with pytest.raises(InputError, match=r"No space left on device \(ENOSPC\)"):
        files.write_file(target, big)
    assert target.read_text() == "old"
    folder = small_tmpfs / "report"
    files.write_folder(folder, OLD_SET)
    with pytest.raises(InputError, match=r"ENOSPC.*previous reports in it are unchanged"):
        files.write_folder(folder, {**NEW_SET, "diff.svg": big})
    assert _contents(folder) == OLD_SET
    assert _leftovers(small_tmpfs) == []


@pytest.mark.parametrize("code, advice", [
    (errno.ENOSPC, "free some space or write elsewhere"),
    (errno.EACCES, "permission denied; choose a place you can write to"),
    (errno.EROFS, "the file system is read-only"),
    (errno.ENAMETOOLONG, "choose a shorter one"),
    (errno.EDQUOT, "free some space or write elsewhere"),
])
def test_each_os_error_is_one_line_naming_the_file_and_what_to_do(tmp_path, monkeypatch,
                                                                  code, advice):
    def failing(fd, payload):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(files, "_write_all", failing)
    with pytest.raises(InputError) as caught:
        files.write_file(tmp_path / "out.json", "x")
    message = str(caught.value)
    assert message.startswith(f"cannot write '{tmp_path / 'out.json'}': {os.strerror(code)} "
                              f"({errno.errorcode[code]}); ")
    assert advice in message and "\n" not in message
    assert _leftovers(tmp_path) == []
