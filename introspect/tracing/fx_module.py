"""GraphModules whose Python code is generated when it is first needed, not when built.

torch.fx generates and compiles a GraphModule's ``forward`` as soon as the module is
built: a fifth of a trace-cache hit from disk on BERT-base, and wasted wherever the graph
is only read (tables, drawings) or run node by node (the diff's Interpreter never calls
``forward``). torch's ``_LazyGraphModule`` defers that work to the first call or the
first look at ``.code``; torch marks it as not backward compatible, so where a torch
lacks it the plain GraphModule, which generates its code at once, is built instead.
"""

from __future__ import annotations

import torch
import torch.fx

try:
    from torch.fx._lazy_graph_module import _LazyGraphModule as _GraphModuleClass
except ImportError:  # pragma: no cover - torch without it: code generated at once
    _GraphModuleClass = torch.fx.GraphModule  # type: ignore[assignment, misc]


def build_graph_module(root: torch.nn.Module, graph: torch.fx.Graph,
                       class_name: str) -> torch.fx.GraphModule:
    """A GraphModule running ``graph`` on ``root``'s modules and tensors (code deferred)."""
    return _GraphModuleClass(root, graph, class_name=class_name)


__all__ = ["build_graph_module"]
