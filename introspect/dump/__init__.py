"""Activations on disk: capture the reference's, and diff a port's dump against them.

For ports written in any framework (NumPy, JAX, MLX, ONNX, C++): ``capture`` runs the
reference and keeps its inputs and the value of every node that computes; ``read_dump``
reads the tensors a port wrote under its own names; ``diff_dump`` aligns them to the
reference's nodes by value (no name map needed) and measures each one.

Example::

    >>> cap = capture(loaded.model, inputs)
    >>> path.write_bytes(capture_bytes(cap))             # introspect capture -o ref.safetensors
    >>> result = diff_dump(cap, read_dump("port.npz"))   # introspect diff --candidate-dump port.npz
"""

from introspect.dump.capture import Capture, CaptureEntry, capture
from introspect.dump.dump_diff import diff_dump
from introspect.dump.formats import Dump, capture_bytes, read_capture, read_dump

__all__ = ["Capture", "CaptureEntry", "Dump", "capture", "capture_bytes", "diff_dump",
           "read_capture", "read_dump"]
