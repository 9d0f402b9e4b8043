"""``python -m introspect`` for the tests, without paying five seconds of imports each time.

A fresh ``python -m introspect diff`` of a MiniLM port takes about ten seconds, five of them
importing torch and transformers, and the suite starts hundreds. Each pytest-xdist worker
keeps two zygotes (tests/zygote_server.py): processes that import those once and fork a
child per run. The child is the real CLI, run by ``runpy`` as ``python -m`` runs it, in a
process of its own: its own working folder, environment, standard streams, session and
random seeds; whatever a port changes dies with it. The two zygotes' string hashes are
seeded apart and runs alternate between them, so two runs that a test compares differ in
hash seed as two fresh processes do.

``run`` takes subprocess.run's arguments, and hands to subprocess.run whatever a zygote
cannot stand in for: another program, an environment that differs from the zygote's in a
variable read at import (only those introspect reads at run time may differ, and
PYTHONPATH), arguments that are bytes, streams
other than pipes, options it does not know, a second thread while one run is under way.
Tests about processes themselves (signals, timeouts of ranks, what a fresh process
imports, packaging) keep calling subprocess directly. INTROSPECT_TESTS_NO_ZYGOTE=1 sends
every run to subprocess.run, to compare.
"""

from __future__ import annotations

import atexit
import locale
import os
import pickle
import random
import select
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

SERVER = Path(__file__).with_name("zygote_server.py")
# Read by introspect (or by what it starts) only while it runs, never at import; and
# pytest's name of the test under way, which nothing reads.
RUN_TIME_VARIABLES = {"COLUMNS", "LINES", "NO_COLOR", "TERM", "CI", "SOURCE_DATE_EPOCH",
                      "PYTEST_CURRENT_TEST"}
KNOWN_OPTIONS = {"capture_output", "stdout", "stderr", "text", "encoding", "errors",
                 "timeout", "check", "cwd", "env", "input"}


def _stands_in(env: dict[str, str], base: dict[str, str]) -> bool:
    """Whether a child of a zygote started with ``base`` can run as a process started with
    ``env``: they differ only in variables read at run time, and in a PYTHONPATH (the
    child puts it on sys.path) with no site customization on it to run at start."""
    changed = {key for key in env.keys() | base.keys() if env.get(key) != base.get(key)}
    if "PYTHONPATH" in changed:
        if base.get("PYTHONPATH") or any(
                (Path(entry) / name).exists() for entry in _python_path(env)
                for name in ("sitecustomize.py", "usercustomize.py")):
            return False
        changed.discard("PYTHONPATH")
    return all(key in RUN_TIME_VARIABLES or key.startswith("INTROSPECT_") for key in changed)


def _python_path(env: dict[str, str]) -> list[str]:
    return [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]


