"""The project's own exceptions.

The CLI turns every ``IntrospectError`` into one line on stderr and exit code 2; anything
else is a bug and keeps its traceback. Imports nothing internal.
"""

from __future__ import annotations


class IntrospectError(Exception):
    """A problem the user can fix: bad input, a missing file, an unsupported model."""


class ModelSourceError(IntrospectError):
    """A model name, folder or head that cannot be loaded offline."""


class TraceError(IntrospectError):
    """A model that torch.fx could not trace, with the node or call that stopped it."""


class InputError(IntrospectError):
    """Texts or tensors the model cannot take (empty text, wrong shapes, too long)."""
