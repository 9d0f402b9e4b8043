"""The diff engine: node-by-node parity between two implementations of one model.

The function is ``introspect.diff`` (``introspect.diff.api.diff``); this package holds
its parts, in the order of the flow (shared/DESIGN.md):

- ``outputs``: the verdict from the plain calls (``introspect.run``, tier 1);
- ``modules/``: module evidence (tier 2), each module of the plain calls judged;
- ``ops/``: op evidence (tier 3), the recordings aligned (``ops/align``), replayed and
  measured (``ops/compare``), the first divergence (``ops/divergence``);
- ``tolerance``: error budgets per dtype;
- ``tables``: one row per pair or leftover node, one per layer;
- ``hypotheses/``: the likely causes of a divergence (tier 4), ``hints`` among them;
- ``records`` and ``result``: the frozen rows and ``DiffResult``;
- ``options``: ``diff()``'s keyword arguments in groups (budgets, mode, devices, tables);
- ``flow/``: ``diff()``'s steps, in their order, sharing one ``DiffState``;
- ``api``: ``diff()`` itself, a short sequence of those steps.

Import from the modules (``from introspect.diff.api import diff``); ``introspect.diff``
itself is the function, never this package.
"""
