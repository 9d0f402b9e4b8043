"""A nanoGPT-style GPT-2 (its blocks named as HF's: ``h.N.ln_1``, ``h.N.c_attn``, ...; HF's
Conv1D weights copied in transposed), whose first LayerNorm of each block has its gain and
shift folded into the fused q/k/v Linear after it: ln_1(x) @ W^T + b is
norm(x) @ (W * g)^T + (b + W @ beta). Its ``ln_1`` weights keep HF's names and hold other
values (ones and zeros), so they relate to the reference's by name only (probe round j).

Correct: ``correct``, ``folded`` (gain and shift), ``gain_folded`` (the gain alone; the
shift divided by it stays). Faulty: ``gain_unloaded`` (every ln_1 gain left at 1, nothing
folded), ``folded_shift_forgotten`` (block 2 folds the gain and drops the shift),
``folded_gain_off`` (block 1's fold scales by the gain times 1 + 1e-4)."""

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width, heads, eps):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width, eps=eps)
        self.c_attn = nn.Linear(width, 3 * width)
        self.attn_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width, eps=eps)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, 2)
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.h = nn.ModuleList(Block(config.n_embd, config.n_head, config.layer_norm_epsilon)
                               for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)

    def forward(self, input_ids, attention_mask=None):
        x = self.wte(input_ids) + self.wpe(torch.arange(input_ids.shape[1]))[None]
        for block in self.h:
            x = block(x)
        return {"last_hidden_state": self.ln_f(x)}


_NAMES = {"ln_1": "ln_1", "ln_2": "ln_2", "c_attn": "attn.c_attn", "attn_proj": "attn.c_proj",
          "c_fc": "mlp.c_fc", "mlp_proj": "mlp.c_proj"}


def correct(reference):
    theirs = reference.state_dict()
    model = GPT(reference.config)
    with torch.no_grad():
        for name in ("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"):
            model.get_parameter(name).copy_(theirs[name])
        for i, block in enumerate(model.h):
            for mine, hf in _NAMES.items():
                module, weight = getattr(block, mine), theirs[f"h.{i}.{hf}.weight"]
                module.weight.copy_(weight.t() if weight.ndim == 2 else weight)  # (Conv1D)
                module.bias.copy_(theirs[f"h.{i}.{hf}.bias"])
    return model.eval()


def _fold(model, shift=True, off=None):
    with torch.no_grad():
        for i, block in enumerate(model.h):
            gain, beta = block.ln_1.weight.clone(), block.ln_1.bias.clone()
            weight = block.c_attn.weight.clone()
            if shift:
                block.c_attn.bias.add_(weight @ beta)
                block.ln_1.bias.zero_()
            else:
                block.ln_1.bias.copy_(beta / gain)
            block.c_attn.weight.mul_(gain * (1.0 + 1e-4) if i == off else gain)
            block.ln_1.weight.fill_(1.0)
    return model


def folded(reference):
    return _fold(correct(reference))


def gain_folded(reference):
    return _fold(correct(reference), shift=False)


def gain_unloaded(reference):
    model = correct(reference)
    with torch.no_grad():
        for block in model.h:
            block.ln_1.weight.fill_(1.0)
    return model


def folded_shift_forgotten(reference):
    model = folded(reference)
    with torch.no_grad():
        block = model.h[2]
        block.c_attn.bias.sub_(block.c_attn.weight @ (reference.h[2].ln_1.bias
                                                      / reference.h[2].ln_1.weight))
    return model


def folded_gain_off(reference):
    return _fold(correct(reference), off=1)
