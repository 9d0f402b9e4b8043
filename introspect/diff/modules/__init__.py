"""Module evidence (tier 2): each module of the candidate's plain calls, on the reference's
inputs to it, against the reference's output and a budget from its own rounding noise.
What each module saw in the plain calls is tier 1's (``introspect.run.capture``).

- ``pairing``: the reference values that stand for a candidate module's call;
- ``local``: its local error, and its rounding noise (``arguments``: a call's arguments
  by path; ``gaps``: the largest gap, as float64 copies give it, read without them);
- ``reuse``: a module's run on the reference's inputs read from its ancestor's run;
- ``budget``: what rounding explains for it;
- ``evidence``: the rows, the regions the recording could not see, the verdict.
"""

from introspect.diff.modules.evidence import (
    ModuleDiff,
    ModuleEvidence,
    Uncovered,
    gather_module_evidence,
)

__all__ = ["ModuleDiff", "ModuleEvidence", "Uncovered", "gather_module_evidence"]
