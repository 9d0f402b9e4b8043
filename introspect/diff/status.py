"""The status words every table shows (terminal, Markdown, HTML, JSON, notebook), and their
legend: one set, so a node or a layer reads the same everywhere.

Kept apart from the result so the report can use the words without importing the diff's
result (the report draws on a ``ComparedGraph`` protocol, never on ``DiffResult`` itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from introspect.diff.records import (
    STATUS_DRIFT,
    STATUS_FAIL,
    STATUS_OK,
    STATUS_SKIPPED,
    STATUS_UNCONFIRMED,
    STATUS_UNMATCHED,
    LayerDiff,
    NodeDiff,
)

# One set of status words for every table (terminal, Markdown, HTML, notebook): a node's
# or a layer's status is one of these.
WORD_PASS, WORD_FAIL, WORD_DRIFT, WORD_NA = "pass", "FAIL", "drift", "n/a"
WORD_UNCONFIRMED = "unconfirmed"
_WORDS = {STATUS_OK: WORD_PASS, STATUS_FAIL: WORD_FAIL, STATUS_DRIFT: WORD_DRIFT,
          STATUS_UNCONFIRMED: WORD_UNCONFIRMED, STATUS_UNMATCHED: WORD_NA,
          STATUS_SKIPPED: WORD_NA}
STATUS_LEGEND = ("pass: compared, within budget; FAIL: local error over budget (look here); "
                 "drift: only errors carried in from before; n/a: nothing compared")
_UNCONFIRMED_LEGEND = ("; unconfirmed: over budget, but nothing it feeds differs, or the "
                       "pair is a guess (paired by structure: no weight or value proves it) "
                       "that no output or proven pair confirms; never a failure")


def status_word(status: str) -> str:
    """The word a table shows for a node's ``status`` (``ok`` -> ``pass``, ...)."""
    return _WORDS.get(status, status)


class _Rows(Protocol):
    """What the layer words read of a diff (``DiffResult`` is one): a protocol, so that the
    result can use the words without this module importing it back."""

    @property
    def rows(self) -> Sequence[NodeDiff]: ...
    @property
    def layer_rows(self) -> Sequence[LayerDiff]: ...


def layer_statuses(result: _Rows) -> list[str]:
    """The status word of each of ``result.layer_rows``: FAIL where a node's local error is
    over budget, unconfirmed where none is but an unconfirmed node's is (a layer holding the
    same fault as a failing one, whose pair is a guess, read "pass"), drift where the
    layer's output error is, n/a where no node was compared, pass otherwise."""
    drifting = {r.reference_node for r in result.rows if r.status == STATUS_DRIFT}
    unconfirmed = {r.layer for r in result.rows if r.status == STATUS_UNCONFIRMED}
    words = []
    for layer in result.layer_rows:
        if layer.failing or not layer.passed:
            words.append(WORD_FAIL)
        elif layer.layer in unconfirmed:
            words.append(WORD_UNCONFIRMED)
        elif not layer.nodes:
            words.append(WORD_NA)
        elif layer.output_node in drifting:
            words.append(WORD_DRIFT)
        else:
            words.append(WORD_PASS)
    return words


def status_legend(words: Sequence[str] = ()) -> str:
    """The legend line under a status table (``unconfirmed`` explained where shown)."""
    return "status: " + STATUS_LEGEND + (_UNCONFIRMED_LEGEND if WORD_UNCONFIRMED in words
                                         else "")
