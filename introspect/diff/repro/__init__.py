"""After a FAIL, reproduce it: a standalone script and the values it runs on.

``write_repro(result, folder)`` (``DiffResult.write_repro``, ``introspect diff --repro
DIR``) writes ``repro.py`` and ``inputs.safetensors``. The script runs the reference's op
and the candidate's op at the first divergence on the values recorded there, prints how
far each re-run is from its recorded output (0 where the repro is faithful) and the
difference between the two against the diff's budget, and exits 1 when they part. It
needs torch and safetensors only: each side's op is written out as the torch calls it
made (``program``), so neither introspect, transformers nor the port's file is imported,
and the bundle is small enough to attach to a bug report (an op's tensors as it read
them, each value once).

Whoever receives the script runs it, so running it must be as safe as reading it: its
text depends only on the ops it replays. Every name (labels, a port's path, node and
module names, classes), every figure and every device is data in the safetensors
metadata (``script.about``), and the program's literals are Python's own quoting of
plain values (``program.literal``).

The values come from a replay of the two recordings, exactly as the diff replayed them
(``capture``); the script is rendered by ``script``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from introspect.diff.records import STATUS_FAIL, Divergence, NodeDiff
from introspect.diff.repro.capture import ReplaySource, capture_pair, evaluating
from introspect.diff.repro.program import ReproError, function_name, write_program
from introspect.diff.repro.script import (
    SCRIPT,
    TENSORS,
    Header,
    about,
    bundle_tensors,
    encode_tensors,
    render_script,
)
from introspect.errors import InputError
from introspect.graph import IntrospectGraph

REPRO_FILES = (SCRIPT, TENSORS)


class FailedDiff(Protocol):
    """What a repro reads of a diff (``introspect.diff.result.DiffResult`` is one).

    A protocol, so that the result can offer ``write_repro`` without this package
    importing the result back.
    """

    @property
    def passed(self) -> bool: ...
    @property
    def first_divergence(self) -> Divergence | None: ...
    @property
    def rows(self) -> Sequence[NodeDiff]: ...
    @property
    def alignment(self) -> Any: ...  # an Alignment's pairs, where both sides were recorded
    @property
    def reference(self) -> IntrospectGraph | None: ...
    @property
    def candidate(self) -> IntrospectGraph | None: ...
    @property
    def reference_label(self) -> str: ...
    @property
    def candidate_label(self) -> str: ...
    @property
    def replay(self) -> Any: ...  # a ``capture.ReplaySource``, or None


class NothingToReproduce(InputError):
    """The diff has no node-level divergence to reproduce (it passed, or failed elsewhere)."""


def repro_files(result: FailedDiff) -> dict[str, str | bytes]:
    """The repro's files by name: ``repro.py`` (text) and ``inputs.safetensors`` (bytes).

    Raises:
        NothingToReproduce: parity holds, or no node's local error is over budget (the
            failure is in the outputs of the plain calls, in drift, in gradients or in
            a decoding step), or the candidate was not recorded; the message says which.
        ReproError: the op at the divergence calls something torch alone cannot name.
    """
    from introspect.version import __version__

    d = result.first_divergence
    if result.passed and d is None:
        raise NothingToReproduce("nothing to reproduce: parity holds")
    source = result.replay
    if d is None or d.step is not None or source is None or result.candidate is None \
            or result.reference is None:
        why = _why_nothing(result)
        raise NothingToReproduce(f"nothing to reproduce at a node: {why}")
    first = next((r for r in result.rows if r.status == STATUS_FAIL), None)
    if first is None:
        raise NothingToReproduce("nothing to reproduce at a node: the divergence was found "
                                 "in the outputs of the models' own calls, not at a node")
    reference, candidate = result.reference, result.candidate
    ref_chain = _chain_to(reference, first.reference_node, d.reference_node)
    cand_chain = _chain_to(candidate, first.candidate_node, d.candidate_node)
    if ref_chain is None or cand_chain is None:
        raise NothingToReproduce(f"nothing to reproduce at a node: {d.reference_node} is not "
                                 f"where the failing pair {first.reference_node} gets its "
                                 "values")
    for node in (ref_chain[0], cand_chain[0]):
        if node.op in ("placeholder", "get_attr"):
            raise NothingToReproduce(f"nothing to reproduce at a node: {node.name} is an "
                                     "input or a weight, not an op")
    pairs: list[Any] = list(result.alignment.pairs)  # an Alignment's: both sides recorded
    index = next(i for i, p in enumerate(pairs)
                 if p.reference == first.reference_node and p.candidate == first.candidate_node)
    with evaluating(reference.gm, candidate.gm):  # as in the diff, whatever the models' modes
        capture = capture_pair(reference.gm, candidate.gm, pairs, source, index, ref_chain,
                               cand_chain)
        programs = [write_program(side.nodes[0], graph.gm, side.args, side.kwargs,
                                  side.nodes, name)
                    for side, graph, name in ((capture.reference, reference, "reference"),
                                              (capture.candidate, candidate, "candidate"))]
    header = Header(d, result.reference_label, result.candidate_label,
                    _what(ref_chain[0], reference.gm), _what(cand_chain[0], candidate.gm),
                    str(cand_chain[0].target) if cand_chain[0].op == "call_module" else "",
                    __version__)
    devices = (_device(capture.reference.output), _device(capture.candidate.output))
    script = render_script(capture, programs[0], programs[1])
    stored, aliases = bundle_tensors(capture, programs[0], programs[1])
    data = about(capture, programs[0], programs[1], header, devices, aliases)
    return {SCRIPT: script, TENSORS: encode_tensors(stored, data)}


def write_repro(result: FailedDiff, folder: str | os.PathLike[str]) -> list[Path]:
    """Write ``repro.py`` and ``inputs.safetensors`` into ``folder``, all or nothing.

    The folder is created if its parent exists; other files in it are kept.

    Returns:
        The two paths written.

    Raises:
        NothingToReproduce: see ``repro_files``; nothing is written.
        InputError: the folder cannot be written (nothing is).

    Example::

        >>> result = introspect.diff(hf_model, my_port, inputs)
        >>> if not result.passed:
        ...     result.write_repro("repro")    # then: python repro/repro.py
    """
    from introspect.files import check_writable_folder, write_folder

    check_writable_folder(folder, REPRO_FILES)
    return write_folder(folder, repro_files(result), owned=REPRO_FILES)


def _why_nothing(result: FailedDiff) -> str:
    d = result.first_divergence
    if d is not None and d.step is not None:
        return "the diff compared a generation; run it without --generate at the failing step"
    if result.candidate is None or result.reference is None:
        return "a side was not recorded (a file of activations, or a model the recorder " \
               "could not follow)"
    if result.replay is None:
        return "this diff kept no replay of its recordings"
    return "no node's local error is over budget (the failure is drift, in the outputs of " \
           "the models' own calls, or in the gradients)"


def _chain_to(graph: Any, compared: str, computing: str) -> list[torch.fx.Node] | None:
    """The nodes from ``computing`` down to ``compared`` through layout ops, in run order."""
    from introspect.diff.ops.divergence import _chain

    chain = _chain(graph, compared)
    if computing not in chain:
        return None
    nodes = {n.name: n for n in graph.gm.graph.nodes}
    return [nodes[name] for name in reversed(chain[:chain.index(computing) + 1])]


def _what(node: torch.fx.Node, gm: torch.fx.GraphModule) -> str:
    """What ran at ``node``: a module's class, or a torch function's name."""
    if node.op == "call_module":  # data for the script, never its source
        cls = type(gm.get_submodule(str(node.target)))
        return f"{cls.__module__}.{cls.__qualname__}"
    if node.op == "call_method":
        return f"torch.Tensor.{node.target}"
    try:
        return function_name(node.target)
    except ReproError:
        return getattr(node.target, "__qualname__", str(node.target))


def _device(value: Any) -> str:
    return str(value.device) if isinstance(value, torch.Tensor) else "cpu"


__all__ = ["REPRO_FILES", "NothingToReproduce", "ReplaySource", "ReproError", "repro_files",
           "write_repro"]
