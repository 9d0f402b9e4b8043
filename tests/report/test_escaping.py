"""Names from the user's side (a checkpoint folder, a port's label) are escaped in every
human-readable report: a folder named like an HTML tag stays text."""

from __future__ import annotations

import pytest

from introspect.cli.main import main

EVIL = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def evil_checkpoint(tiny_models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt") / EVIL
    tiny_models("base", "sdpa").model.save_pretrained(folder)
    return folder


def test_folder_name_is_escaped_in_markdown_and_html(evil_checkpoint, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["diff", "--model", "bert-tiny", "--candidate", str(evil_checkpoint),
                 "--out", str(out), "-q"]) == 0
    capsys.readouterr()
    for name in ("diff.md", "diff.html"):
        text = (out / name).read_text()
        assert EVIL not in text, name
        assert "&lt;img src=x onerror=alert(1)&gt;" in text, name
