"""The Llama port of examples/large, built the usual way: its own weights, values copied in.

The counter-example of the large-model test: ``load_state_dict`` without ``assign`` copies
every reference weight into memory the port allocated, so the diff holds two models.
"""

import importlib.util
import sys
from pathlib import Path

import torch

_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "large" / "llama_port.py"
_spec = importlib.util.spec_from_file_location("large_llama_port", _EXAMPLE)
llama_port = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = llama_port  # its dataclass looks its module up there
_spec.loader.exec_module(llama_port)


def build(reference):
    c = reference.config
    args = llama_port.LlamaArgs(dim=c.hidden_size, n_layers=c.num_hidden_layers,
                                n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads,
                                hidden_dim=c.intermediate_size, vocab_size=c.vocab_size,
                                norm_eps=c.rms_norm_eps)
    model = llama_port.Llama(args).to(torch.bfloat16)
    model.load_state_dict({llama_port.hf_to_port(k): v
                           for k, v in reference.model.state_dict().items()})
    return model.eval()
