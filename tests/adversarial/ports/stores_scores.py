"""A forward that stores ``self.scores = scores`` (as tutorials do, for plotting); the
faulty twin also scales layer N's scores by 1/d instead of 1/sqrt(d) (a private flag)."""

import adv_bert


class Block(adv_bert.Block):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._scale_by_d = False

    def scale(self):
        return 1 / self.head_dim if self._scale_by_d else super().scale()

    def attend(self, x, mask):
        B, S, H = x.shape
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scores = q @ k.transpose(-1, -2) * self.scale()
        scores = scores.masked_fill(~mask, -1e30).softmax(-1)
        self.scores = scores  # kept for a plot
        return (scores @ v).transpose(1, 2).reshape(B, S, H)


def _build(reference, by_d):
    model = adv_bert.build(reference, Block)
    model.blocks[adv_bert.fault_layer(reference)]._scale_by_d = by_d
    return model


def faulty(reference):
    return _build(reference, True)


def correct(reference):
    return _build(reference, False)
