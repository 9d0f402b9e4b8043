"""The package's version, in a module of its own that imports nothing.

Any module (a report, a repro, a capture) reads it from here, never from the package root,
whose ``__init__`` reaches the whole package.
"""

__version__ = "0.1.0"
