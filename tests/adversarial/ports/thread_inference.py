"""A layer run in a worker thread that does not carry the caller's grad mode over (imports
only torch and ``adv_bert``).

Grad modes are per thread. Under ``torch.inference_mode()`` the caller's tensors are
inference tensors, and the worker, with autograd on, cannot save them for a backward: the
port raises there, in its own way (the thread's error is printed by ``threading`` and the
port then misses the result it waited for). With autograd on and under ``no_grad`` it runs.

- ``correct``: layer ``fault_layer`` computed in a ``threading.Thread``;
- ``faulty``: the same, with the tanh GELU in that layer.
"""

from __future__ import annotations

import threading

import adv_bert
import torch.nn.functional as F


class ThreadedBlock(adv_bert.Block):
    approximate = "none"
    threaded = -1

    def activation(self, h):
        return F.gelu(h, approximate=self.approximate if self.index == self.threaded
                      else "none")

    def forward(self, x, mask):
        if self.index != self.threaded:
            return super().forward(x, mask)
        result = {}
        worker = threading.Thread(target=lambda: result.update(y=super(ThreadedBlock, self)
                                                               .forward(x, mask)))
        worker.start()
        worker.join()
        return result["y"]


def _threaded(reference, approximate):
    model = adv_bert.build(reference, ThreadedBlock)
    for block in model.blocks:
        block.threaded = adv_bert.fault_layer(reference)
        block.approximate = approximate
    return model


def correct(reference):
    return _threaded(reference, "none")


def faulty(reference):
    return _threaded(reference, "tanh")
