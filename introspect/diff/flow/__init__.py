"""The steps of ``introspect.diff``, in the order ``diff()`` (``introspect.diff.api``) runs
them; each step reads and fills one ``DiffState`` (``state``).

1. ``handoff``: the arguments that decide the mode checked; ``--nproc`` and ``--generate``
   handed off to their own packages.
2. ``state.DiffState.start``: the tolerance checked, the caller's inputs copied (no model
   ever gets theirs), the reference in eval mode.
3. ``reference``: both models placed; the reference's plain calls and module capture,
   then its recording while still clean (with backward, its gradients too), all before
   the candidate is built.
4. ``candidate``: the candidate built, the process-wide switches its build flips read;
   with ``noise_budget`` the reference in float64 (``reference.measure_noise_budget``);
   the candidate's plain calls and the outputs judged: the verdict.
5. ``module_evidence.pass_without_recording``: with no node tables asked for, a PASS the
   outputs and module evidence prove records nothing (the fast path).
6. ``inside``: with no node tables asked for, a FAIL module evidence proves is explained
   inside its smallest failing module alone, each side's module recorded on its own.
   Otherwise ``reference.record_reference_late`` and ``op_level``: the op-level recording and its
   explanation, the recordings held to the plain calls, the candidate recorded again in a
   grad mode whose call its recording did not reproduce (``other_modes``), int8 outputs
   explained;
   ``gradients`` compared (backward); the verdict settled with the truth divergence.
7. ``module_evidence.join_module_evidence``; the reference checked once more
   (``reference.reference_again_where_moved``: called, or its footprint read): the
   candidate left it unchanged.
8. ``finish``: every model put back (``DiffState.put_back``), the caller's inputs proven
   unchanged, the ``DiffResult``.

Imports nothing here: each step is imported from its own module.
"""
