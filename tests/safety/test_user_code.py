"""User code cannot end, hang, print into or move the run (issue 34, R2, R6 and the
medium cases): ports and losses in tests/safety/port_files/misbehaves.py, through the CLI.

Each misdeed ends in one line on stderr and exit 2, or is undone after the user code ran.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from introspect.cli.main import main
from tests import launch
from tests.refusals import shows

PORTS = Path(__file__).resolve().parent / "port_files"
MISBEHAVES = PORTS / "misbehaves.py"
ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1"}


def only_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


def diff(name: str, *options: str) -> list[str]:
    return ["diff", "--model", "bert-tiny", "-q", "--candidate", f"{MISBEHAVES}:{name}",
            *options]


def cli(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return launch.run([sys.executable, "-m", "introspect", *argv], capture_output=True,
                      text=True, timeout=timeout, env=ENV, cwd=ROOT)


# --- R2: os._exit in user code is exit 2 with one line, never 0 or a bare 1 -------------

EXITS = {
    "os_exit_0": "called os._exit(0) in its build; no verdict",
    "os_exit_1": "called os._exit(1) in its build; no verdict",
    "posix_exit_0": "called os._exit(0) in its build; no verdict",
    "forward_os_exit_0": "called os._exit(0) in its forward, while the diff ran it",
}


@pytest.mark.parametrize("builder, message", EXITS.items(), ids=list(EXITS))
def test_os_exit_in_a_port_is_exit_2_naming_it(builder, message, capsys):
    assert main(diff(builder)) == 2
    line = only_line(capsys.readouterr().err)
    spec = f"{MISBEHAVES}:{builder}"
    assert line.startswith("introspect diff: error: port '") and shows(spec, line)
    assert message in line and len(line) < 200


def test_os_exit_0_through_the_real_cli_is_exit_2_with_nothing_on_stdout():
    done = cli(*diff("os_exit_0"))
    assert done.returncode == 2 and done.stdout == ""
    assert "called os._exit(0) in its build" in only_line(done.stderr)


def test_os_exit_at_a_generation_step_is_exit_2(capsys):
    assert main(["diff", "--model", "gpt2", "--head", "causal-lm", "-q", "--text", "The cat",
                 "--candidate", f"{MISBEHAVES}:exits_at_step_3", "--generate", "3"]) == 2
    assert "called os._exit(0) in its forward" in only_line(capsys.readouterr().err)


@pytest.mark.parametrize("loss, message", [
    ("loss_os_exit_0", "called os._exit(0) while the backward diff ran it"),
    ("loss_interrupts", "raised KeyboardInterrupt while the backward diff ran it"),
])
def test_a_loss_that_exits_or_interrupts_is_exit_2_naming_the_loss(loss, message, capsys):
    spec = f"{MISBEHAVES}:{loss}"
    assert main(["diff", "--model", "bert-tiny", "-q", "--backward", "--loss", spec]) == 2
    line = only_line(capsys.readouterr().err)
    assert line.startswith("introspect diff: error: --loss '") and shows(spec, line)
    assert message in line and len(line) < 200


def test_a_guarded_fork_still_ends_with_its_own_exit():
    """A child forked while the guard is on (a multiprocessing worker) exits as it must."""
    from introspect.models.guards import exits_refused

    with exits_refused():
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 7
    with pytest.raises(SystemExit):  # and the guard is gone afterwards
        raise SystemExit


def test_an_internal_error_is_not_blamed_on_user_code(monkeypatch, capsys):
    import introspect.cli.diff_cmd as diff_cmd

    def broken(*args, **kwargs):
        raise KeyError("reference_node")

    monkeypatch.setattr(diff_cmd, "compute_diff", broken)
    assert main(["diff", "--model", "bert-tiny", "-q"]) == 2
    line = only_line(capsys.readouterr().err)
    assert line.startswith("introspect diff: error: internal error: introspect raised "
                           "KeyError: 'reference_node'; no verdict (a bug")
    assert "code it ran" not in line


# --- R6: a thread that never ends does not hang the run -------------------------------

def test_a_port_thread_that_never_ends_does_not_hang_the_run():
    done = cli(*diff("starts_a_thread"), timeout=240)
    assert done.returncode == 0, done.stderr
    assert "parity holds" in done.stdout


# --- Medium: stdout, cwd, umask, signals ----------------------------------------------

def test_a_port_that_prints_leaves_json_on_stdout_pure():
    done = cli(*diff("prints", "--json", "-"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["passed"] is True
    assert "building the port" in done.stderr and "forward called" in done.stderr
    assert "raw write" in done.stderr


def test_a_loss_that_prints_leaves_json_on_stdout_pure():
    done = cli("diff", "--model", "bert-tiny", "-q", "--backward", "--loss",
               f"{MISBEHAVES}:loss_prints", "--json", "-")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["passed"] is True
    assert "loss is being computed" in done.stderr


def test_a_port_that_changes_folder_does_not_move_the_outputs(tmp_path, monkeypatch, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("PORT_FOLDER", str(elsewhere))
    monkeypatch.chdir(tmp_path)
    assert main(diff("changes_folder", "--out", "rep", "--json", "r.json")) == 0
    assert (tmp_path / "rep" / "diff.json").is_file() and (tmp_path / "r.json").is_file()
    assert list(elsewhere.iterdir()) == []
    assert Path.cwd() == tmp_path


def test_a_port_that_sets_umask_777_does_not_make_unreadable_reports(tmp_path, capsys):
    out = tmp_path / "rep"
    umask = os.umask(0o022)
    try:
        assert main(diff("sets_umask", "--out", str(out))) == 0
        assert os.umask(0o022) == 0o022  # put back after the build
    finally:
        os.umask(umask)
    assert (out / "diff.json").stat().st_mode & 0o777 == 0o644


def test_a_port_s_signal_handlers_and_argv_do_not_stick(capsys):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    argv = list(sys.argv)
    assert main(diff("sets_signal_handlers")) == 0
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    assert sys.argv == argv


# --- Bounds ----------------------------------------------------------------------------

@pytest.mark.parametrize("wait", ["inf", "1e309", "nan", "7200"])
def test_a_lock_wait_that_cannot_end_is_refused_up_front(wait, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("INTROSPECT_LOCK_WAIT", wait)
    assert main(["trace", "--model", "bert-tiny", "-o", str(tmp_path / "t.csv")]) == 2
    assert "INTROSPECT_LOCK_WAIT=" in only_line(capsys.readouterr().err)
    assert not (tmp_path / "t.csv").exists()


GENERATE = ["diff", "--head", "causal-lm", "-q", "--candidate", "hf", "--text", "The cat"]


@pytest.mark.parametrize("argv, message", [
    (["--model", "gpt2", "--generate", "1000000000"], "more than the 4096 one diff compares"),
    (["--model", "gpt2", "--generate", "2000"], "past the 1024 positions of the reference; "
                                                "generate at most"),
    (["--model", "bert-tiny", "--head", "masked-lm", "--generate", "2"],
     "the reference (BertForMaskedLM) is not a causal language model"),
])
def test_generate_that_cannot_end_well_is_refused_up_front(argv, message, capsys):
    assert main([*GENERATE, *argv]) == 2
    assert message in only_line(capsys.readouterr().err)
