"""The attention record: probabilities, tokens and padding of one model on one batch.

The record every table and picture of attention reads (``stats``, ``views``, ``page``);
``maps`` builds it from a traced graph. It imports nothing of the pictures, so they can
name it and be imported by ``maps`` in turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from introspect.errors import InputError

if TYPE_CHECKING:
    import pandas


@dataclass
class AttentionRecord:
    """The attention probabilities of a model on a batch, with the tokens behind them.

    What every table and picture reads; ``AttentionMaps`` (``maps``) adds the pictures as
    methods.

    Attributes:
        probs: float32 tensor ``(layers, batch, heads, query, key)``; each query row sums
            to 1 over the real keys; padded keys have weight 0.
        tokens: the tokens of each batch row, padding included (ids as text when the
            inputs came without a tokenizer).
        keep: bool ``(batch, seq)``, True for real tokens, False for padding.
        modules: per layer, the module path of the attention it was read from.
        texts: the texts behind the rows, when known.
        title: a name for pictures and tables (the model's class by default).
        notes: what a user should know about the inputs (e.g. a text truncated).
        queries, keys: float32 ``(layers, batch, heads, seq, head size)``, the vectors each
            head scores (``introspect.attention.neurons``; key heads shared out under
            grouped-query attention); None where the graph shows no plain ``q·kᵀ``.
        scales: per layer, the factor of the scores ``q·k`` (``1/sqrt(hd)`` for BERT).
    """

    probs: torch.Tensor
    tokens: tuple[tuple[str, ...], ...]
    keep: torch.Tensor
    modules: tuple[str, ...] = ()
    texts: tuple[str, ...] = ()
    title: str = ""
    notes: list[str] = field(default_factory=list)
    queries: torch.Tensor | None = None
    keys: torch.Tensor | None = None
    scales: tuple[float, ...] = ()

    @property
    def num_layers(self) -> int:
        return int(self.probs.shape[0])

    @property
    def batch_size(self) -> int:
        return int(self.probs.shape[1])

    @property
    def num_heads(self) -> int:
        return int(self.probs.shape[2])

    def length(self, batch: int = 0) -> int:
        """Real tokens in batch row ``batch`` (padding is always at the end for BERT)."""
        return int(self.keep[batch].sum())

    def real_tokens(self, batch: int = 0) -> tuple[str, ...]:
        """The tokens of row ``batch`` without padding."""
        return tuple(t for t, k in zip(self.tokens[batch], self.keep[batch].tolist(),
                                       strict=True) if k)

    def head(self, layer: int, head: int, batch: int = 0) -> torch.Tensor:
        """``(query, key)`` probabilities of one head on the real tokens of one row.

        Raises:
            InputError: a layer, head or batch index out of range.
        """
        self.check(layers=[layer], heads=[head], batch=batch)
        index = self.keep[batch].nonzero().flatten()
        return self.probs[layer, batch, head][index][:, index]

    def check(self, layers: list[int] | None = None, heads: list[int] | None = None,
              batch: int | None = None) -> None:
        """Raise ``InputError`` naming the first index out of range."""
        for name, values, count, owner in (
                ("layer", layers, self.num_layers, "this model has"),
                ("head", heads, self.num_heads, "this model has"),
                ("batch row", None if batch is None else [batch], self.batch_size,
                 "the input has")):
            for value in values or ():
                if not 0 <= value < count:
                    raise InputError(f"{name} {value} is out of range: {owner} "
                                     f"{count} {name}s (0 to {count - 1})")

    def frame(self, *, padding: bool = False) -> pandas.DataFrame:
        """A long table, one row per (layer, head, batch, query, key).

        Args:
            padding: keep rows whose query or key is a padding token (default: drop them).

        Returns:
            Columns layer, head, batch, query, query_token, key, key_token, weight.
        """
        import numpy as np
        import pandas as pd

        L, B, nh, S, _ = self.probs.shape
        grid = np.indices((L, nh, B, S, S)).reshape(5, -1)  # layer, head, batch, query, key
        weights = self.probs.permute(0, 2, 1, 3, 4).reshape(-1).numpy()
        layer, head, batch, query, key = grid
        if not padding:
            keep = self.keep.numpy()
            chosen = keep[batch, query] & keep[batch, key]
            layer, head, batch, query, key = (a[chosen] for a in (layer, head, batch, query, key))
            weights = weights[chosen]
        tokens = np.array([list(row) for row in self.tokens], dtype=object)
        return pd.DataFrame({
            "layer": layer, "head": head, "batch": batch,
            "query": query, "query_token": tokens[batch, query],
            "key": key, "key_token": tokens[batch, key],
            "weight": weights,
        })

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.title or 'model'}: {self.num_layers} layers x "
                f"{self.num_heads} heads, batch {self.batch_size}, "
                f"{self.probs.shape[-1]} tokens)")
