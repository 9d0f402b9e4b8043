"""Overlays: colour nodes and add a line of text per node on a drawing.

The diff paints its per-node error on the same drawing as ``introspect draw``: it builds
an ``Overlay`` (by hand, from a pandas DataFrame, or from errors and a budget) and passes
it to ``draw_graph``. Names are the fx node names of the drawn graph (``NodeRecord.name``).

When several nodes end up in one box (a folded ×12 block, a closed module at low depth,
a chain of layout ops), the box shows the *worst* of their colours and that node's note:
worst is the highest ``score`` when scores are given; without scores, the colour latest
in ``severity`` (the error scale by default); a colour not in it counts as worse than
any that is, and among equals the first node in graph order wins.

Example::

    >>> overlay = Overlay(colors={"bert_pooler_dense": "#f4a3a3"},
    ...                   notes={"bert_pooler_dense": "max err 3e-6"})
    >>> draw_graph(graph, overlay=overlay)
    >>> draw_graph(graph, overlay=Overlay.from_errors({"classifier": 2e-3}, budget=1e-5))
    >>> draw_graph(graph, overlay=frame)      # DataFrame with columns name, color, note
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from introspect.errors import InputError

# Error scale from fine to bad: within budget, up to 10x over, up to 1000x over, beyond.
ERROR_SCALE = ("#c7ecc7", "#fff1a8", "#ffc98a", "#f59c9c")
_HEX = re.compile(r"^#(?:[0-9a-fA-F]{6}|[0-9a-fA-F]{8})$")
_NAMED = re.compile(r"^[a-zA-Z]{3,20}$")


@dataclass(frozen=True)
class Overlay:
    """Per-node colours, notes and (optional) scores to paint on a drawing.

    Attributes:
        colors: node name -> fill colour, ``"#rrggbb"`` or a Graphviz colour name.
        notes: node name -> one line of text shown under the node's label.
        scores: node name -> a number, larger is worse; decides the worst node in a box.
        severity: colours from best to worst, used when there are no scores.
        caption: a line for the drawing's title, saying what the colours mean.
        outline: modules (layer names such as ``"encoder.layer.3"``) drawn with a thick
            red border, so the eye goes there first: the diff outlines its failing
            layers. Each gets the SVG id ``outline_<name>``, which a page can link to.
    """

    colors: Mapping[str, str] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)
    scores: Mapping[str, float] = field(default_factory=dict)
    severity: tuple[str, ...] = ERROR_SCALE
    caption: str = ""
    outline: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, color in self.colors.items():
            if not isinstance(color, str) or not (_HEX.match(color) or _NAMED.match(color)):
                raise InputError(
                    f"overlay colour {color!r} of node {name!r} is not a colour; "
                    "use '#rrggbb' or a Graphviz colour name such as 'red'"
                )

    @property
    def names(self) -> set[str]:
        """Every node name the overlay mentions."""
        return set(self.colors) | set(self.notes) | set(self.scores)

    @classmethod
    def from_frame(
        cls,
        frame: Any,
        *,
        name: str = "name",
        color: str = "color",
        note: str = "note",
        score: str = "score",
        caption: str = "",
    ) -> Overlay:
        """An overlay from a pandas DataFrame with one row per node.

        Args:
            frame: a DataFrame with a ``name`` column and any of ``color``, ``note``,
                ``score`` (other column names can be given). Empty cells are skipped.

        Raises:
            InputError: the name column is missing, or a colour is not a colour.

        Example::

            >>> Overlay.from_frame(pd.DataFrame({"name": ["classifier"], "color": ["red"]}))
        """
        if name not in frame.columns:
            raise InputError(
                f"overlay table has no column {name!r}; columns are "
                f"{list(frame.columns)}; pass name='...' to choose one"
            )
        columns: dict[str, dict[str, Any]] = {color: {}, note: {}, score: {}}
        for column in columns:
            if column not in frame.columns:
                continue
            for key, value in zip(frame[name], frame[column], strict=True):
                if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
                    continue
                columns[column][str(key)] = value
        return cls(
            colors={k: str(v) for k, v in columns[color].items()},
            notes={k: str(v) for k, v in columns[note].items()},
            scores={k: float(v) for k, v in columns[score].items()},
            caption=caption,
        )

    @classmethod
    def from_errors(
        cls,
        errors: Mapping[str, float],
        budget: float,
        *,
        label: str = "max err",
        caption: str = "",
    ) -> Overlay:
        """Colour nodes by error against a budget (green within it, red far beyond).

        Args:
            errors: node name -> error (e.g. max absolute error); NaN counts as worst.
            budget: the error allowed; ``ERROR_SCALE`` steps at 1x, 10x and 1000x it.
            label: the note's prefix: ``"max err 3.1e-06"``.

        Example::

            >>> Overlay.from_errors({"classifier": 2e-3}, budget=1e-5).colors
            {'classifier': '#f59c9c'}
        """
        colors, notes, scores = {}, {}, {}
        for name, error in errors.items():
            error = float(error)
            score = math.inf if math.isnan(error) else error
            ratio = score / budget if budget > 0 else (math.inf if score > 0 else 0.0)
            step = 0 if ratio <= 1 else 1 if ratio <= 10 else 2 if ratio <= 1000 else 3
            colors[name], scores[name] = ERROR_SCALE[step], score
            notes[name] = f"{label} {error:.2g}"
        return cls(
            colors,
            notes,
            scores,
            ERROR_SCALE,
            caption or f"colours: {label} against budget {budget:g}",
        )

    def worst(self, names: Iterable[str]) -> str | None:
        """The name among ``names`` whose colour a box holding them all should show."""
        best: tuple[Any, ...] | None = None
        chosen = None
        for order, name in enumerate(names):
            if name not in self.colors and name not in self.notes:
                continue
            rank = (
                name in self.colors,
                self.scores.get(name, -math.inf),
                self._severity(self.colors.get(name)),
                -order,
            )
            if best is None or rank > best:
                best, chosen = rank, name
        return chosen

    def _severity(self, color: str | None) -> int:
        if color is None:
            return -1
        lowered = [c.lower() for c in self.severity]
        return lowered.index(color.lower()) if color.lower() in lowered else len(lowered)


def as_overlay(value: Overlay | Mapping[str, str] | Any | None) -> Overlay | None:
    """Accept an ``Overlay``, a mapping of node name -> colour, or a DataFrame."""
    if value is None or isinstance(value, Overlay):
        return value
    if isinstance(value, Mapping):
        return Overlay(colors=dict(value))
    if hasattr(value, "columns"):
        return Overlay.from_frame(value)
    raise InputError(
        f"overlay must be an Overlay, a mapping of node name to colour or a "
        f"DataFrame with columns name/color/note; got {type(value).__name__}"
    )
