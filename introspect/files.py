"""The one way this project writes files: a single output, or a set of reports in a folder.

What a write does depends on what the path is (``write_file``):

- a regular file, or nothing yet: written atomically: a temp file in the same folder,
  fsync, rename. The previous version stays intact until the new one is complete.
- a character device or a FIFO (``/dev/null``, a named pipe), ``/dev/stdout``,
  ``/dev/stderr``, ``/dev/fd/N`` or ``-`` (stdout): written in place, never replaced.
- a symbolic link: followed; its target is written as above, the link stays a link.
- a folder, a block device or a socket: refused.

A new file gets mode 0o666 less the umask (the kernel applies it, as for any program);
an existing file keeps its mode. A set of reports (``write_folder``) is built in a sibling
temp folder and swapped in with one ``renameat2(RENAME_EXCHANGE)``, so the folder holds
the complete previous set or the complete new one; files of other names stay. A set of
files side by side (a capture and its indexes, ``write_set``) is renamed into place
together. One writer per target at a time (``target_lock``), in this process or another.

Reading what users name (``open_regular``, ``read_text``, ``read_json``): regular files
only (a FIFO or a device is refused without blocking), size-capped before reading, JSON
depth-limited, and errors name the file without quoting it. ``printable_name`` makes
names of any bytes safe to show and to write.

SIGINT and SIGTERM that arrive while files are committed (from the main thread) are held
until the commit is over, then delivered as before; every temp file and folder is
removed on every way out, exceptions included. Every ``OSError`` becomes an
``InputError`` of one line that names the file and says what to do.

Example::

    >>> check_outputs({"--json": "d.json", "--junit": "j.xml"})   # before the slow part
    >>> write_file("d.json", text)
    PosixPath('d.json')
    >>> write_folder("parity-report", {"diff.json": text, "diff.md": summary})
    [PosixPath('parity-report/diff.json'), PosixPath('parity-report/diff.md')]
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import stat
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from introspect.errors import InputError
from introspect.platform_io import (
    O_BINARY,
    O_CLOEXEC,
    O_DIRECTORY,
    O_NOCTTY,
    O_NOFOLLOW,
    O_NONBLOCK,
    exchange_folders,
    hard_link,
    try_lock,
    unlock,
)

Data = str | bytes
PathLike = str | os.PathLike[str]

# Paths that name an open file descriptor of this process: written to that descriptor, so a
# shell redirection (`> out.txt`, `>> log`, a pipe) keeps its meaning.
_DESCRIPTOR_PATH = re.compile(r"^/(?:dev/fd|proc/(self|\d+)/fd)/(\d+)$")
_STANDARD_STREAMS = {"/dev/stdout": 1, "/dev/stderr": 2}
_HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_MAX_LINKS = 40  # symbolic links followed before giving up, as the kernel does
_TEMP_STEM = 80  # characters of the target's name kept in a temp name (NAME_MAX is 255)

# What to do about the errors users meet, by errno.
_ADVICE = {
    errno.ENOSPC: "free some space or write elsewhere",  # the system's words say what failed
    errno.EDQUOT: "free some space or write elsewhere",
    errno.EACCES: "permission denied; choose a place you can write to",
    errno.EPERM: "not permitted; choose a place you can write to",
    errno.EROFS: "the file system is read-only; write elsewhere",
    errno.ENAMETOOLONG: "the name is too long; choose a shorter one",
    errno.ENOENT: "a folder on the way does not exist; create it first",
    errno.ENOTDIR: "a part of the path is not a folder",
    errno.EISDIR: "it is a folder; give a file name",
    errno.ENXIO: "no process has it open for reading",
    errno.EPIPE: "the reading end was closed",
    errno.EIO: "an input/output error; check the disk",
}


# ----------------------------------------------------------------------------------------
# Errors


def describe_os_error(error: OSError, path: PathLike | None = None) -> str:
    """One line for a failed write: the file, the system's reason and what to do."""
    name = os.fspath(path) if path is not None else error.filename
    reason = error.strerror or str(error)
    code = errno.errorcode.get(error.errno or 0)
    what = f"cannot write {os.fsdecode(name)!r}" if name is not None else "cannot write"
    advice = _ADVICE.get(error.errno or 0)
    return f"{what}: {reason}" + (f" ({code})" if code else "") + (f"; {advice}" if advice else "")


@contextlib.contextmanager
def _as_input_error(path: PathLike, suffix: str = "") -> Iterator[None]:
    """Turn an ``OSError`` in the block into an ``InputError`` naming ``path``."""
    try:
        yield
    except OSError as e:
        raise InputError(describe_os_error(e, path) + suffix) from e


# ----------------------------------------------------------------------------------------
# What was written (for "interrupted; wrote ..." messages)

_JOURNAL_KEPT = 64
_journal: list[str] = []  # the last outputs committed, newest last
_journal_total = [0]  # how many were ever committed (a list: changed in place)


def written_count() -> int:
    """How many outputs this process has committed so far; pass it to ``written_since``."""
    return _journal_total[0]


def written_since(count: int) -> list[str]:
    """The outputs committed after ``written_count()`` returned ``count`` (the last 64 at most)."""
    new = _journal_total[0] - count
    return _journal[-new:] if new > 0 else []


def _committed(label: str) -> None:
    _journal.append(label)
    _journal_total[0] += 1
    del _journal[:-_JOURNAL_KEPT]


def describe_written(count: int) -> str:
    """``"no file was written"`` or ``"only X and Y were written"``."""
    written = written_since(count)
    if not written:
        return "no file was written"
    return f"only {', '.join(written)} {'was' if len(written) == 1 else 'were'} written"


