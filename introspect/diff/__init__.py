"""The diff engine: node-by-node parity between two implementations of one model.

The function is ``introspect.diff`` (``introspect.diff.api.diff``); this package holds
its parts, in the order of the flow (shared/DESIGN.md):

- ``align/``: pair the nodes of two traced graphs on the weights they read;
- ``tolerance``: error budgets per dtype;
- ``compare``: run the two graphs side by side and measure every pair;
- ``tables``: one row per pair or leftover node, one per layer;
- ``divergence`` and ``hints``: the first divergence and its likely causes;
- ``records`` and ``result``: the frozen rows and ``DiffResult``;
- ``api``: ``diff()`` itself.

Import from the modules (``from introspect.diff.api import diff``); ``introspect.diff``
itself is the function, never this package.
"""
