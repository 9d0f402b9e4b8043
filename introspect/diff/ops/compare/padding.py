"""Which elements of a value sit at padded token positions: the mask errors skip."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from introspect.diff.ops.compare.axes import BATCH, ROWS, TOKENS


class Padding:
    """Which elements of a value sit at padded token positions.

    Where the value's axes are known (``TokenAxes``, followed from the inputs through
    every op), the mask is put on its batch and token axes, or on its rows when batch and
    tokens are flattened together ``(B*S, F)``. Otherwise, from the shape alone: a
    dimension after the first counts as a token axis when its size is the sequence
    length; when the last two dimensions both are (attention scores), both count.
    """

    def __init__(self, attention_mask: torch.Tensor | None) -> None:
        self.padded: torch.Tensor | None = None
        self.input_shape: tuple[int, ...] | None = None
        if attention_mask is not None and attention_mask.ndim >= 2:
            padded = attention_mask.reshape(-1, attention_mask.shape[-1]) == 0  # (N, S)
            self.padded = padded if bool(padded.any()) else None
            self.input_shape = tuple(attention_mask.shape)
        self._cache: dict[tuple[Any, ...], torch.Tensor | None] = {}

    def mask_for(self, shape: Sequence[int], labels: tuple[str | None, ...] | None = None,
                 ) -> torch.Tensor | None:
        """A boolean mask broadcastable to ``shape``, True at padding positions, or None.

        ``labels`` (from ``TokenAxes``) says which axis is the batch, the tokens, or both
        flattened; without it the axes are guessed from the sizes.
        """
        shape = tuple(shape)
        key = (shape, labels)
        if key not in self._cache:
            self._cache[key] = self._build(shape) if labels is None or len(labels) != len(
                shape) else self._from_labels(shape, labels)
        return self._cache[key]

    def _from_labels(self, shape: tuple[int, ...],
                     labels: tuple[str | None, ...]) -> torch.Tensor | None:
        if self.padded is None:
            return None
        rows, seq = self.padded.shape
        mask = None
        batch = [d for d, label in enumerate(labels) if label == BATCH and shape[d] == rows]
        for axis in (d for d, label in enumerate(labels) if label == TOKENS and shape[d] == seq):
            if len(batch) != 1:
                break
            view = [1] * len(shape)
            view[batch[0]], view[axis] = rows, seq
            part = self.padded.reshape(view)
            mask = part if mask is None else (mask | part)
        for axis in (d for d, label in enumerate(labels)
                     if label == ROWS and shape[d] == rows * seq):
            view = [1] * len(shape)
            view[axis] = rows * seq
            part = self.padded.reshape(view)
            mask = part if mask is None else (mask | part)
        return mask

    def _build(self, shape: tuple[int, ...]) -> torch.Tensor | None:
        if self.padded is None or len(shape) < 2 or shape[0] != self.padded.shape[0]:
            return None
        rows, seq = self.padded.shape
        axes = [d for d in range(1, len(shape)) if shape[d] == seq]
        if not axes:
            return None
        if not (len(axes) >= 2 and axes[-2:] == [len(shape) - 2, len(shape) - 1]):
            axes = axes[:1]
        else:
            axes = axes[-2:]
        mask = None
        for axis in axes:
            view = [1] * len(shape)
            view[0], view[axis] = rows, seq
            part = self.padded.reshape(view)
            mask = part if mask is None else (mask | part)
        return mask
