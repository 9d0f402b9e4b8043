"""Module evidence (tier 2): each module of the candidate's plain calls, on the reference's
inputs to it, against the reference's output and a budget from its own rounding noise.

- ``capture``: the hooks that see each module's inputs and outputs in the plain calls;
- ``pairing``: the reference values that stand for a candidate module's call;
- ``local``: its local error, and its rounding noise;
- ``budget``: what rounding explains for it;
- ``evidence``: the rows, the regions the recording could not see, the verdict.
"""

from introspect.diff.modules.capture import Calls, capture_calls
from introspect.diff.modules.evidence import (
    ModuleDiff,
    ModuleEvidence,
    Uncovered,
    gather_module_evidence,
)

__all__ = ["Calls", "ModuleDiff", "ModuleEvidence", "Uncovered", "capture_calls",
           "gather_module_evidence"]
