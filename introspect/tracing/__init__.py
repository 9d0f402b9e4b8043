"""Tracing: a model's forward as a torch.fx graph with shapes on every node.

Used by ``introspect.trace`` (the function, in ``introspect.graph``), ``draw`` and the
attention maps; the diff does not trace (it records what ran, ``introspect.diff.ops.eager``).

- ``tracer``: ``trace_module``, the HF-aware fx tracer (leaves, notes, fast mode).
- ``cache``: the in-memory graph cache, for unmodified installed models only.
- ``replay``: repeated layers traced once and replayed (installed classes only).
- ``leaf_shapes``: output shapes of torch's own leaves without running them.
- ``traced_sizes``: tensor factories that take sizes read from the graph.
- ``shapes``: ShapeProp on the traced graph and the per-node records built from it.
- ``records``: ``NodeRecord``, one row per node, as tables and drawings read it.
- ``calls``: repeated calls of one module told apart (``.call1``, ``.call2``).
- ``fx_module``: GraphModule construction that generates code only when needed.

Named ``tracing``, not ``trace``: ``introspect.trace`` is the function, and a package of
that name would hide it (or be hidden by it).
"""
