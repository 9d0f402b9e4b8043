"""Small decoders built as users build them (cache on by default), with every LayerNorm,
RMSNorm and bias perturbed so that a fault cannot hide behind (1, 0) and zeros."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PROMPT = torch.tensor([[1, 5, 7, 9, 3]])


def _perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "ln" in name or "norm" in name or name.endswith("bias"):
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


@pytest.fixture(scope="session")
def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64,
                            bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    assert model.config.use_cache  # as users build it
    return _perturbed(model, 1)


@pytest.fixture(scope="session")
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, vocab_size=100,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = LlamaForCausalLM(config)
    assert model.config.use_cache
    return _perturbed(model, 2)


@pytest.fixture(scope="session")
def gpt2_example():
    """examples/generation/gpt2_cached.py, imported from its file as a user would."""
    path = ROOT / "examples" / "generation" / "gpt2_cached.py"
    spec = importlib.util.spec_from_file_location("gpt2_cached_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module
