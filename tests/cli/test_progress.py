"""Progress: --verbose prints each step with its time; pipes and CI get silence."""

from __future__ import annotations

from introspect.cli.main import main


def test_verbose_prints_steps_with_times(capsys):
    assert main(["trace", "--model", "bert-tiny", "--format", "csv", "-v"]) == 0
    err = capsys.readouterr().err
    assert "introspect: loading bert-tiny (base, sdpa): " in err
    assert "introspect: tracing and propagating shapes: " in err and " s\n" in err


def test_quiet_prints_nothing_on_stderr(capsys):
    assert main(["trace", "--model", "bert-tiny", "--format", "csv", "-q"]) == 0
    assert capsys.readouterr().err == ""


def test_default_is_silent_when_not_a_terminal(capsys):
    assert main(["trace", "--model", "bert-tiny", "--format", "csv"]) == 0
    err = capsys.readouterr().err
    assert "tracing and propagating shapes" not in err  # no spinner in a pipe
    assert "random weights" in err  # notices still reach the user
