"""What user code (a port's import, build and forward, a ``--loss``) may not do to the run.

A port is untrusted code running in our process. Besides raising, it could end the
process (``os._exit(0)`` reads as a pass in CI), print into our stdout (``--json -``
would no longer parse), change the working folder (our relative output paths would land
in its folder), set a umask of 0777 (our reports would be mode 000), or leave its own
signal handlers and ``sys.argv`` behind. ``contained`` undoes each of these around user
code; ``exits_refused`` turns ``os._exit`` into an exception (``ProcessExitCalled``) that
``ports.port_code`` words as one line and exit 2.

Only the process that installed the guard is guarded: a child forked from it (a
multiprocessing worker) ends with its own ``os._exit`` as it must.
"""

from __future__ import annotations

import contextlib
import os
import posix
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

_REAL_EXIT = os._exit  # the interpreter's own, kept for the CLI's last step
_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                             signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGPIPE,
                             signal.SIGCHLD) if isinstance(s, signal.Signals))


class ProcessExitCalled(BaseException):
    """``os._exit(code)`` called by user code while the run was guarded."""

    def __init__(self, code: Any) -> None:
        super().__init__(code)
        self.code = code


def real_exit(code: int) -> None:
    """End the process now with ``code`` (the interpreter's ``os._exit``, never a guard)."""
    _REAL_EXIT(code)


@contextlib.contextmanager
def exits_refused() -> Iterator[None]:
    """While the block runs, ``os._exit`` (and ``posix._exit``) raise ``ProcessExitCalled``.

    Nested blocks are fine: each puts back what it found.
    """
    owner = os.getpid()

    def refused(code: Any) -> None:
        if os.getpid() != owner:  # a forked child: its exit is its own business
            _REAL_EXIT(code)
        raise ProcessExitCalled(code)

    previous = os._exit, posix._exit
    os._exit = posix._exit = refused  # type: ignore[assignment]
    try:
        yield
    finally:
        os._exit, posix._exit = previous  # type: ignore[assignment]


@contextlib.contextmanager
def contained() -> Iterator[None]:
    """Run user code so that it cannot exit, print to stdout or move our outputs.

    While the block runs, ``os._exit`` raises, and ``sys.stdout`` and file descriptor 1
    point at stderr (a port's ``print`` or ``os.write(1, ...)`` is shown, not mixed into
    ``--json -``). After it, the working folder, the umask, ``sys.argv`` and the handlers
    of the usual signals are put back as they were.
    """
    cwd = _cwd()
    umask = os.umask(0o022)
    os.umask(umask)
    argv = list(sys.argv)
    main_thread = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in _SIGNALS} if main_thread else {}
    with exits_refused(), _stdout_to_stderr():
        try:
            yield
        finally:
            if cwd is not None:
                with contextlib.suppress(OSError):
                    os.chdir(cwd)
            os.umask(umask)
            sys.argv[:] = argv
            for number, handler in handlers.items():
                if handler is not None and signal.getsignal(number) is not handler:
                    with contextlib.suppress(OSError, ValueError, TypeError):
                        signal.signal(number, handler)


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # the working folder was removed under us: nothing to put back
        return None


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """``sys.stdout`` and descriptor 1 write to stderr while the block runs."""
    stdout = sys.stdout
    with contextlib.suppress(Exception):
        stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no descriptor 1 or 2 (closed by the caller): Python's level only
        saved = None
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        sys.stdout = stdout
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def linger(threads_before: set[threading.Thread]) -> list[threading.Thread]:
    """Non-daemon threads started since ``threads_before`` that still run.

    The interpreter waits for them at exit: one a port started and never ends would hang
    the run after its verdict.
    """
    return [t for t in threading.enumerate() if t not in threads_before and t.is_alive()
            and not t.daemon and t is not threading.current_thread()]


__all__ = ["ProcessExitCalled", "contained", "exits_refused", "linger", "real_exit"]
