"""Dumps from many ranks: a folder holding ``rank0/``, ``rank1/``, ... (or ``rank0.npz``,
``rank0.safetensors``, ...), one dump per rank under the same tensor names, joined into
whole tensors by value (``join``) and diffed as one dump.

Example::

    >>> joined = join_rank_dumps(capture(loaded.model, inputs), "tp-dump/")
    >>> sorted({j.kind for j in joined.joins.values()})
    ['concatenated', 'replicated', 'summed']
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from introspect.diff.parallel.join import JoinedRanks, join_ranks
from introspect.diff.tolerance import Tolerance
from introspect.errors import InputError

_RANK = re.compile(r"^rank(\d+)(\.safetensors|\.npz)?$")


def rank_entries(path: str | os.PathLike[str]) -> list[Path]:
    """The per-rank dumps of a folder, in rank order; [] when it holds none.

    Raises:
        InputError: ranks that do not run 0..N-1, or one rank given twice.
    """
    folder = Path(path)
    if not folder.is_dir():
        return []
    found: dict[int, Path] = {}
    for entry in folder.iterdir():
        match = _RANK.match(entry.name)
        if not match or (match.group(2) is None and not entry.is_dir()):
            continue
        rank = int(match.group(1))
        if rank in found:
            raise InputError(f"{folder} holds rank {rank} twice ({found[rank].name} and "
                             f"{entry.name}); keep one dump per rank")
        found[rank] = entry
    if found and sorted(found) != list(range(len(found))):
        missing = min(set(range(max(found) + 1)) - set(found))
        raise InputError(f"{folder} holds the dumps of ranks {sorted(found)}: rank {missing} "
                         "is missing (rank0, rank1, ... each in its own folder or file)")
    return [found[r] for r in sorted(found)]


def join_rank_dumps(reference: Any, path: str | os.PathLike[str], *,
                    order_file: str | None = None, atol: float | None = None,
                    rtol: float | None = None) -> JoinedRanks:
    """Read every rank's dump and join them against ``reference`` (a ``Capture``).

    Raises:
        InputError: no rank dumps in ``path``, an unreadable one, or ranks that dumped
            tensors of different names.
    """
    from introspect.dump import read_dump

    entries = rank_entries(path)
    if not entries:
        raise InputError(f"{path} holds no rank dumps (rank0/, rank1/, ... or rank0.npz, ...)")
    dumps = [read_dump(entry, order_file) for entry in entries]
    names = list(dumps[0].values)
    for rank, dump in enumerate(dumps[1:], start=1):
        if set(dump.values) != set(names):
            other = sorted(set(dump.values) ^ set(names))
            raise InputError(f"rank {rank}'s dump and rank 0's hold different tensors "
                             f"({', '.join(other[:3])}...): every rank dumps the same names")
    joined = join_ranks([d.values for d in dumps], names, reference.values,
                        tolerance=Tolerance(atol=atol, rtol=rtol),
                        path=f"{len(dumps)} rank dumps in {path}")
    joined.dump.integers = dict(dumps[0].integers)
    joined.dump.ordered = dumps[0].ordered
    return joined


def diff_rank_dumps(reference: Any, path: str | os.PathLike[str], *,
                    order_file: str | None = None, atol: float | None = None,
                    rtol: float | None = None, reference_model: Any = None,
                    reference_label: str = "", name_map: Any = None,
                    allow_nonfinite: bool = False) -> Any:
    """``introspect diff --candidate-dump FOLDER`` where the folder holds one dump per rank."""
    from introspect.diff.parallel.run import diff_joined

    joined = join_rank_dumps(reference, path, order_file=order_file, atol=atol, rtol=rtol)
    return diff_joined(reference, joined, atol=atol, rtol=rtol,
                       reference_model=reference_model,
                       reference_label=reference_label or reference.model,
                       candidate_label=f"rank dumps {path}", allow_nonfinite=allow_nonfinite,
                       name_map=name_map)