class _Zygote:
    def __init__(self, hash_seed: int) -> None:
        self.env = dict(os.environ)
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log, cwd=tempfile.gettempdir(),
            env={**self.env, "PYTHONHASHSEED": str(hash_seed)})
        self.ready = False

    def alive(self) -> bool:
        return self.process.poll() is None

    def start(self) -> bool:
        """Wait for its imports; a zygote whose imports printed anything, or failed, is not
        used (a fresh process would print it on every run)."""
        if not self.ready:
            try:
                self.ready = self._answer(None) == "ready"
            except RuntimeError:  # its imports failed: a fresh process shows why
                return False
            self.log.seek(0)
            self.ready = self.ready and not self.log.read()
        return self.ready

    def run(self, request: dict, timeout: float | None) -> tuple[int, bool]:
        """The child's exit status, and whether it was killed at the timeout."""
        body = pickle.dumps(request)
        self.process.stdin.write(struct.pack("<Q", len(body)) + body)
        self.process.stdin.flush()
        pid = self._answer(None)
        deadline = None if timeout is None else time.monotonic() + timeout
        status = self._answer(deadline)
        if status is not None:
            return status, False
        try:
            os.killpg(pid, 9)
        except ProcessLookupError:
            pass
        return self._answer(None), True

    def _answer(self, deadline: float | None):
        """The next message, or None at the deadline."""
        stream = self.process.stdout
        if deadline is not None:
            ready, _, _ = select.select([stream], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
        head = stream.read(8)
        if len(head) < 8:
            raise RuntimeError("the tests' zygote ended")
        return pickle.loads(stream.read(struct.unpack("<Q", head)[0]))

    def close(self) -> None:
        if self.alive():
            self.process.stdin.close()
            self.process.wait()


_lock = threading.Lock()
_zygotes: list[_Zygote] = []
_turn = [0]


def _next_zygote() -> _Zygote | None:
    if not _zygotes:
        seeds = random.Random().sample(range(1, 2**32), 2)
        _zygotes.extend(_Zygote(seed) for seed in seeds)
        atexit.register(lambda: [zygote.close() for zygote in _zygotes])
    zygote = _zygotes[_turn[0] % 2]
    _turn[0] += 1
    return zygote if zygote.alive() and zygote.start() else None


def _decode(data: bytes, encoding: str, errors: str) -> str:
    """As subprocess reads a text stream: decoded, with universal newlines."""
    return data.decode(encoding, errors).replace("\r\n", "\n").replace("\r", "\n")


def run(args: list[str], **options: Any) -> subprocess.CompletedProcess:
    """subprocess.run(args, **options), by a zygote's fork where ``args`` is
    ``[sys.executable, "-m", "introspect", ...]`` and nothing else stands in the way."""
    env = options.get("env")
    env = dict(os.environ) if env is None else env
    piped = options.get("capture_output") or (
        options.get("stdout") == subprocess.PIPE
        and options.get("stderr") in (subprocess.PIPE, subprocess.STDOUT))
    usable = (os.name == "posix" and not os.environ.get("INTROSPECT_TESTS_NO_ZYGOTE")
              and all(isinstance(arg, (str, os.PathLike)) for arg in args)
              and list(map(os.fspath, args[:3])) == [sys.executable, "-m", "introspect"]
              and set(options) <= KNOWN_OPTIONS and piped)
    if not usable or not _lock.acquire(blocking=False):
        return subprocess.run(args, **options)
    try:
        zygote = _next_zygote()
        if zygote is None or not _stands_in(env, zygote.env):
            return subprocess.run(args, **options)
        return _forked(zygote, [os.fspath(arg) for arg in args], env, options)
    finally:
        _lock.release()


def _forked(zygote: _Zygote, args: list[str], env: dict[str, str],
            options: dict[str, Any]) -> subprocess.CompletedProcess:
    text = bool(options.get("text") or options.get("encoding") or options.get("errors"))
    encoding = options.get("encoding") or locale.getpreferredencoding(False)
    errors = options.get("errors") or "strict"
    with tempfile.TemporaryDirectory(prefix="introspect-launch-") as folder:
        streams = Path(folder)
        out = streams / "stdout"
        err = out if options.get("stderr") == subprocess.STDOUT else streams / "stderr"
        out.touch()
        err.touch()
        stdin = None
        if options.get("input") is not None:
            data = options["input"]
            if text:
                data = data.encode(encoding, errors)
            stdin = streams / "stdin"
            stdin.write_bytes(data)
        request = {"argv": args[3:], "env": env, "path": _python_path(env),
                   "cwd": os.path.abspath(options.get("cwd") or os.getcwd()),
                   "stdin": None if stdin is None else str(stdin),
                   "stdout": str(out), "stderr": str(err)}
        code, timed_out = zygote.run(request, options.get("timeout"))
        stdout: Any = out.read_bytes()
        stderr: Any = None if err == out else err.read_bytes()
    if text:
        stdout = _decode(stdout, encoding, errors)
        stderr = None if stderr is None else _decode(stderr, encoding, errors)
    if timed_out:
        raise subprocess.TimeoutExpired(args, options["timeout"], output=stdout, stderr=stderr)
    done = subprocess.CompletedProcess(args, code, stdout, stderr)
    if options.get("check"):
        done.check_returncode()
    return done
