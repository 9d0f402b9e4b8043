"""``introspect examples DIR`` writes the shipped examples into a new or empty folder, and
refuses anything else in one line with exit 2, writing nothing."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from introspect.cli import examples_cmd
from introspect.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def test_writes_every_example_into_a_new_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["examples"]) == 0
    shipped = {f for f in _files(ROOT / "examples") if "__pycache__" not in f}
    assert _files(tmp_path / "examples") == shipped
    assert (tmp_path / "examples" / "ci" / "my_port.py").read_bytes() == \
        (ROOT / "examples" / "ci" / "my_port.py").read_bytes()
    err = capsys.readouterr().err
    assert err.startswith("introspect: wrote ") and "faulty_port.py:build" in err
    assert [p.name for p in tmp_path.iterdir()] == ["examples"]  # no temp folder left


def test_an_empty_folder_is_filled_and_quiet_says_nothing(tmp_path, capsys):
    target = tmp_path / "mine"
    target.mkdir()
    assert main(["examples", str(target), "--quiet"]) == 0
    assert (target / "generation" / "gpt2_cached.py").is_file()
    assert capsys.readouterr().err == ""


def test_a_folder_with_files_or_a_file_is_refused_in_one_line(tmp_path, capsys):
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    assert main(["examples", str(full)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists and is not empty" in err
    assert _files(full) == {"notes.txt"}
    (tmp_path / "a-file").write_text("x")
    assert main(["examples", str(tmp_path / "a-file")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert main(["examples", str(tmp_path / "missing" / "deeper")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_failed_copy_leaves_nothing(tmp_path, capsys, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(examples_cmd.shutil, "copytree", full_disk)
    assert main(["examples", str(tmp_path / "examples")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing was written" in err
    assert list(tmp_path.iterdir()) == []


def test_an_empty_folder_keeps_its_mode(tmp_path):
    # it was left at 0755 (the umask's mode): a private folder opened to every user
    private = tmp_path / "private"
    private.mkdir()
    private.chmod(0o700)
    assert main(["examples", str(private), "-q"]) == 0
    assert (private / "ci" / "my_port.py").is_file()
    assert private.stat().st_mode & 0o777 == 0o700
    new = tmp_path / "new"
    old_mask = os.umask(0o022)
    try:
        assert main(["examples", str(new), "-q"]) == 0
    finally:
        os.umask(old_mask)
    assert new.stat().st_mode & 0o777 == 0o755  # a new folder: what mkdir would give
