"""Op evidence (tier 3): what each model really ran, op by op, recorded, aligned and replayed.

The truth runs (``introspect.run``) give the verdict and module evidence
(``introspect.diff.modules``) names the module; this tier explains them node by node, on
recordings held to reproduce the plain calls bit for bit:

- ``eager``: record every torch call a model makes, as a graph (``record_forward``);
- ``align/``: pair the nodes of two recorded graphs on the weights they read;
- ``compare/``: replay both graphs side by side and measure every pair;
- ``drift``: fail an error that rounding cannot explain, and find where it starts;
- ``divergence``: confirm the failures and name the first divergence;
- ``exercised``: what the inputs never exercised;
- ``faithful``: the recordings held to the truth runs, and the divergence those name;
- ``explain``: the whole explanation of a verdict, in that order.

Import from the modules (``from introspect.diff.ops.eager import record_forward``): this
package re-exports nothing, so importing one part loads no other.
"""
