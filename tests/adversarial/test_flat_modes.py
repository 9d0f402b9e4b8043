"""A port with no modules of its own, every weight in one flat Parameter, and a fault
only one grad mode takes (``ports/flat_modes.py``).

Two wrong verdicts, both PASSes of a faulty port, on bert-tiny:

- the weights were never related: a slice of a Parameter not named ``weight`` or ``bias``
  was taken for a buffer cut to the input's length, so no node was paired and only the
  outputs judged (``ops.align.view``);
- the op-level recording runs under ``no_grad``: a slip taken only with autograd on, or
  only under ``torch.inference_mode()``, was in no recording, and the outputs it moves
  stay under their budget. Now, where such a call returns other bits than the recording,
  the candidate is recorded again in that mode and replayed beside the reference's
  recording (``flow.other_modes``), and the node where the two part decides;
- weights packed into a 1-D floating buffer (a frozen port) were taken for a buffer cut
  to the input's length, like ``position_ids[:, :S]`` (2-D, of integers): nothing paired;
- ``--backward`` on a port that takes its weights by one ``torch.split`` with a piece the
  loss never reaches crashed (exit 2): autograd hands that piece's hook None;
- a slip taken only where the model has no hooks of its own: the recorder hooked every
  module, so its recording took the other path, reproduced no plain call, and decided
  nothing. It follows a module with no hooks of the user's by global hooks now
  (``ops.eager._module_hooks``), as module evidence's capture does;
- weights packed as the rows of one 2-D Parameter, each cut out by its rows: a row slice
  of a Parameter reads like a position table cut to a step's length (``wpe[s:s + T]``),
  so nothing paired. One cut at two ranges or more is a packing (a table is cut once).
"""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import port


@pytest.mark.parametrize("builder", ["correct", "correct_buffer", "correct_rows"])
def test_the_flat_port_is_paired_and_passes(tiny, builder):
    import introspect

    reference, inputs = tiny
    candidate = getattr(port("flat_modes.py"), builder)(reference)
    result = introspect.diff(reference.model, candidate, inputs)
    assert result.passed, result.summary()
    assert len(result.nodes) > 20  # the weights relate: the nodes pair


@pytest.mark.parametrize("builder", ["faulty_everywhere", "faulty_grad", "faulty_inference",
                                     "faulty_unhooked", "faulty_buffer",
                                     "faulty_rows"])
@pytest.mark.parametrize("nodes", [False, True])
def test_a_slip_on_one_path_fails_in_its_layer(tiny, builder, nodes):
    import introspect

    reference, inputs = tiny
    candidate = getattr(port("flat_modes.py"), builder)(reference)
    result = introspect.diff(reference.model, candidate, inputs, nodes=nodes)
    assert not result.passed, result.summary()
    statuses = set(result.outputs["status"])  # (the port returns no pooler_output)
    assert statuses == {"ok", "unmatched"}, result.outputs  # under the outputs' budget
    divergence = result.first_divergence
    assert divergence.layer == "encoder.layer.1", divergence
    if builder in ("faulty_grad", "faulty_inference"):
        assert any("recorded again" in note for note in result.notes), result.notes


def test_a_split_piece_with_no_gradient_is_no_crash(tiny):
    import introspect

    reference, inputs = tiny
    candidate = port("flat_modes.py").correct_split(reference)
    result = introspect.diff(reference.model, candidate, inputs, backward=True)
    assert result.passed and result.backward.passed, result.summary()


def test_a_port_packed_in_rows_passes_its_backward(tiny):
    import introspect

    reference, inputs = tiny
    candidate = port("flat_modes.py").correct_rows(reference)
    result = introspect.diff(reference.model, candidate, inputs, backward=True)
    assert result.passed and result.backward.passed, result.summary()
