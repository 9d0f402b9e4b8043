"""The operating-system primitives ``introspect.files`` builds on, on Linux, macOS and Windows.

Two of them differ by system, and each degrades to a method that keeps the guarantee
``files`` makes (one writer per target; a report folder holds the complete previous set
or the complete new one):

- **An exclusive lock on an open file, without waiting** (``try_lock``): ``flock`` where
  the ``fcntl`` module exists (Linux, macOS), else ``lockf`` (a POSIX record lock from the
  ``os`` module), else ``msvcrt.locking`` (Windows). Each is dropped by the system when
  its process dies, so a killed run never leaves a lock held. A record lock is per
  process, not per open file, so a lock held in this process is also remembered here
  (``_held``): a second writer in the same process is refused as one in another is.
  (A record lock also ends when the process closes any descriptor of the file: only a
  second thread of one process that gives up waiting can do that, on a system with
  neither ``flock`` nor ``msvcrt``.)
- **Swapping two folders** (``exchange_folders``): one ``renameat2(RENAME_EXCHANGE)`` on
  Linux (both names always exist); elsewhere, or on a file system without it, three
  renames: the current folder aside under a hidden name, the new one in, the old one to
  the new one's name. If the second rename fails, the first is undone. Only a kill -9 or
  a power cut between them can leave the old set under its hidden name, with the target
  missing; the next write to the target puts its entries back (``files._recover_leftovers``).

The ``O_*`` flags that only some systems have are 0 where they are missing (Windows has
no ``O_NOFOLLOW``, ``O_CLOEXEC`` or ``O_NONBLOCK``; its handles are not inherited anyway)
and ``O_BINARY`` is set where it exists, so no newline is ever translated.

Example::

    >>> fd = os.open(".lock", os.O_RDWR | os.O_CREAT | O_CLOEXEC)
    >>> try_lock(fd, ".lock")
    True
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import threading
from pathlib import Path
from typing import Any

O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_NOCTTY = getattr(os, "O_NOCTTY", 0)
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
O_BINARY = getattr(os, "O_BINARY", 0)

_held: set[str] = set()  # lock files this process holds (record locks do not see them)
_held_guard = threading.Lock()


def _lock_module(name: str) -> Any:
    """``fcntl`` or ``msvcrt``, or None where this system (or a test) lacks it."""
    try:
        return __import__(name)
    except ImportError:
        return None


def lock_method() -> str:
    """The lock ``try_lock`` uses here: ``flock``, ``lockf`` or ``msvcrt``."""
    if _lock_module("fcntl") is not None:
        return "flock"
    if hasattr(os, "lockf"):
        return "lockf"
    if _lock_module("msvcrt") is not None:
        return "msvcrt"
    raise OSError(errno.ENOSYS, "this system offers no file lock (flock, lockf or msvcrt)")


def try_lock(fd: int, path: str) -> bool:
    """Lock the open file ``fd`` (the lock file ``path``) for this process; False when
    another writer, in this process or another, holds it. Released by ``unlock``."""
    with _held_guard:
        if path in _held:
            return False
        method = lock_method()
        try:
            if method == "flock":
                fcntl = _lock_module("fcntl")
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            elif method == "lockf":
                os.lockf(fd, os.F_TLOCK, 0)
            else:
                msvcrt = _lock_module("msvcrt")
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK, errno.EDEADLK):
                return False
            raise
        _held.add(path)
        return True


def unlock(path: str) -> None:
    """Forget this process's lock on ``path``; closing its descriptor releases the lock."""
    with _held_guard:
        _held.discard(path)


def hard_link(source: str | os.PathLike[str], link: str | os.PathLike[str]) -> None:
    """A hard link to ``source`` itself, not to what it points to if it is a symbolic link
    (``linkat`` without following; Windows' ``os.link`` has no such choice and never
    follows). Raises OSError where the file system has no hard links."""
    if os.link in os.supports_follow_symlinks:
        os.link(source, link, follow_symlinks=False)
    else:
        os.link(source, link)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_NOT_SUPPORTED = (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP)


def _renameat2() -> Any:
    """libc's ``renameat2`` (Linux, glibc 2.28 or newer), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                         ctypes.c_uint]
    return function


def swap_method() -> str:
    """How ``exchange_folders`` swaps here: ``renameat2`` or ``three renames``."""
    return "renameat2" if _renameat2() is not None else "three renames"


def exchange_folders(new: Path, current: Path, aside: Path) -> None:
    """Put folder ``new`` at ``current``'s name and the previous ``current`` at ``new``'s.

    One atomic ``renameat2(RENAME_EXCHANGE)`` where the system has it; otherwise
    ``current`` goes to ``aside`` (a hidden name next to it), ``new`` to ``current``, and
    ``aside`` to ``new``, undoing the first rename if the second fails.
    """
    renameat2 = _renameat2()
    if renameat2 is not None:
        if renameat2(_AT_FDCWD, os.fsencode(new), _AT_FDCWD, os.fsencode(current),
                     _RENAME_EXCHANGE) == 0:
            return
        code = ctypes.get_errno()
        if code not in _NOT_SUPPORTED:
            raise OSError(code, os.strerror(code), str(current))
    os.rename(current, aside)
    try:
        os.rename(new, current)
    except BaseException:
        os.rename(aside, current)
        raise
    os.rename(aside, new)  # the caller removes ``new``, which now holds the previous set