# ----------------------------------------------------------------------------------------
# Temp files and signals

_live_temps: set[str] = set()
_hold = threading.local()


def remove_temps() -> None:
    """Remove every temp file and folder this process still has (at exit, or before an
    exit that skips ``atexit``)."""
    for name in list(_live_temps):
        if os.path.isdir(name) and not os.path.islink(name):
            shutil.rmtree(name, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(name)
        _live_temps.discard(name)


atexit.register(remove_temps)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while the block commits files, then deliver them as before.

    Only the main thread can set signal handlers; elsewhere the block runs as it is (its
    temp files are still removed at exit). Nested blocks hold once.
    """
    depth = getattr(_hold, "depth", 0)
    if depth or threading.current_thread() is not threading.main_thread():
        _hold.depth = depth + 1
        try:
            yield
        finally:
            _hold.depth = depth
        return
    received: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous: dict[int, Any] = {}
    try:
        for signum in _HELD_SIGNALS:
            handler = signal.getsignal(signum)
            if handler is None:  # set from C: it could not be put back
                continue
            previous[signum] = handler
            signal.signal(signum, hold)
        _hold.depth = 1
        yield
    finally:
        _hold.depth = 0
        for held, handler in previous.items():
            signal.signal(held, handler)
        for number in dict.fromkeys(received):
            signal.raise_signal(number)  # the previous handler acts: KeyboardInterrupt, exit


# ----------------------------------------------------------------------------------------
# Checking outputs before the slow part


def check_writable(path: PathLike) -> Path:
    """Fail early, before any model work, if ``path`` cannot be written.

    Follows symbolic links; a device, a FIFO or a descriptor path must be writable; for a
    regular file a temp file is made and removed in its folder, which proves the rename
    will work (read-only or full file systems, /proc, names too long).

    Raises:
        InputError: the folder does not exist, is not a folder, or is not writable;
            ``path`` is itself a folder, a block device or a socket.
    """
    name = os.fspath(path)
    if name == "-" or _descriptor(name) is not None:
        return Path(name)
    target = _resolve(Path(name), name)
    if _descriptor(str(target)) is not None:  # a link to /dev/stdout, say
        return Path(name)
    folder = target.parent
    info = _lstat(target, name)
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise InputError(f"output path {name!r} is a folder; give a file name")
    if info is not None and not stat.S_ISREG(info.st_mode):
        _check_special(target, info, name)
        return Path(name)
    folder_info = _lstat(folder, name)
    if folder_info is None:
        raise InputError(f"cannot write {name!r}: folder {str(folder)!r} does not exist")
    if not stat.S_ISDIR(folder_info.st_mode):
        raise InputError(f"cannot write {name!r}: {str(folder)!r} is not a folder")
    if not os.access(folder, os.W_OK):
        raise InputError(f"cannot write {name!r}: folder {str(folder)!r} is not writable")
    with _as_input_error(name):
        _check_name_length(target)
        probe = _temp_name(target)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_CLOEXEC, 0o600))
        os.unlink(probe)
    return Path(name)


def check_writable_folder(path: PathLike, names: Iterable[str] = ()) -> Path:
    """Like ``check_writable`` for an output folder, which is created if its parent exists.

    Args:
        path: the folder.
        names: the files a set written there will replace; each must be absent or a
            regular file (``DIR/diff.svg`` being a folder is found now, not after the work).

    Raises:
        InputError: the path is a file, its parent does not exist, it cannot be written,
            or one of ``names`` in it is not a regular file.
    """
    name = os.fspath(path)
    folder = Path(os.path.realpath(name))
    if folder.exists() and not folder.is_dir():
        raise InputError(f"output folder {name!r} is a file")
    parent = folder.parent
    if not parent.is_dir():
        raise InputError(f"cannot create output folder {name!r}: "
                         f"{str(Path(name).parent)!r} does not exist")
    if folder.is_dir() and _in_place_only(folder):  # written inside, never swapped
        if not os.access(folder, os.W_OK):
            raise InputError(f"output folder {name!r} is not writable")
        probe = _temp_name(folder / "probe")
    else:
        if not os.access(folder if folder.exists() else parent, os.W_OK) or not os.access(
            parent, os.W_OK
        ):
            raise InputError(f"output folder {name!r} is not writable (its parent folder must "
                             f"be writable too: the new set is swapped in from there)")
        probe = _temp_name(folder)
    with _as_input_error(name):
        _check_name_length(folder)
        os.mkdir(probe, 0o700)
        os.rmdir(probe)
    if folder.is_dir():
        for file_name in names:
            _check_replaceable(folder / file_name, Path(name) / file_name)
    return Path(name)


def check_outputs(files: Mapping[str, PathLike | None] | None = None,
                  folders: Mapping[str, PathLike | None] | None = None) -> None:
    """Check every output of a command up front: writable, and no two on one path.

    Args:
        files: option name -> file path (``None`` when the option is not given; ``-`` is
            stdout), e.g. ``{"--json": "d.json", "--junit": "j.xml"}``.
        folders: option name -> output folder (``--out``).

    Raises:
        InputError: an output cannot be written, or two options name the same file
            (or both ``-``), quoting both options.
    """
    seen: dict[object, str] = {}
    for option, path in (files or {}).items():
        if path is None:
            continue
        check_writable(path)
        _claim(seen, _identity(path), option, path)
    for option, path in (folders or {}).items():
        if path is None:
            continue
        check_writable_folder(path)
        _claim(seen, _identity(path), option, path)


def _claim(seen: dict[object, str], key: object, option: str, path: PathLike) -> None:
    if key in seen:
        raise InputError(
            f"{seen[key]} and {option} both write to {os.fspath(path)!r}; "
            f"give each output its own path"
        )
    seen[key] = option


def _identity(path: PathLike) -> object:
    """What two paths must share to be one output: the file, else the resolved name."""
    name = os.fspath(path)
    if name == "-":
        return ("fd", 1)
    descriptor = _descriptor(name)
    if descriptor is not None:
        return ("fd", descriptor)
    real = os.path.realpath(name)
    try:
        info = os.stat(real)
    except OSError:
        return ("path", real)
    if stat.S_ISCHR(info.st_mode):  # /dev/null may take any number of outputs
        return ("device", name, object())
    return ("inode", info.st_dev, info.st_ino)


def _check_special(target: Path, info: os.stat_result, name: str) -> None:
    if stat.S_ISCHR(info.st_mode) or stat.S_ISFIFO(info.st_mode):
        if not os.access(target, os.W_OK):
            raise InputError(f"cannot write {name!r}: permission denied")
        return
    kind = "a block device" if stat.S_ISBLK(info.st_mode) else "a socket or other special file"
    raise InputError(f"output path {name!r} is {kind}; introspect writes only files, "
                     f"character devices and pipes")


def _check_name_length(target: Path) -> None:
    limit = os.pathconf(target.parent, "PC_NAME_MAX")
    if len(os.fsencode(target.name)) > limit:
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), str(target))


# ----------------------------------------------------------------------------------------
# Writing one output


def write_file(path: PathLike, data: Data) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` the way the kind of path asks for.

    Regular files and new names atomically; devices, FIFOs and descriptor paths
    (``-``, ``/dev/stdout``, ``/dev/fd/N``) in place; symbolic links followed.

    Returns:
        The path as given.

    Raises:
        InputError: the path cannot be written (one line: the file, the system's
            reason, what to do); nothing is left behind.
    """
    name = os.fspath(path)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    descriptor = 1 if name == "-" else _descriptor(name)
    if descriptor is not None:
        _write_descriptor(descriptor, payload, "standard output" if name == "-" else name)
        _committed(name)
        return Path(name)
    target = _resolve(Path(name), name)
    descriptor = _descriptor(str(target))
    if descriptor is not None:  # a link to /dev/stdout, say
        _write_descriptor(descriptor, payload, name)
        _committed(name)
        return Path(name)
    info = _lstat(target, name)
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise InputError(f"output path {name!r} is a folder; give a file name")
    if info is not None and not stat.S_ISREG(info.st_mode):
        _check_special(target, info, name)
        with _as_input_error(name):
            fd = os.open(target, os.O_WRONLY | O_NOCTTY | O_CLOEXEC | O_BINARY)
            try:
                _write_all(fd, payload)
            finally:
                os.close(fd)
        _committed(name)
    else:
        with _as_input_error(name, "; any previous file is unchanged"):
            _replace_atomically(target, payload, info, name)
    return Path(name)


def write_atomic(path: PathLike, data: Data) -> Path:
    """The former name of ``write_file``, kept for callers."""
    return write_file(path, data)


def write_stdout(data: Data) -> None:
    """Write to standard output and flush, as a one-line ``InputError`` when it fails."""
    write_file("-", data)


def flush_stdout() -> None:
    """Flush standard output; a failure (``> /dev/full``, a closed pipe) is an ``InputError``.

    Afterwards stdout points at /dev/null, so Python's own flush at exit stays quiet.
    """
    try:
        sys.stdout.flush()
    except OSError as e:
        silence_stdout()
        raise InputError(_stdout_message(e)) from e


def silence_stdout() -> None:
    """Point descriptor 1 at /dev/null, dropping what could not be written."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def describe_failure(error: OSError) -> str:
    """One line for an ``OSError`` no check caught; a broken stdout is named and silenced.

    Every write of this module names its file, so an error without a file name comes
    from the standard streams: stdout is pointed at /dev/null so that Python's own flush
    at exit does not fail a second time.
    """
    if error.filename is None:
        silence_stdout()
        return _stdout_message(error)
    return describe_os_error(error)


def _stdout_message(error: OSError) -> str:
    return describe_os_error(error, "standard output").replace(
        "'standard output'", "to standard output"
    )


def _descriptor(name: str) -> int | None:
    """The file descriptor a path names (``/dev/stdout``, ``/dev/fd/3``), else None."""
    normal = os.path.normpath(name)
    if normal in _STANDARD_STREAMS:
        return _STANDARD_STREAMS[normal]
    match = _DESCRIPTOR_PATH.match(normal)
    if match is None or match.group(1) not in (None, "self", str(os.getpid())):
        return None
    return int(match.group(2))


def _write_descriptor(fd: int, payload: bytes, shown: str) -> None:
    stream = {1: sys.stdout, 2: sys.stderr}.get(fd)
    try:
        if stream is not None:
            buffer = getattr(stream, "buffer", None)
            if buffer is not None:
                stream.flush()
                buffer.write(payload)
            else:  # a text stream without bytes (a notebook, a test's capture)
                stream.write(payload.decode("utf-8", "replace"))
            stream.flush()
        else:
            _write_all(fd, payload)
    except OSError as e:
        if fd == 1:
            silence_stdout()
            raise InputError(_stdout_message(e)) from e
        raise InputError(describe_os_error(e, shown)) from e


def _write_all(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view):]


def _resolve(path: Path, shown: str) -> Path:
    """``path`` with every symbolic link followed, the last one included."""
    current = Path(os.path.abspath(path))
    for _ in range(_MAX_LINKS):
        info = _lstat(current, shown)
        if info is None or not stat.S_ISLNK(info.st_mode):
            return current
        with _as_input_error(shown):
            link = os.readlink(current)
        current = Path(os.path.abspath(current.parent / link))
        if _descriptor(str(current)) is not None:
            return current
        current = Path(os.path.realpath(current.parent)) / current.name
    raise InputError(f"cannot write {shown!r}: too many levels of symbolic links")


def _lstat(path: Path, shown: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise InputError(describe_os_error(e, shown)) from e


def _temp_name(target: Path) -> Path:
    stem = target.name[:_TEMP_STEM]
    return target.parent / f".{stem}.{secrets.token_hex(4)}.tmp"


def _replace_atomically(target: Path, payload: bytes, old: os.stat_result | None,
                        label: str) -> None:
    """Temp file in the same folder, fsync, rename; the temp is gone on every way out."""
    _check_name_length(target)
    with _signals_held():
        temp = _new_file(_temp_name(target), payload, old)
        try:
            os.replace(temp, target)
        except BaseException:
            _discard(temp)
            raise
        _live_temps.discard(str(temp))
        _committed(label)  # before a held signal is delivered: the message must know
    _fsync_folder(target.parent)


def _new_file(path: Path, payload: bytes, old: os.stat_result | None) -> Path:
    """Create ``path`` (which must not exist), write, fsync; mode: ``old``'s, else umask's."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_CLOEXEC | O_BINARY, 0o666)
    _live_temps.add(str(path))
    try:
        try:
            _write_all(fd, payload)
            if old is not None:
                os.fchmod(fd, stat.S_IMODE(old.st_mode))
                if os.geteuid() == 0:  # root can keep the owner too
                    with contextlib.suppress(OSError):
                        os.fchown(fd, old.st_uid, old.st_gid)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        _discard(path)
        raise
    return path


def _discard(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
    _live_temps.discard(str(path))


def _fsync_folder(folder: Path) -> None:
    """Make a rename durable; some file systems cannot open a folder, which is fine."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ----------------------------------------------------------------------------------------
# Writing a set of files side by side (a capture and its indexes), all or nothing


def write_set(outputs: Sequence[tuple[PathLike, Data]],
              remove: Sequence[PathLike] = ()) -> list[Path]:
    """Write several regular files as one set: all of them replaced, or none.

    Every file is first written to a temp file next to its target and fsynced (a full
    disk stops here, nothing replaced); then each target is renamed into place in the
    order given (put the index last), under the first target's lock and with SIGINT and
    SIGTERM held, the previous versions kept as hard links until the last rename is done.
    A rename that fails puts every file already replaced back. So the files appear
    together or not at all on every way out but a kill -9 between two renames.

    Args:
        outputs: (path, text or bytes) pairs; the paths are regular files or new names
            (links to them are followed).
        remove: files of an earlier set that this one no longer has (a capture's gradient
            file, when capturing without them): removed first, as part of the set, and put
            back if the set fails.

    Returns:
        The paths as given.

    Raises:
        InputError: a path that is not a regular file, another run writing the same set,
            or any write or rename that fails (one line naming the file; the previous
            files are unchanged).
    """
    targets = []
    for path, data in outputs:
        name = os.fspath(path)
        target = _resolve(Path(name), name)
        info = _lstat(target, name)
        if info is not None and not stat.S_ISREG(info.st_mode):
            raise InputError(f"output path {name!r} is not a regular file; a set of files is "
                             "replaced as a whole and only regular files can be")
        payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        targets.append((target, name, payload, info))
    removals = []
    for path in remove:
        name = os.fspath(path)
        target = _resolve(Path(name), name)
        info = _lstat(target, name)
        if info is None:
            continue
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{name!r} is not a regular file; it belongs to the set being "
                             "written, which no longer has it: move it away")
        removals.append(target)
    if not targets:
        return []
    with target_lock(targets[0][0], targets[0][1]):
        _remove_leftover_temps([t for t, _, _, _ in targets] + removals)
        temps: list[Path] = []
        current = targets[0][1]
        try:
            for target, name, payload, old in targets:
                current = name
                _check_name_length(target)
                temps.append(_new_file(_temp_name(target), payload, old))
            pause_for_tests("set")
            _rename_set([(t, n) for t, n, _, _ in targets], temps, removals)
        except OSError as e:
            shown = e.filename if isinstance(e.filename, str) else current
            raise InputError(describe_os_error(e, shown) + "; nothing was written (any "
                             "previous files are unchanged)") from e
        finally:
            for temp in temps:
                _discard(temp)
        for _, name, _, _ in targets:
            _committed(name)
        _fsync_folder(targets[0][0].parent)
    return [Path(name) for _, name, _, _ in targets]


def _remove_leftover_temps(targets: Sequence[Path]) -> None:
    """Remove the temp files a killed write of this set left (kill -9 after the writes).

    Called under the set's lock, so no live run owns them; names are ``_temp_name``'s
    (``.NAME.XXXXXXXX.tmp``, and ``.old.tmp`` for a previous version kept aside).
    """
    for target in targets:
        stem = re.escape(f".{target.name[:_TEMP_STEM]}.")
        pattern = re.compile(stem + r"[0-9a-f]{8}(?:\.old)?\.tmp")
        with contextlib.suppress(OSError):
            for entry in os.scandir(target.parent):
                if pattern.fullmatch(entry.name) and entry.is_file(follow_symlinks=False) \
                        and entry.path not in _live_temps:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)


def _rename_set(targets: Sequence[tuple[Path, str]], temps: Sequence[Path],
                removals: Sequence[Path] = ()) -> None:
    """Remove ``removals``, rename each temp onto its target; on any failure put back what
    was removed or replaced."""
    replaced: list[tuple[Path, Path | None]] = []  # target, its previous version kept aside

    def keep_aside(target: Path) -> None:
        backup = None
        if os.path.lexists(target):
            backup = _temp_name(target).with_suffix(".old.tmp")
            try:
                hard_link(target, backup)
            except OSError:  # no hard links here: a copy keeps it just as well
                shutil.copy2(target, backup, follow_symlinks=False)
            _live_temps.add(str(backup))
        replaced.append((target, backup))

    try:
        for target in removals:
            keep_aside(target)
            os.unlink(target)
        for (target, _), temp in zip(targets, temps, strict=True):
            keep_aside(target)
            os.replace(temp, target)
    except BaseException:
        for target, backup in reversed(replaced):
            with contextlib.suppress(OSError):
                if backup is not None:
                    os.replace(backup, target)
                    _live_temps.discard(str(backup))
                else:
                    os.unlink(target)
        raise
    finally:
        for _, backup in replaced:
            if backup is not None:
                _discard(backup)


# ----------------------------------------------------------------------------------------
# Writing a set of files into a folder, all or nothing


def write_folder(folder: PathLike, files: Mapping[str, Data],
                 owned: Iterable[str] = ()) -> list[Path]:
    """Write ``files`` (name -> content) into ``folder`` as one set: all or nothing.

    The set is built in a temp folder next to ``folder``; files and links of other names
    already in ``folder`` are hard-linked (or copied) into it and subfolders moved; then
    one ``renameat2(RENAME_EXCHANGE)`` swaps the two folders (Linux; elsewhere two renames
    with the old set kept under ``.NAME.introspect-DIGEST-old-*`` in between). So
    ``folder`` holds the complete previous set or the complete new one whatever fails or
    interrupts, and no temp file stays. Only a kill -9 or a power cut between the steps
    can leave the sibling temp folder behind (with a subfolder moved into it, if any):
    the next write to ``folder`` puts the user's entries back and removes it.

    One writer at a time: the target's lock (``target_lock``) is taken before the folder
    is listed and held until the swap is done; a second run waits, then refuses. Entries
    another program adds to ``folder`` while the set is built are moved back after the
    swap, so files and subfolders of other names always survive.
    ``folder`` may be a link to a folder; the swap happens where it points. ``folder``'s
    mode is kept; a new folder follows the umask.

    Args:
        folder: the output folder; created if its parent exists.
        files: plain file names (no ``/``) -> text (written as UTF-8) or bytes.
        owned: every name the set may have (``files``' names are added); those this set
            lacks are not carried over (a rerun without the drawing drops the old one),
            so the folder never mixes two sets.

    Returns:
        The paths written, in the order given.

    Raises:
        InputError: the folder or its parent cannot be written, an entry of the set's
            names in ``folder`` is not a regular file, or a write fails (one line); the
            previous set is then unchanged.
    """
    name = os.fspath(folder)
    for file_name in files:
        if not file_name or "/" in file_name or file_name in (".", ".."):
            raise InputError(f"report file name {file_name!r} is not a plain file name")
    own = {*files, *owned}
    check_writable_folder(name, sorted(own))
    real = Path(os.path.realpath(name))
    payloads = {n: d.encode("utf-8") if isinstance(d, str) else bytes(d) for n, d in files.items()}
    with target_lock(real, name):  # before the folder is listed, until the swap is done
        with _as_input_error(name, "; nothing was changed"):
            _recover_leftovers(real, own)
        exists = real.is_dir()
        kept = "the previous reports in it are unchanged" if exists else "no report was written"
        with _as_input_error(name, f"; {kept}"):
            count = f"{len(files)} file{'s' if len(files) != 1 else ''}"  # a line's worth
            _swap_in(real, payloads, exists, own, f"{name}{os.sep} ({count})")
    return [Path(name) / file_name for file_name in files]


def _check_replaceable(entry: Path, shown: Path) -> None:
    info = _lstat(entry, str(shown))
    if info is None or stat.S_ISREG(info.st_mode):
        return
    kind = ("a folder" if stat.S_ISDIR(info.st_mode)
            else "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file")
    raise InputError(
        f"{str(shown)!r} is {kind}; the report set replaces its own files as a whole and "
        f"will not replace it: move it away or choose another output folder"
    )


def _swap_in(real: Path, payloads: Mapping[str, bytes], exists: bool, own: set[str],
             label: str) -> None:
    """The set into ``real``: swapped in as a folder, or written in place where a swap
    cannot be (see ``write_folder``); the user's entries are never lost on any way out."""
    with _signals_held():
        if exists and _in_place_only(real):
            _write_in_place(real, payloads, own, label)
            return
        temp = real.parent / f"{_sibling_prefix(real)}{secrets.token_hex(4)}"
        os.mkdir(temp, 0o777)
        _live_temps.add(str(temp))
        moved: list[str] = []  # the user's subfolders moved into temp, as they are moved
        carried: dict[str, tuple[int, int]] = {}
        swapped = False
        try:
            for file_name, payload in payloads.items():
                old = _lstat(real / file_name, file_name) if exists else None
                _write_new(temp / file_name, payload, old)
            if exists:
                os.chmod(temp, stat.S_IMODE(os.stat(real).st_mode))
                try:
                    _carry_over(real, temp, own, carried, moved)
                    _fsync_folder(temp)
                    pause_for_tests("swap")
                    _exchange(temp, real)  # temp now holds the previous set
                except OSError:  # a subfolder or file that cannot move or link, a mount point
                    _put_back(temp, real, moved)
                    _write_in_place(real, payloads, own, label)
                    return
                swapped = True
                _return_late_entries(temp, real, own, carried)
            else:
                _fsync_folder(temp)
                os.rename(temp, real)
                swapped = True
            _committed(label)  # before a held signal is delivered: the message must know
            _fsync_folder(real.parent)
        except BaseException:
            if not swapped:
                _put_back(temp, real, moved)
            raise
        finally:  # the previous set after a swap, the unfinished new one otherwise
            _clear_temp(temp, real, own, carried if swapped else {}, swapped)


def _in_place_only(real: Path) -> bool:
    """A folder that cannot be swapped: a mount point (EBUSY), or the working folder or
    one that holds it (a swap would move it from under the process)."""
    if os.path.ismount(real):
        return True
    here = Path(os.path.realpath(os.getcwd()))
    return real == here or real in here.parents


def _put_back(temp: Path, real: Path, moved: list[str]) -> None:
    """Move the subfolders carried into ``temp`` back into ``real`` (before a swap)."""
    for entry in reversed(moved):
        if os.path.lexists(temp / entry) and not os.path.lexists(real / entry):
            with contextlib.suppress(OSError):
                os.rename(temp / entry, real / entry)
                moved.remove(entry)


def _clear_temp(temp: Path, real: Path, own: set[str], carried: Mapping[str, tuple[int, int]],
                swapped: bool) -> None:
    """Remove the temp folder, never a user's entry.

    Before the swap it holds the set's files, links to the user's files (whose originals
    are in ``real``) and whatever could not be moved back; after it, the previous folder:
    the old set and the originals of the files carried (now linked from ``real``). An
    entry that is neither goes back into ``real``; if it cannot, the folder stays, out of
    the way, and the next write to ``real`` puts it back (``_recover_leftovers``).
    """
    kept = False
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(temp):
            path, there = Path(entry.path), real / entry.name
            if entry.name in own or _duplicate(entry, there, carried, swapped):
                try:
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(path)
                    else:
                        os.unlink(path)
                except OSError:
                    kept = True
            elif not os.path.lexists(there):
                try:
                    os.rename(path, there)
                except OSError:
                    kept = True
            else:
                kept = True
        if not kept:
            shutil.rmtree(temp, ignore_errors=True)
    _live_temps.discard(str(temp))  # kept: not removed at exit either


def _duplicate(entry: os.DirEntry[str], there: Path, carried: Mapping[str, tuple[int, int]],
               swapped: bool) -> bool:
    """Whether ``entry`` of the temp folder is a second name of what ``there`` holds."""
    try:
        mine, theirs = entry.stat(follow_symlinks=False), os.lstat(there)
    except OSError:
        return False
    if stat.S_ISDIR(mine.st_mode):
        return False
    if stat.S_ISLNK(mine.st_mode):  # carried as a new link with the same target
        return stat.S_ISLNK(theirs.st_mode) and os.readlink(entry.path) == os.readlink(there)
    same = (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)
    return same and (not swapped or carried.get(entry.name) == (mine.st_dev, mine.st_ino))


def _write_in_place(real: Path, payloads: Mapping[str, bytes], own: set[str],
                    label: str) -> None:
    """Write the set's files into ``real`` itself, all or nothing (as ``write_set``): for
    a folder that cannot be swapped or whose entries cannot be carried over. The user's
    entries are not touched at all; the set's names it no longer has are removed with it."""
    targets = [(real / name, name) for name in payloads]
    stale = [real / name for name in sorted(own - set(payloads))
             if os.path.lexists(real / name)]
    _remove_leftover_temps([t for t, _ in targets] + stale)
    temps: list[Path] = []
    try:
        for (target, name), payload in zip(targets, payloads.values(), strict=True):
            _check_name_length(target)
            temps.append(_new_file(_temp_name(target), payload, _lstat(target, name)))
        pause_for_tests("swap")
        _rename_set(targets, temps, stale)
    finally:
        for temp in temps:
            _discard(temp)
    _committed(label)
    _fsync_folder(real)


def _write_new(path: Path, payload: bytes, old: os.stat_result | None) -> None:
    """One file of a set, into the temp folder (a seam the interruption tests use)."""
    _new_file(path, payload, old)
    _live_temps.discard(str(path))  # the temp folder is the unit that gets removed


def _carry_over(real: Path, temp: Path, own: set[str], carried: dict[str, tuple[int, int]],
                moved: list[str]) -> None:
    """Put every entry of ``real`` not in ``own`` into ``temp``: files and links as second
    names (hard links, new symbolic links), subfolders moved (``moved`` lists each as soon
    as it is, so that a failure half way puts back every one).

    ``carried`` receives the name -> (device, inode) of each file and link carried, so that
    one replaced while the set was built is found after the swap.

    Raises:
        OSError: an entry cannot be carried (a read-only or mounted subfolder, a file that
            cannot be linked: immutable, or a file system without hard links); the caller
            then writes in place.
    """
    for entry in sorted(os.scandir(real), key=lambda e: e.name):
        if entry.name in own:
            continue
        destination = temp / entry.name
        info = entry.stat(follow_symlinks=False)
        if entry.is_dir(follow_symlinks=False):
            if os.path.ismount(entry.path):
                raise OSError(errno.EBUSY, "a mount point cannot be moved", entry.path)
            os.rename(entry.path, destination)
            moved.append(entry.name)
            continue
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), destination)
        else:  # a copy would leave the original to be removed with the previous set
            hard_link(entry.path, destination)
        carried[entry.name] = (info.st_dev, info.st_ino)


def _return_late_entries(previous: Path, real: Path, own: set[str],
                         carried: Mapping[str, tuple[int, int]]) -> None:
    """Move back what another program put into the folder while the set was built.

    After the swap ``previous`` holds the folder as it was at that moment. An entry of
    another name that was not carried (made after the listing), or a file carried but
    since replaced (another inode), would be removed with it: it goes back into ``real``.
    """
    for entry in os.scandir(previous):
        if entry.name in own:
            continue
        info = entry.stat(follow_symlinks=False)
        was = carried.get(entry.name)
        # the set is in place by now: an entry that cannot move stays in ``previous``,
        # which _clear_temp then keeps for the next write to put back
        with contextlib.suppress(OSError):
            if was is None and not os.path.lexists(real / entry.name):
                os.rename(entry.path, real / entry.name)
            elif was is not None and was != (info.st_dev, info.st_ino) \
                    and not entry.is_dir(follow_symlinks=False):
                os.replace(entry.path, real / entry.name)


def _sibling_prefix(real: Path) -> str:
    """The start of the name of every temp folder this module makes next to ``real``.

    It holds a digest of the full name, so that two folders whose names share their first
    80 characters never take each other's temp folders for their own.
    """
    digest = hashlib.sha256(os.fsencode(real.name)).hexdigest()[:8]
    return f".{real.name[:_TEMP_STEM]}.introspect-{digest}-"


def _recover_leftovers(real: Path, own: set[str]) -> None:
    """Clear the temp folders a killed run (kill -9, a power cut) left next to ``real``.

    Called under the target's lock, so no live run owns them. A leftover may hold the
    user's subfolders (moved in before the swap) or files of theirs: every entry whose
    name is not the set's and is missing from ``real`` goes back into it first. What can
    be neither put back nor removed (an immutable file) stays there, out of the way,
    rather than failing this run and every later one.
    """
    prefix = _sibling_prefix(real)
    pattern = re.compile(re.escape(prefix) + r"(?:old-)?[0-9a-f]{8}")
    for entry in os.scandir(real.parent):
        if not pattern.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False):
            continue
        for inside in os.scandir(entry.path):
            if inside.name in own or os.path.lexists(real / inside.name):
                continue
            if not real.is_dir():
                os.mkdir(real, 0o777)
            os.rename(inside.path, real / inside.name)
        _clear_temp(Path(entry.path), real, own, {}, swapped=False)


