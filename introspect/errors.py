"""The project's own exceptions.

The CLI turns every ``IntrospectError`` into one line on stderr and exit code 2; anything
else is a bug and keeps its traceback. Imports nothing internal.
"""

from __future__ import annotations


class IntrospectError(Exception):
    """A problem the user can fix: bad input, a missing file, an unsupported model."""


class InputError(IntrospectError):
    """Bad input: texts or tensors the model cannot take, an output path, a checkpoint."""


class ModelSourceError(InputError):
    """A model name, folder, checkpoint file or head that cannot be loaded offline.

    An ``InputError`` too, so the Python API raises ``InputError`` for every bad input
    with the message the CLI prints.
    """


class TraceError(IntrospectError):
    """A model that torch.fx could not trace, with the node or call that stopped it."""
