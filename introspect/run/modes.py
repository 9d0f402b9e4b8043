"""A model put in eval mode, or back in its mode, where its class refuses ``train()``.

``torch.export``'s module is a program captured in one mode: its ``train()`` and
``eval()`` raise ``NotImplementedError``. A port may be one. Every place that puts a model
it did not build in eval mode goes through here: the refusal then sets each module's
``training`` flag as ``eval`` would (what the program computes does not read it).

Example::

    >>> set_mode(model, training=False)   # model.eval(), or its flags
"""

from __future__ import annotations

import torch


def set_mode(model: torch.nn.Module, training: bool) -> None:
    """``model.train(training)``; every module's flag where the model refuses it."""
    try:
        model.train(training)
    except NotImplementedError:
        for module in model.modules():
            module.training = training


__all__ = ["set_mode"]
