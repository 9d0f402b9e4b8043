"""Ranks end with their parent, whatever ends it, and leave no folder behind.

A rank waits in a collective for as long as the run may take (600 s by default), and a
port's build may sleep or spin: a rank left alone by a parent that died would run on,
holding its share of the cores and the job's folder (inputs, logs, the rendezvous file).
Four lines tie each rank to the parent; any one of them is enough for the common deaths:

- **a process group of its own**, which the parent kills as a whole (``kill_rank``):
  whatever the port started goes with the rank, and a terminal's Ctrl-C reaches the
  parent only, which then stops the ranks itself;
- **a parent-death signal** (Linux ``PR_SET_PDEATHSIG``, set by the rank as it starts,
  then ``getppid`` checked, since the parent may have died before it was set): the
  kernel sends the rank SIGTERM when the parent ends, by SIGKILL, a crash or a signal;
- **a watchdog thread** on a pipe whose other end only the parent holds: end of file
  means the parent is gone, even where the parent-death signal is missing (not Linux)
  or was taken by the port's own SIGTERM handler;
- **the parent's own handlers** for SIGTERM and SIGHUP (``parent_stops``): the run stops
  as on Ctrl-C, the ranks are killed, the folder removed, then the signal is delivered
  again as before, so the process still ends as the sender meant.

A rank that finds its parent gone removes the job's folder itself and ends at once
(``os._exit``): ranks leave one after the other, and the last to go finds nothing left
to remove. The one case no line covers: a rank stuck in C code that holds the GIL forever
when its parent is SIGKILLed (the watchdog and the handler both need the GIL).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import select
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_PR_SET_NAME, _PR_SET_PDEATHSIG = 15, 1  # <linux/prctl.h>
_WATCH_SECONDS = 1.0  # how often the watchdog also asks getppid, between pipe reads
GONE_EXIT = 143  # a rank that ends because its parent did: as if SIGTERMed (128 + 15)
_STOPPING = (signal.SIGTERM, signal.SIGHUP)
# Held by the one thread that ends the rank (``leave``); re-entrant: the parent-death
# signal comes again as the rank is handed on (to a thread of the parent's, then to init)
# and its handler runs again inside the first, which must not wait on itself.
_LEAVING = threading.RLock()
_SETTLE_SECONDS = 2.0  # a SIGTERMed rank's wait for its parent's last threads to end


@dataclass(frozen=True)
class Lifeline:
    """What a rank needs to follow its parent (picklable: the spawn start method sends it).

    ``read_fd``/``write_fd`` are a pipe's ends, inherited by forked ranks; a spawned rank
    reads multiprocessing's own parent sentinel instead (-1 here), a pipe of the same kind.
    """

    parent_pid: int
    folder: str
    read_fd: int = -1
    write_fd: int = -1


class Stopped(BaseException):
    """The parent was asked to stop (SIGTERM, SIGHUP) while its ranks ran: unwinds like
    KeyboardInterrupt, so that every ``finally`` on the way kills and removes."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def open_lifeline(folder: str, forked: bool) -> Lifeline:
    """The parent's end: a pipe for forked ranks (only the parent keeps its write end)."""
    if not forked:
        return Lifeline(os.getpid(), folder)
    read_fd, write_fd = os.pipe()
    return Lifeline(os.getpid(), folder, read_fd, write_fd)


def close_lifeline(line: Lifeline) -> None:
    for fd in (line.read_fd, line.write_fd):
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def adopt(pid: int) -> None:
    """Put a just-started rank into a process group of its own (the rank does it too:
    whichever runs first wins, and the parent never kills a group that is not the rank's).
    A spawned rank that has already exec'd refuses it (EACCES); it sets its own."""
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)


def kill_rank(process: Any) -> None:
    """SIGKILL a rank and everything in its process group."""
    pid = process.pid
    if pid is None or process.exitcode is not None:
        return
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
            return
    except OSError:
        pass
    with contextlib.suppress(OSError):
        process.kill()


