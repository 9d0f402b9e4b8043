"""benchmarks.modes: the generation and backward rows, paired ratios on one thread."""

from __future__ import annotations

import pytest
import torch

from benchmarks import modes
from benchmarks.records import OK


def test_backward_row_is_a_paired_ratio_on_one_thread():
    threads = torch.get_num_threads()
    seen = []
    rows = modes.mode_rows(steps=(), models=("bert-tiny",), progress=seen.append, size=(2, 9))
    assert torch.get_num_threads() == threads  # put back
    row, own = rows  # with node tables, then from each side's own backward
    assert row.status == OK and row.task == modes.BACKWARD and row.model == "bert-tiny"
    assert own.task == modes.BACKWARD_OWN and own.baseline_seconds == row.baseline_seconds
    for r in rows:
        assert r.seconds > 0 and r.baseline_seconds > 0
        assert r.ratio == pytest.approx(r.seconds / r.baseline_seconds)
        assert "1 thread" in r.note and "passed" in r.note
    assert "nothing recorded" in own.note
    assert seen == ["modes: diff --backward, bert-tiny 2x9"]
    table = modes.modes_table(rows)
    assert "| diff --backward | bert-tiny | 2 x 9 |" in table
    assert "| diff --backward, no report (nodes=False) | bert-tiny | 2 x 9 |" in table


@pytest.mark.slow
def test_generation_row_counts_steps():
    (row,) = modes.generation_rows(steps=(3,), progress=lambda _: None)
    assert row.status == OK and row.seq == 3 and "passed" in row.note
    assert "3 steps" in modes.modes_table([row])
