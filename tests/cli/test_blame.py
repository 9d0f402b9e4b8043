"""An unexpected error names whose it is: the user's code, or a bug of ours met while the
user's code ran. A port holding MiniLM's weights in one flat parameter got "code it ran
(port.py:build) raised IndexError" for an index our pairing took past the end."""

from __future__ import annotations

from pathlib import Path

from introspect.cli.main import main

PORT = Path(__file__).resolve().parents[1] / "adversarial" / "ports" / "bias_elsewhere.py"


def test_our_bug_while_a_port_ran_is_an_internal_error(monkeypatch, capsys):
    import operator

    from introspect.diff.modules import pairing

    # an index past the end taken in introspect's own frame (no frame of this file)
    monkeypatch.setattr(pairing, "_key", operator.itemgetter(10 ** 9))
    got = main(["diff", "--model", "bert-tiny", "--head", "base", "--candidate",
                f"{PORT}:before"])
    err = capsys.readouterr().err
    assert got == 2
    assert "internal error: introspect raised IndexError" in err, err
    assert "code it ran" not in err


def test_the_ports_own_error_is_the_ports(tmp_path, capsys):
    port = tmp_path / "raising_port.py"
    port.write_text(
        "import torch\n"
        "class Broken(torch.nn.Module):\n"
        "    def forward(self, input_ids, attention_mask=None, token_type_ids=None):\n"
        "        return {}['last_hidden_state']\n"
        "def build(reference):\n"
        "    return Broken()\n")
    got = main(["diff", "--model", "bert-tiny", "--head", "base", "--candidate",
                f"{port}:build"])
    err = capsys.readouterr().err
    assert got == 2
    assert "KeyError" in err and "internal error" not in err, err
