"""Tensor-parallel ports on 2 ranks (gloo, CPU) against the one-process HF reference.

Each run starts two fresh processes (seconds of imports each), so every port runs once per
session (``runs``) and the tests read its result.
"""

from __future__ import annotations

import pytest

from tests.parallel.conftest import PORTS

MEGATRON = PORTS / "megatron_bert.py"


@pytest.fixture(scope="module")
def runs(tiny3_loaded):
    import introspect

    reference, inputs = tiny3_loaded
    cache = {}

    def run(spec: str):
        if spec not in cache:
            cache[spec] = introspect.diff(reference, spec, inputs, nproc=2)
        return cache[spec]

    return run


def test_the_correct_megatron_port_passes(runs):
    result = runs(f"{MEGATRON}:build")
    assert result.passed, result.first_divergence
    assert result.parallel.nproc == 2 and len(result.parallel.forward_seconds) == 2
    joins = result.parallel.joins
    # the column-parallel query is a concatenation, the row-parallel product a sum, the
    # LayerNorm after the all-reduce the same on both ranks
    assert "concatenated along dim 2" in joins["linear"]
    assert joins["linear_3"].startswith("the sum")
    assert joins["layers_0_attention_layer_norm"].startswith("the same on all 2 ranks")
    paired = {r.reference_node for r in result.rows if r.reference_node}
    assert {f"encoder_layer_{i}_attention_self_query" for i in range(3)} <= paired
    assert "encoder_layer_2_output_layer_norm" in paired


def test_spawned_ranks_give_the_same_verdict(tiny3_loaded, runs):
    """As torchrun starts them (fresh interpreters, the reference read from a file)."""
    from introspect.diff.parallel import diff_parallel

    reference, inputs = tiny3_loaded
    result = diff_parallel(reference, f"{MEGATRON}:build", inputs, 2, start_method="spawn")
    assert result.passed, result.first_divergence
    assert result.parallel.joins == runs(f"{MEGATRON}:build").parallel.joins


def test_a_missing_all_reduce_fails_in_layer_2_with_the_hint(runs):
    result = runs(f"{MEGATRON}:build_missing_all_reduce")
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == "encoder.layer.2"
    assert divergence.module == "encoder.layer.2.attention.output.dense"
    assert divergence.hints[0].startswith("an all-reduce left out")
    assert not any("bias added on every rank" in h for h in divergence.hints)
    layers = result.layers.set_index("layer")
    assert layers.loc["encoder.layer.1", "passed"] and not layers.loc["encoder.layer.2", "passed"]


def test_a_bias_added_on_every_rank_fails_with_the_hint(runs):
    result = runs(f"{MEGATRON}:build_bias_before_sum")
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.module == "encoder.layer.1.output.dense"
    assert any(h.startswith("a bias added on every rank before the sum") for h in divergence.hints)
    assert not any("all-reduce left out" in h for h in divergence.hints)


def test_shards_gathered_in_the_wrong_order_are_hinted(runs):
    result = runs(f"{MEGATRON}:build_gathered_in_reverse")
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.module == "encoder.layer.0.attention.output.dense"
    assert divergence.hints[0].startswith(
        "shards concatenated in the wrong order: cat, which layers_0_attention_dense_dense "
        "reads, holds scaled_dot_product_attention's values"), divergence.hints
    # the gathered shards were recorded as the all-gather's own nodes
    assert any(j.startswith("the same on all 2 ranks") for k, j in result.parallel.joins.items()
               if k.startswith("getitem"))


def test_a_dtensor_port_passes(runs):
    result = runs(f"{PORTS / 'dtensor_bert.py'}:build")
    assert result.passed, result.first_divergence
    joins = result.parallel.joins
    assert any("DTensor Shard(2)" in j for j in joins.values())  # ColwiseParallel's output
    assert any("DTensor Replicate" in j for j in joins.values())  # RowwiseParallel's
    paired = {r.reference_node for r in result.rows if r.reference_node}
    assert "encoder_layer_2_attention_self_value" in paired


def test_a_rank_that_raises_is_named(tiny3_loaded):
    import introspect
    from introspect.errors import InputError

    reference, inputs = tiny3_loaded
    with pytest.raises(InputError, match=r"^rank 1 of 2: port .* raised RuntimeError: rank 1 "
                                         "found no weights"):
        introspect.diff(reference, f"{PORTS / 'broken_ranks.py'}:build_raises", inputs, nproc=2)


def test_a_rank_that_exits_ends_the_run_without_a_hang(tiny3_loaded):
    import time

    import introspect
    from introspect.errors import InputError

    reference, inputs = tiny3_loaded
    start = time.monotonic()
    with pytest.raises(InputError, match=r"^rank 1 of 2 exited with code 7"):
        introspect.diff(reference, f"{PORTS / 'broken_ranks.py'}:build_exits", inputs, nproc=2)
    assert time.monotonic() - start < 300  # rank 0, waiting on rank 1, was killed


