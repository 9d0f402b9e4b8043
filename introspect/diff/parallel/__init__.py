"""Tensor-parallel candidates: a port run on N ranks under ``torch.distributed``, its
ranks' values joined into whole tensors by value and diffed against the reference.

``launch`` starts the ranks, ``rank`` is what each runs (build, truth runs, recording),
``collectives`` makes the collectives visible to the recorder, ``join`` rebuilds whole
tensors, ``hints`` names the TP faults, ``rank_dumps`` reads a dump per rank, and ``run``
ties them together (``diff_parallel``). See docs/parallel.md.
"""

from introspect.diff.parallel.run import ParallelRun, diff_parallel

__all__ = ["ParallelRun", "diff_parallel"]