# ----------------------------------------------------------------------------------------
# One writer per target


LOCK_WAIT_S = 10.0  # how long a second writer of one target waits before refusing
_LOCK_POLL_S = 0.05


LOCK_WAIT_MAX_S = 3600.0  # a longer wait is a hung pipeline, not patience


def _lock_wait() -> float:
    """``INTROSPECT_LOCK_WAIT`` (seconds) when set to a number, else ``LOCK_WAIT_S``.

    Raises:
        InputError: a wait that is not finite or is over ``LOCK_WAIT_MAX_S`` (``inf``,
            ``1e309``): a run never waits forever.
    """
    text = os.environ.get("INTROSPECT_LOCK_WAIT")
    if text is None:
        return LOCK_WAIT_S
    try:
        wait = float(text)
    except ValueError:
        return LOCK_WAIT_S
    if not math.isfinite(wait) or wait > LOCK_WAIT_MAX_S:
        raise InputError(f"INTROSPECT_LOCK_WAIT={printable_name(text)[:40]} is not a wait "
                         f"this run can end: give seconds from 0 to {LOCK_WAIT_MAX_S:.0f}")
    return max(0.0, wait)


def check_lock_wait() -> None:
    """Refuse a bad ``INTROSPECT_LOCK_WAIT`` before any work (see ``_lock_wait``)."""
    _lock_wait()


