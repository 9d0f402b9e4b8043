"""``introspect diff --nproc N`` through the real CLI: the verdict, the JSON, bad input."""

from __future__ import annotations

import json
import re

import pytest

from tests.cli.test_outputs import introspect_cli, only_line
from tests.parallel.conftest import PORTS


def test_the_cli_runs_a_megatron_port_on_2_ranks(tiny3):
    done = introspect_cli(["diff", "--model", str(tiny3), "--candidate",
                           f"{PORTS / 'megatron_bert.py'}:build_missing_all_reduce",
                           "--nproc", "2", "--json", "-"])
    assert done.returncode == 1, done.stderr.decode()
    document = json.loads(done.stdout)  # the ranks' prints never reach stdout
    assert document["first_divergence"]["layer"] == "encoder.layer.2"
    err = done.stderr.decode()
    assert "parity FAILS" in err and "an all-reduce left out" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["--nproc", "0", "--candidate", "port.py:build"], "--nproc takes a number of processes >= 1"),
    (["--nproc", "x", "--candidate", "port.py:build"], "--nproc takes a number of processes"),
    (["--nproc", "²", "--candidate", "port.py:build"], "--nproc takes a number written in ASCII"),
    (["--nproc", "100000", "--candidate", "port.py:build"],
     "--nproc 100000 is more ranks than this machine has"),
    (["--nproc", "2"], "--nproc runs a port on every rank: give --candidate"),
    (["--nproc", "2", "--candidate", "hf"], "--nproc runs a port on every rank"),
    (["--nproc", "2", "--candidate", "port.py:build", "--generate", "2"],
     "--nproc does not mix with --generate"),
    (["--nproc", "2", "--candidate", "port.py:build", "--nproc-timeout", "0"],
     "--nproc-timeout takes a number of seconds > 0"),
])
def test_bad_nproc_input_is_one_line_and_exit_2(argv, message):
    done = introspect_cli(["diff", "--model", "bert-tiny", *argv])
    assert done.returncode == 2
    line = only_line(done.stderr.decode())
    assert message in line and len(line) < 200


def test_a_rank_that_raises_is_one_line_and_exit_2(tiny3):
    done = introspect_cli(["diff", "--model", str(tiny3), "--candidate",
                           f"{PORTS / 'broken_ranks.py'}:build_raises", "--nproc", "2", "-q"])
    assert done.returncode == 2
    assert only_line(done.stderr.decode()).endswith(
        "rank 1 of 2: port '" + f"{PORTS / 'broken_ranks.py'}:build_raises' raised "
        "RuntimeError: rank 1 found no weights for its shard")


def test_a_rank_that_hangs_is_stopped_at_the_timeout(tiny3):
    import time

    start = time.monotonic()
    done = introspect_cli(["diff", "--model", str(tiny3), "--candidate",
                           f"{PORTS / 'broken_ranks.py'}:build_hangs", "--nproc", "2", "-q",
                           "--nproc-timeout", "15"])
    assert done.returncode == 2
    line = only_line(done.stderr.decode())
    # rank 0 waits for rank 1 at the barrier after its forward: both are still running
    assert re.search(r"rank 1 \([a-z ]+\) of 2 did not finish within 15 s", line), line
    assert time.monotonic() - start < 300
