"""--candidate-dump with a folder per rank: shards written as a TP port's ranks write them
(each rank's .npy files under its own names), joined by value. No process is started."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from introspect.cli.main import main

# Reference nodes a Megatron port holds sharded along the features (column-parallel) and
# as partial sums (row-parallel, before the all-reduce and its bias).
COLUMN = ("_query", "_key", "_value", "intermediate_dense", "intermediate_act_fn")
ROW = ("attention_output_dense", "output_dense")
TEXTS = ("--text", "I love cats!", "--text", "He hates pineapple pizza.")  # tokenize()'s


@pytest.fixture(scope="module")
def reference_capture(tiny3_loaded):
    from introspect.dump import capture

    reference, inputs = tiny3_loaded
    return capture(reference.model, inputs)


def write_rank_dumps(folder: Path, taken, change=None) -> Path:
    """rank0/ and rank1/, each a folder of .npy with order.txt; ``change(rank, name, value)``
    may alter what a rank writes."""
    for rank in range(2):
        out = folder / f"rank{rank}"
        out.mkdir(parents=True)
        names = []
        np.save(out / "input_ids.npy", taken.inputs["input_ids"].numpy())
        for i, entry in enumerate(taken.entries):
            value = taken.values[entry.name].numpy()
            if entry.name.endswith(COLUMN):
                value = np.array_split(value, 2, axis=-1)[rank]
            elif entry.name.endswith(ROW) and "self" not in entry.name:
                part = value * np.float32(0.25)
                value = part if rank == 0 else value - part
            if change is not None:
                value = change(rank, entry.name, value.copy())
            name = f"t{i:03d}"
            np.save(out / f"{name}.npy", value)
            names.append(name)
        (out / "order.txt").write_text("\n".join(["input_ids", *names]) + "\n")
    return folder


def test_rank_dumps_are_joined_and_pass(tmp_path, reference_capture, tiny3_loaded):
    from introspect.diff.parallel.rank_dumps import diff_rank_dumps

    folder = write_rank_dumps(tmp_path / "dumps", reference_capture)
    result = diff_rank_dumps(reference_capture, folder,
                             reference_model=tiny3_loaded[0].model)
    assert result.passed, result.first_divergence
    notes = {r.reference_node: r.note for r in result.rows if r.reference_node}
    assert notes["encoder_layer_1_attention_self_query"].startswith(
        "the 2 ranks' shards concatenated along dim 2")
    assert notes["encoder_layer_1_output_dense"].startswith("the sum of the 2 ranks'")
    assert notes["encoder_layer_1_output_layer_norm"].startswith("the same on all 2 ranks")
    assert len(notes) == len(reference_capture.entries)


def test_a_fault_on_rank_1_is_blamed_on_rank_1(tmp_path, reference_capture, tiny3_loaded):
    from introspect.diff.parallel.rank_dumps import diff_rank_dumps

    later = {e.name for e in reference_capture.entries
             if e.index >= reference_capture.entry("encoder_layer_1_intermediate_dense").index}

    def wrong_shard(rank, name, value):  # rank 1's shard is off, and all that follows
        if rank == 1 and name in later:
            value[..., :3] *= 1.1
        return value

    folder = write_rank_dumps(tmp_path / "dumps", reference_capture, wrong_shard)
    result = diff_rank_dumps(reference_capture, folder, reference_model=tiny3_loaded[0].model)
    divergence = result.first_divergence
    assert divergence.reference_node == "encoder_layer_1_intermediate_dense"
    assert any(h.startswith("the fault is on rank 1 (") for h in divergence.hints), \
        divergence.hints


def test_shards_in_the_wrong_order_are_hinted(tmp_path, reference_capture, tiny3_loaded):
    from introspect.diff.parallel.rank_dumps import diff_rank_dumps

    def swapped(rank, name, value):  # an all-gather concatenated rank 1's half first
        if name == "encoder_layer_2_attention_output_layer_norm":
            value = np.concatenate(np.array_split(value, 2, axis=-1)[::-1], axis=-1)
        return value

    folder = write_rank_dumps(tmp_path / "dumps", reference_capture, swapped)
    result = diff_rank_dumps(reference_capture, folder, reference_model=tiny3_loaded[0].model)
    divergence = result.first_divergence
    assert divergence.reference_node == "encoder_layer_2_attention_output_layer_norm"
    assert divergence.hints[0].startswith("shards concatenated in the wrong order: the value "
                                          "cut into 2 blocks along dim 2 and put back in the "
                                          "order (1, 0) matches")


def test_the_cli_joins_a_folder_of_rank_dumps(tmp_path, reference_capture, tiny3, capsys):
    folder = write_rank_dumps(tmp_path / "dumps", reference_capture)
    assert main(["diff", "--model", str(tiny3), *TEXTS, "--candidate-dump", str(folder),
                 "-q"]) == 0
    assert "parity holds" in capsys.readouterr().out


def test_a_rank_missing_from_the_folder_is_one_line(tmp_path, reference_capture, tiny3, capsys):
    folder = write_rank_dumps(tmp_path / "dumps", reference_capture)
    (folder / "rank1").rename(folder / "rank2")
    assert main(["diff", "--model", str(tiny3), *TEXTS, "--candidate-dump", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "rank 1 is missing" in err
