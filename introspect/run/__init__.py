"""How a model is run for a verdict: plainly, as its user runs it (``truth``).

The diff's verdict comes from *truth runs* (shared/DESIGN.md, "Truth runs"): each model
called as its user calls it (eval mode, no torch function mode, autograd on, and once more
under ``no_grad``), on its own copy of the inputs, the candidate at least twice. The
recording (``introspect.diff.ops.eager``) and the replay (``introspect.diff.ops.compare``) only
explain a verdict; they are held to reproduce the truth outputs bit for bit.

- ``outputs``: every output a model returns, by name, whatever produced it (NumPy too);
- ``truth``: the truth runs of one model and what they showed (inputs changed in place,
  outputs that change from call to call or with the grad mode);
- ``borrowed``: which of the reference's own modules a candidate runs (a port that
  returns the reference agrees with itself: a note, never a verdict);
- ``boundaries``: the values at module boundaries of a truth run, taken with hooks that do
  not change the path, to say where a recording parts from what really ran;
- ``capture``: what each module saw in the plain calls (its tensor inputs and outputs),
  taken by global hooks that do not change the path, for module evidence (tier 2);
- ``reference``: the reference called once more at the end, to prove the candidate's code
  left what it computes unchanged.
- ``quiet``: what introspect's own calls of a model would print beside a verdict, kept
  quiet: what its worker threads raise, and reentrant checkpoints' warning.
"""