@pytest.mark.parametrize("nproc", [0, -1, "two", True])
def test_a_bad_nproc_is_refused(tiny3_loaded, nproc):
    import introspect
    from introspect.errors import InputError

    reference, inputs = tiny3_loaded
    with pytest.raises(InputError, match="nproc takes a number of processes"):
        introspect.diff(reference, f"{MEGATRON}:build", inputs, nproc=nproc)


def test_a_model_is_not_a_port(tiny3_loaded):
    import introspect
    from introspect.errors import InputError

    reference, inputs = tiny3_loaded
    with pytest.raises(InputError, match="built on every rank"):
        introspect.diff(reference.model, reference.model, inputs, nproc=2)
    with pytest.raises(InputError, match="top level of a file"):
        introspect.diff(reference, lambda ref: ref.model, inputs, nproc=2)


OUTPUTS = PORTS / "rank_outputs.py"


def test_every_rank_s_outputs_are_compared_with_the_reference(runs):
    result = runs(f"{MEGATRON}:build")
    rows = {r.candidate_output: r for r in result.output_rows}
    # the port returns a tuple: its outputs pair with HF's by shape
    assert set(rows) == {"output_0@rank0", "output_0@rank1", "output_1@rank0", "output_1@rank1"}
    assert {r.reference_output for r in rows.values()} == {"last_hidden_state", "pooler_output"}
    assert all(r.status == "ok" for r in rows.values())


def test_a_rank_whose_output_is_cut_short_fails_naming_it(runs):
    """Rank 1 returns last_hidden_state[:, :-1]: no node of rank 0's graph holds it."""
    result = runs(f"{OUTPUTS}:build_shorter")
    assert not result.passed
    assert result.verdict == "parity FAILS in the forward"
    assert "rank 1's output last_hidden_state is (2, 7, 128), rank 0's (2, 8, 128)" in result.notes


def test_an_output_one_rank_leaves_out_fails_naming_it(runs):
    result = runs(f"{OUTPUTS}:build_missing")
    assert not result.passed
    assert "rank 1 returns no output pooler_output, which rank 0 returns" in result.notes


def test_nan_on_one_rank_fails_naming_it(runs):
    result = runs(f"{OUTPUTS}:build_nan")
    assert not result.passed
    assert any(n.startswith("rank 1's output last_hidden_state differs from the reference's")
               and "NaN" in n for n in result.notes), result.notes
    assert not any("rank 0's" in n for n in result.notes)
    assert runs(f"{OUTPUTS}:build_same").passed  # the same wrapper, every rank right


def test_a_vocab_parallel_dtensor_embedding_passes(runs):
    """RowwiseParallel on the nn.Embedding: _MaskPartial's lookups summed into the whole."""
    result = runs(f"{PORTS / 'dtensor_vocab_bert.py'}:build")
    assert result.passed, result.first_divergence
    words = next(r for r in result.rows
                 if r.reference_node == "embeddings_word_embeddings")
    assert words.candidate_node == "words"
    assert result.parallel.joins["words"] == \
        "the sum of the 2 ranks' partial values (DTensor Partial)"


def test_a_vocab_parallel_embedding_with_its_rows_swapped_fails_there(runs):
    result = runs(f"{PORTS / 'dtensor_vocab_bert.py'}:build_rows_swapped")
    assert not result.passed
    assert result.first_divergence.layer == "embeddings"


def test_a_rank_that_ends_its_process_with_0_is_named(tiny3_loaded):
    import introspect
    from introspect.errors import InputError

    reference, inputs = tiny3_loaded
    with pytest.raises(InputError) as raised:
        introspect.diff(reference, f"{PORTS / 'broken_ranks.py'}:build_exits_zero", inputs,
                        nproc=2)
    message = str(raised.value)
    assert message.startswith("rank 1 of 2 ended its own process with exit code 0 while in "
                              "its forward"), message
    assert len(message) < 200


def test_nproc_over_the_cores_is_refused_before_anything_runs(tiny3_loaded, monkeypatch):
    import introspect
    import introspect.dump
    from introspect.diff.parallel.run import rank_limit
    from introspect.errors import InputError

    def no_capture(*args, **kwargs):
        raise AssertionError("the reference was run")

    monkeypatch.setattr(introspect.dump, "capture", no_capture)
    reference, inputs = tiny3_loaded
    limit, unit = rank_limit()
    with pytest.raises(InputError, match=rf"^--nproc 100000 is more ranks than this machine "
                                         rf"has {unit} \({limit}\): give at most {limit}$"):
        introspect.diff(reference, f"{MEGATRON}:build", inputs, nproc=100000)
