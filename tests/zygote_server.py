"""A zygote for the tests' CLI runs: import torch, transformers and introspect once, then
fork one child per request, each of which runs ``python -m introspect`` as a fresh process
would. Started and spoken to by tests/launch.py; see there for why and for what it is not.

Protocol, over this process's standard input and output (both taken over at start, so that
nothing printed while importing can mix with it): each message is 8 bytes of length, then a
pickle. A request is a dict (argv, env, path: PYTHONPATH's entries, cwd, stdin, stdout,
stderr: paths); the answer is the child's process id as soon as it runs, then its exit
status as subprocess reports it (negative: the signal that ended it).
"""

from __future__ import annotations

import os
import pickle
import struct
import sys

# Take the protocol's pipes off the standard streams before anything can print to them.
REQUESTS = os.dup(0)
ANSWERS = os.dup(1)
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
os.dup2(2, 1)
del sys.path[0]  # this file's folder (tests/): a child puts its own working folder there

# What a `python -m introspect diff` of a BERT port imports (5 of its 10 seconds). Nothing
# is run: a process that has run torch's OpenMP threads cannot fork safely.
import torch  # noqa: E402,F401
import transformers  # noqa: E402,F401
import transformers.activations  # noqa: E402,F401
import transformers.masking_utils  # noqa: E402,F401
import transformers.models.bert.modeling_bert  # noqa: E402,F401

import introspect.cli.main  # noqa: E402,F401
import introspect.diff.api  # noqa: E402,F401
import introspect.report  # noqa: E402,F401
import introspect.run.spill  # noqa: E402,F401


def _read(fd: int):
    head = _exactly(fd, 8)
    return None if head is None else pickle.loads(_exactly(fd, struct.unpack("<Q", head)[0]))


def _exactly(fd: int, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _write(fd: int, value) -> None:
    body = pickle.dumps(value)
    os.write(fd, struct.pack("<Q", len(body)) + body)


def _exit_code(code) -> int:
    """What the interpreter makes of ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _child(request: dict) -> None:
    """Become ``python -m introspect ARGV`` in the request's folder, environment and
    streams, in a session of its own (a timeout kills what it started), then exit as the
    interpreter does: wait for threads, run atexit, flush."""
    import atexit
    import random
    import runpy
    import threading
    import traceback

    os.setsid()
    os.close(REQUESTS)
    os.close(ANSWERS)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.dup2(os.open(request["stdin"] or os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_APPEND), fd)
    sys.path[0:0] = [os.getcwd(), *request["path"]]  # as `python -m` with PYTHONPATH
    sys.argv = ["-m", *request["argv"]]
    # A fresh process draws its seeds anew; forks of one zygote would share them.
    random.seed()
    torch.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    code = 0
    try:
        runpy.run_module("introspect", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException:  # noqa: BLE001 - printed as the interpreter prints it
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def serve() -> None:
    while (request := _read(REQUESTS)) is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        _write(ANSWERS, pid)
        _, status = os.waitpid(pid, 0)
        _write(ANSWERS, os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    _write(ANSWERS, "ready")
    serve()