@contextlib.contextmanager
def target_lock(real: Path, shown: str) -> Iterator[None]:
    """Hold the lock of one output target (a report folder, a capture's set of files).

    The lock (``platform_io.try_lock``: ``flock``, ``lockf`` or ``msvcrt``) is on a hidden
    file next to the target (``.NAME.introspect-lock-DIGEST``), removed when the block
    ends. A second writer of the same target, in this process or another, waits up to
    ``INTROSPECT_LOCK_WAIT`` seconds (10 by default), then refuses. A lock file left by a
    killed run is free (the system drops a dead process's locks) and is taken over.
    SIGINT and SIGTERM are held while the lock is.

    Raises:
        InputError: another run holds the lock for longer than the wait, or the lock file
            cannot be made (one line naming the target).
    """
    digest = hashlib.sha256(os.fsencode(real.name)).hexdigest()[:8]
    path = real.parent / f".{real.name[:_TEMP_STEM]}.introspect-lock-{digest}"
    deadline = time.monotonic() + _lock_wait()
    waited = False
    while True:
        with _as_input_error(shown, "; nothing was written"):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        locked = False
        try:
            while not try_lock(fd, str(path)):
                if not waited:
                    waited = True
                    pause_for_tests("lock-busy")
                if time.monotonic() >= deadline:
                    raise InputError(
                        f"another introspect run is writing {shown!r} (it holds the lock "
                        f"{path.name!r} beside it); nothing was written: wait for it to "
                        f"finish, or write elsewhere") from None
                time.sleep(_LOCK_POLL_S)
            locked = True
            held, now = os.fstat(fd), _lstat(path, shown)
        except BaseException:
            if locked:
                unlock(str(path))
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            break
        unlock(str(path))
        os.close(fd)  # the holder removed the file as we waited: lock the new one
    with _signals_held():  # a SIGTERM while held is delivered once the lock file is gone
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)  # while still held: a waiter finds it gone and starts over
            unlock(str(path))
            os.close(fd)