@contextlib.contextmanager
def parent_stops() -> Iterator[None]:
    """While ranks run: SIGTERM and SIGHUP raise ``Stopped`` in the main thread (so the
    ranks are killed and the folder removed on the way out), then the signal is sent again
    under the handler that was there before. Outside the main thread, or for a signal the
    process ignores (``nohup``), nothing is installed: the ranks' own lines still hold."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}

    def stop(signum: int, frame: Any) -> None:
        raise Stopped(signum)

    for signum in _STOPPING:
        handler = signal.getsignal(signum)
        if handler is not signal.SIG_IGN and handler is not None:
            previous[signum] = signal.signal(signum, stop)
    stopped: Stopped | None = None
    try:
        yield
    except Stopped as e:
        stopped = e
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if stopped is not None:  # everything is cleaned up: end as the sender meant
        signal.raise_signal(stopped.signum)
        raise SystemExit(128 + stopped.signum)  # the handler before ours returned


# -- the rank's side ---------------------------------------------------------------------

def follow_parent(line: Lifeline, rank: int) -> None:
    """Tie this rank to its parent: first thing a rank does, before the port runs."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    if line.write_fd >= 0:  # the parent's end: with it open here, EOF would never come
        with contextlib.suppress(OSError):
            os.close(line.write_fd)
    _prctl(_PR_SET_NAME, f"introspect-r{rank}".encode()[:15])
    signal.signal(signal.SIGTERM, lambda signum, frame: leave(line, settle=_SETTLE_SECONDS))
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if parent_gone(line):  # it died before the parent-death signal was set
        leave(line)
    watched = line.read_fd if line.read_fd >= 0 else _parent_sentinel()
    threading.Thread(target=_watch, args=(line, watched), daemon=True,
                     name="introspect-parent-watchdog").start()


def parent_gone(line: Lifeline) -> bool:
    return os.getppid() != line.parent_pid


def leave(line: Lifeline, code: int = GONE_EXIT, gone: bool = False,
          settle: float = 0.0) -> None:
    """End this rank now; remove the job's folder first when the parent is gone (no one
    else will). Two passes: a peer may write its error file during the first. The exit is
    the interpreter's own: while the port's build runs, ``os._exit`` is guarded (it raises
    instead, ``introspect.models.guards``), which would leave this rank running.

    ``gone``: the caller knows (the pipe's end of file comes as the parent closes its
    files, before the kernel gives the rank a new parent, so ``getppid`` may not say yet).
    ``settle``: seconds to wait for ``getppid`` to say. The parent-death signal comes as
    the parent's main thread ends, while its other threads (torch's, gloo's) still run: the
    rank is then the child of one of them, in the same process, and the last of them ends
    a moment later. The parent itself never sends SIGTERM (``kill_rank`` sends SIGKILL).
    """
    from introspect.models.guards import real_exit

    # One leaver at a time: the watchdog (end of file) and the parent-death SIGTERM's
    # handler come within microseconds; the first removes the folder and ends the process,
    # the second waits here, so that no exit cuts the other's removal short.
    _LEAVING.acquire()
    deadline = time.monotonic() + settle
    while not gone and not parent_gone(line) and time.monotonic() < deadline:
        time.sleep(0.02)
    if gone or parent_gone(line):
        shutil.rmtree(line.folder, ignore_errors=True)
        time.sleep(0.1)
        shutil.rmtree(line.folder, ignore_errors=True)
    real_exit(code)


def _watch(line: Lifeline, fd: int) -> None:
    """Wait for the pipe's end of file (or, every second, a new parent), then leave."""
    while not parent_gone(line):
        if fd < 0:
            time.sleep(_WATCH_SECONDS)
            continue
        try:
            ready, _, _ = select.select([fd], [], [], _WATCH_SECONDS)
            if ready and not os.read(fd, 1):  # end of file: the parent's end is closed
                break
        except OSError:
            break
    leave(line, gone=True)


def _parent_sentinel() -> int:
    parent = multiprocessing.parent_process()
    sentinel = getattr(parent, "sentinel", None)
    return sentinel if isinstance(sentinel, int) else -1


def _prctl(option: int, value: Any) -> None:
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        if isinstance(value, bytes):
            libc.prctl(option, ctypes.c_char_p(value), 0, 0, 0)
        else:
            libc.prctl(option, ctypes.c_ulong(int(value)), 0, 0, 0)
