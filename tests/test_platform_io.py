"""introspect runs where Linux's ``fcntl`` and ``renameat2`` are missing (macOS has no
renameat2, Windows neither): locks and the report folder's swap degrade to methods that
keep their guarantees. The CLI is run with both made unavailable by a sitecustomize."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from introspect import files, platform_io

ROOT = Path(__file__).resolve().parents[1]

# Loaded by Python at start-up from the first folder of PYTHONPATH: `import fcntl` fails, and
# libc has no renameat2, as on a system without them.
BLOCKER = textwrap.dedent('''
    import ctypes
    import sys


    class _NoFcntl:
        def find_spec(self, name, path=None, target=None):
            if name == "fcntl":
                raise ImportError("No module named 'fcntl'")
            return None


    sys.modules.pop("fcntl", None)
    sys.meta_path.insert(0, _NoFcntl())


    class _CDLL(ctypes.CDLL):
        def __getattr__(self, name):
            if name == "renameat2":
                raise AttributeError(name)
            return super().__getattr__(name)


    ctypes.CDLL = _CDLL
''')


@pytest.fixture
def without_fcntl(tmp_path):
    """An environment for subprocesses in which fcntl and renameat2 do not exist."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "INTROSPECT_LOCK_WAIT": "0.5"}
    return env, work


def _run(env, work, *argv, status=0):
    done = subprocess.run([sys.executable, *argv], cwd=work, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == status, (argv, done.stdout[-2000:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr
    return done


def test_the_blocker_takes_both_away_and_the_fallbacks_are_chosen(without_fcntl):
    env, work = without_fcntl
    done = _run(env, work, "-c", textwrap.dedent("""
        from introspect import platform_io
        try:
            import fcntl
            print("fcntl present")
        except ImportError:
            print("no fcntl")
        print(platform_io.lock_method(), "/", platform_io.swap_method())
    """))
    lock = "lockf" if hasattr(os, "lockf") else "msvcrt"  # Windows: msvcrt
    assert done.stdout.splitlines() == ["no fcntl", f"{lock} / three renames"]


def test_the_cli_writes_report_sets_and_captures_without_them(without_fcntl):
    env, work = without_fcntl
    _run(env, work, "-m", "introspect", "diff", "--model", "bert-tiny", "--out", "report",
         "--quiet")
    (work / "report" / "mine.txt").write_text("kept")
    _run(env, work, "-m", "introspect", "diff", "--model", "bert-tiny", "--out", "report",
         "--quiet")  # the second run swaps the folder: three renames
    report = {p.name for p in (work / "report").iterdir()}
    assert {"diff.json", "diff.md", "diff.html", "junit.xml", "mine.txt"} <= report
    assert (work / "report" / "mine.txt").read_text() == "kept"
    _run(env, work, "-m", "introspect", "capture", "--model", "bert-tiny", "-o", "ref.safetensors")
    assert {p.name for p in work.iterdir()} == {"report", "ref.safetensors",
                                               "ref.index.json", "ref.index.csv"}


def test_a_second_writer_waits_then_refuses_without_fcntl(without_fcntl):
    env, work = without_fcntl
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys
        from pathlib import Path
        from introspect import files
        with files.target_lock(Path.cwd() / "ref.safetensors", "ref.safetensors"):
            print("held", flush=True)
            sys.stdin.readline()
    """)], cwd=work, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        done = _run(env, work, "-m", "introspect", "capture", "--model", "bert-tiny", "-o",
                    "ref.safetensors", "--quiet", status=2)
        lines = [line for line in done.stderr.splitlines() if "Warning" not in line
                 and not line.startswith("  from ")]  # filelock's own note, in HF's import
        assert len(lines) == 1 and "another introspect run is writing" in lines[0], lines
        assert not (work / "ref.safetensors").exists()
    finally:
        holder.communicate("\n", timeout=60)
    assert holder.returncode == 0
    _run(env, work, "-m", "introspect", "capture", "--model", "bert-tiny", "-o",
         "ref.safetensors")  # the lock is free again


@pytest.mark.skipif(not hasattr(os, "lockf"), reason="a POSIX record lock (not on Windows)")
def test_the_record_lock_refuses_a_second_holder_in_the_same_process(tmp_path, monkeypatch):
    monkeypatch.setattr(platform_io, "_lock_module", lambda name: None)
    assert platform_io.lock_method() == "lockf"
    path = tmp_path / ".lock"
    first = os.open(path, os.O_RDWR | os.O_CREAT)
    second = os.open(path, os.O_RDWR)
    try:
        assert platform_io.try_lock(first, str(path))
        assert not platform_io.try_lock(second, str(path))  # lockf alone would say yes
        platform_io.unlock(str(path))
        os.close(first)
        assert platform_io.try_lock(second, str(path))
    finally:
        platform_io.unlock(str(path))
        os.close(second)


def test_three_renames_swap_the_folders_and_undo_a_failed_second(tmp_path, monkeypatch):
    monkeypatch.setattr(platform_io, "_renameat2", lambda: None)
    new, current, aside = tmp_path / "new", tmp_path / "current", tmp_path / ".aside"
    new.mkdir()
    (new / "a").write_text("new")
    current.mkdir()
    (current / "a").write_text("old")
    platform_io.exchange_folders(new, current, aside)
    assert (current / "a").read_text() == "new" and (new / "a").read_text() == "old"
    assert not aside.exists()

    real_rename = os.rename

    def fail_second(source, destination):
        if Path(source) == new:
            raise OSError(5, "Input/output error")
        real_rename(source, destination)

    monkeypatch.setattr(platform_io.os, "rename", fail_second)
    with pytest.raises(OSError):
        platform_io.exchange_folders(new, current, aside)
    assert (current / "a").read_text() == "new" and not aside.exists()  # put back


def test_a_hard_link_is_to_the_link_itself_not_its_target(tmp_path, monkeypatch):
    (tmp_path / "target").write_text("x")
    (tmp_path / "link").symlink_to("target")
    platform_io.hard_link(tmp_path / "link", tmp_path / "copy")
    assert (tmp_path / "copy").is_symlink()
    monkeypatch.setattr(platform_io.os, "supports_follow_symlinks", set())  # as on Windows
    platform_io.hard_link(tmp_path / "target", tmp_path / "plain")
    assert (tmp_path / "plain").read_text() == "x"


def test_files_takes_its_primitives_from_platform_io():
    source = (ROOT / "introspect" / "files.py").read_text()
    assert "import fcntl" not in source and "ctypes" not in source
    assert "os.link(" not in source  # Windows' os.link takes no follow_symlinks
    assert files.try_lock is platform_io.try_lock