def pause_for_tests(stage: str) -> None:
    """A seam for the tests of concurrent and killed runs; nothing unless asked for.

    With ``INTROSPECT_TEST_PAUSE=STAGE[,STAGE...]:FOLDER`` set, reaching ``stage`` creates
    ``FOLDER/STAGE.PID.paused`` and waits (at most 120 s) until ``FOLDER/STAGE.go``
    exists. Stages: ``swap`` (a report set listed and built, before the swap),
    ``lock-busy`` (another run holds the target's lock), ``set`` (a capture's files
    written, before they are renamed into place).
    """
    spec = os.environ.get("INTROSPECT_TEST_PAUSE")
    if not spec:
        return
    stages, _, folder = spec.partition(":")
    if stage not in stages.split(",") or not folder:
        return
    Path(folder, f"{stage}.{os.getpid()}.paused").touch()
    go, deadline = Path(folder, f"{stage}.go"), time.monotonic() + 120
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def _exchange(new: Path, current: Path) -> None:
    """Swap two folders in one step where the system can (``platform_io``); elsewhere
    three renames, the previous set under a hidden name ``_recover_leftovers`` knows."""
    aside = current.parent / f"{_sibling_prefix(current)}old-{secrets.token_hex(4)}"
    exchange_folders(new, current, aside)


