"""llama2.c's port (``tests/ports/llama2c.py``, another hand's code) with one block's
attention residual taken detached (imports only torch and that port).

The forward is the same; the gradient that reaches the block's input skips the residual,
so every weight before the block is moved. The recorded backward's first node over its
local budget was the final norm (its local region runs back through the unpaired residual
adds to the one detached), named one layer-stack away from the block.

- ``correct``: llama2.c's port as it is;
- ``faulty``: block ``DETACHED``'s residual ``x.detach() + attention``.
"""

from __future__ import annotations

from tests.ports import llama2c

DETACHED = 2


def correct(reference):
    return llama2c.build(reference)


def faulty(reference):
    model = llama2c.build(reference)
    block = model.layers[DETACHED]

    def forward(x, freqs_cos, freqs_sin, attention_mask=None):
        a = block.attention.forward(block.attention_norm(x), freqs_cos, freqs_sin,
                                    attention_mask)
        h = x.detach() + a
        return h + block.feed_forward.forward(block.ffn_norm(h))

    block.forward = forward  # (an instance's own forward: the module's call still hooks it)
    return model