# ----------------------------------------------------------------------------------------
# Reading the files users name (dumps, order files, name maps)

TEXT_LIMIT = 16 * 2**20  # an order file, a name map, a config: more is not such a file
JSON_DEPTH = 32  # nesting levels a JSON file of this project may have
_NAME_CHARACTERS_KEPT = frozenset("\t")  # nothing else below U+0020 is shown as it is


def printable_name(name: str) -> str:
    """``name`` with every byte or character that could not be shown safely escaped.

    Bytes that were not UTF-8 (file names decoded with surrogateescape) become ``\\xNN``;
    control and format characters (newlines, ANSI escapes, bidi overrides), unassigned
    and private-use code points become ``\\xNN``/``\\uNNNN``. Names that are plain text
    come back unchanged, so a name map or an order file naming them still fits.
    """
    if name.isprintable():
        return name
    out = []
    for c in name:
        code = ord(c)
        if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte of a file name
            out.append(f"\\x{code - 0xDC00:02x}")
        elif c.isprintable() or c in _NAME_CHARACTERS_KEPT or c == " ":
            out.append(c)
        else:
            out.append(c.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def open_regular(path: PathLike, what: str = "file") -> int:
    """Open ``path`` for reading only if it is a regular file; return the descriptor.

    Links are followed, but a FIFO, a device, a socket or a folder (or a link to one) is
    refused without blocking (``O_NONBLOCK``: a FIFO without a writer does not wait).

    Raises:
        InputError: it cannot be opened or is not a regular file (one line naming it).
    """
    shown = repr(printable_name(os.fspath(path)))
    try:
        fd = os.open(path, os.O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | O_BINARY)
    except OSError as e:
        raise InputError(f"cannot read {what} {shown}: {e.strerror or e}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{what} {shown} is {_kind(info.st_mode)}; give a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: PathLike, what: str = "file", limit: int = TEXT_LIMIT) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (checked before reading).

    Raises:
        InputError: as ``open_regular``, or the file is larger than ``limit``.
    """
    shown = repr(printable_name(os.fspath(path)))
    fd = open_regular(path, what)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise InputError(f"{what} {shown} is {size:,} bytes, more than the {limit:,} such "
                             f"a file may have; is it the right file?")
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as e:
        raise InputError(f"cannot read {what} {shown}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if total > limit:
        raise InputError(f"{what} {shown} grew past the {limit:,} bytes such a file may have")
    return b"".join(chunks)


def read_text(path: PathLike, what: str = "file", limit: int = TEXT_LIMIT) -> str:
    """A regular UTF-8 text file of at most ``limit`` bytes; errors never quote its content.

    Raises:
        InputError: as ``read_regular``, or the file is not UTF-8 text.
    """
    data = read_regular(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        shown = repr(printable_name(os.fspath(path)))
        raise InputError(f"{what} {shown} is not UTF-8 text (byte {e.start:,} is not); "
                         f"give a text file") from None


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def parse_json(text: str, what: str, depth: int = JSON_DEPTH) -> Any:
    """Parse JSON nested at most ``depth`` levels; errors give the place, never the text.

    Raises:
        InputError: the text is not JSON or is nested deeper than ``depth``.
    """
    level = deepest = 0
    for bracket in _JSON_BRACKET.finditer(_JSON_STRING.sub("", text)):
        level += 1 if bracket.group() in "[{" else -1
        deepest = max(deepest, level)
        if deepest > depth:
            raise InputError(f"{what} is nested more than {depth} levels deep; "
                             f"it is not such a file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{what} is not JSON ({e.msg} at line {e.lineno}, column "
                         f"{e.colno})") from None
    except (ValueError, RecursionError) as e:
        raise InputError(f"{what} is not JSON ({type(e).__name__})") from None


def read_json(path: PathLike, what: str = "file", limit: int = TEXT_LIMIT,
              depth: int = JSON_DEPTH) -> Any:
    """A regular JSON file, size-capped and depth-limited; errors never quote its content.

    Raises:
        InputError: as ``read_text`` and ``parse_json``.
    """
    shown = f"{what} {printable_name(os.fspath(path))!r}"
    return parse_json(read_text(path, what, limit), shown, depth)
