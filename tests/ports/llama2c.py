"""Llama as llama2.c's ``model.py`` writes it, with HF weights mapped as its export does.

Imports nothing from introspect; written here in that repository's style, not copied.
What makes it llama2.c:

- ``Attention`` with ``wq``, ``wk``, ``wv``, ``wo``; heads kept as (bs, seqlen, nh, hd)
  until the attention itself; ``repeat_kv`` by ``expand`` + ``reshape`` for grouped
  key/value heads;
- rotary embeddings on *interleaved* pairs (dims 2i, 2i+1): ``precompute_freqs_cis``
  gives cos and sin tables (buffers), ``apply_rotary_emb`` splits the last axis into
  (real, imaginary) with ``reshape(..., -1, 2).unbind(-1)`` and stacks it back;
- ``RMSNorm`` by hand (``x * rsqrt(mean(x²) + eps)`` in float32, then the weight);
- ``FeedForward`` with ``w1`` (gate), ``w2`` (down), ``w3`` (up): ``w2(silu(w1 x) * w3 x)``;
- two attention paths as llama2.c has them: ``F.scaled_dot_product_attention(is_causal=
  True)`` ("flash"), and scores + a ``-inf`` upper-triangle buffer ``mask`` with an
  explicit softmax, taken here when an ``attention_mask`` (padding) is given.

HF's Llama rotates *half-split* pairs (i, i + hd/2). llama2.c's export script therefore
permutes the rows of ``q_proj`` and ``k_proj`` within each head when it maps HF weights
(``view(nh, 2, hd/2, dim).transpose(1, 2)``), so that its interleaved rotary computes the
same attention: the port's q and k differ from HF's by that permutation, its attention
scores, outputs and logits do not.

``build_half_split`` is the other way to load HF weights into this model: keep HF's rows
and rotate half-split pairs instead, still in llama2.c's (bs, seqlen, nh, hd) layout.

llama2.c takes no attention mask; ``forward`` here also takes ``attention_mask`` and fills
padded keys with ``finfo.min``, so real tokens see what HF's see.

Faults (each in layer ``layer``):

- ``unpermuted``: ``wq``/``wk`` loaded as HF stores them, not permuted for the
  interleaved rotary (the classic export bug);
- ``rotary_model_dim``: the layer's cos/sin tables computed for the model's width instead
  of the head's (``precompute_freqs_cis(dim, ...)``), so its pairs turn at other speeds.
  (Reading the tables from another start position is no fault: attention sees only
  differences of positions);
- ``gqa_tiled``: key/value heads repeated as 0,1,0,1 (``repeat``) instead of 0,0,1,1;
- ``rms_eps``: ``attention_norm`` with eps 1e-5, llama2.c's default, where HF's config has
  ``rms_norm_eps`` 1e-6;
- ``rms_eps_3e6``: ``attention_norm`` with eps 3e-6 for HF's 1e-6, a slip that moves the
  norm by a few times its float32 rounding;
- ``silu_typed_e``: SiLU written ``x / (1 + 2.7183 ** -x)``, e typed to four places;
- ``no_causal_mask``: the padding mask only;
- ``w1_w3_swapped``: ``silu`` on the up projection instead of the gate;
- ``scale_1_over_d``: scores divided by hd instead of sqrt(hd);
- ``missing_residual``: the attention's output replaces the residual stream.

A slip in the code between the blocks (``GLUE_SLIPS``):

- ``handed_scaled``: the loop hands block ``layer`` the residual stream scaled by
  1 + 2e-6 (a temperature left in); every block agrees on the reference's inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

FAULTS = ("unpermuted", "rotary_model_dim", "gqa_tiled", "rms_eps", "no_causal_mask",
          "w1_w3_swapped", "scale_1_over_d", "missing_residual")
# slips a few times float32's rounding (below); not among ``FAULTS``, which each move the
# outputs measurably on any checkpoint
SLIPS = ("rms_eps_3e6", "silu_typed_e")
GLUE_SLIPS = ("handed_scaled",)


@dataclass
class ModelArgs:
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int | None = None  # None: as many as n_heads
    vocab_size: int = 32000
    hidden_dim: int | None = None  # the FeedForward's width
    norm_eps: float = 1e-5
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    dropout: float = 0.0
    output: bool = True  # False: return the final norm's output (an HF LlamaModel)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0):
    """cos and sin of position * frequency, (end, dim / 2), one frequency per pair."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()  # (end, dim / 2)
    return torch.cos(freqs), torch.sin(freqs)


def reshape_for_broadcast(freqs_cis: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(seqlen, hd/2) -> (1, seqlen, 1, hd/2), to meet x of (bs, seqlen, nh, hd/2)."""
    ndim = x.ndim
    assert freqs_cis.shape == (x.shape[1], x.shape[-1])
    shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(shape)


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cos: torch.Tensor,
                     freqs_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # pairs (2i, 2i+1) as (real, imaginary): (bs, seqlen, nh, hd/2) each
    xq_r, xq_i = xq.float().reshape(xq.shape[:-1] + (-1, 2)).unbind(-1)
    xk_r, xk_i = xk.float().reshape(xk.shape[:-1] + (-1, 2)).unbind(-1)
    freqs_cos = reshape_for_broadcast(freqs_cos, xq_r)
    freqs_sin = reshape_for_broadcast(freqs_sin, xq_r)
    # a complex multiplication by cos + i sin, written out
    xq_out_r = xq_r * freqs_cos - xq_i * freqs_sin
    xq_out_i = xq_r * freqs_sin + xq_i * freqs_cos
    xk_out_r = xk_r * freqs_cos - xk_i * freqs_sin
    xk_out_i = xk_r * freqs_sin + xk_i * freqs_cos
    # interleave the halves again: (bs, seqlen, nh, hd/2, 2) -> (bs, seqlen, nh, hd)
    xq_out = torch.stack([xq_out_r, xq_out_i], dim=-1).flatten(3)
    xk_out = torch.stack([xk_out_r, xk_out_i], dim=-1).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def apply_rotary_emb_half(xq: torch.Tensor, xk: torch.Tensor, freqs_cos: torch.Tensor,
                          freqs_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's convention on llama2.c's tables and layout: dims i and i + hd/2 form a pair."""
    cos = torch.cat([freqs_cos, freqs_cos], dim=-1)[None, :, None, :]  # (1, seqlen, 1, hd)
    sin = torch.cat([freqs_sin, freqs_sin], dim=-1)[None, :, None, :]

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        first, second = x.chunk(2, dim=-1)
        return torch.cat([-second, first], dim=-1)

    return ((xq.float() * cos + rotate_half(xq.float()) * sin).type_as(xq),
            (xk.float() * cos + rotate_half(xk.float()) * sin).type_as(xk))


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """torch.repeat_interleave(x, dim=2, repeats=n_rep): kv head j serves heads j*n_rep..."""
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (x[:, :, :, None, :]
            .expand(bs, slen, n_kv_heads, n_rep, head_dim)
            .reshape(bs, slen, n_kv_heads * n_rep, head_dim))


def repeat_kv_tiled(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """The wrong order: heads 0, 1, 0, 1 ... (what ``x.repeat`` gives)."""
    return x.repeat(1, 1, n_rep, 1)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_kv_heads = args.n_heads if args.n_kv_heads is None else args.n_kv_heads
        assert args.n_heads % self.n_kv_heads == 0
        self.n_local_heads = args.n_heads
        self.n_local_kv_heads = self.n_kv_heads
        self.n_rep = self.n_local_heads // self.n_local_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.attn_dropout = nn.Dropout(args.dropout)
        self.resid_dropout = nn.Dropout(args.dropout)
        self.dropout = args.dropout
        self.flash = hasattr(F, "scaled_dot_product_attention")
        mask = torch.full((1, 1, args.max_seq_len, args.max_seq_len), float("-inf"))
        self.register_buffer("mask", torch.triu(mask, diagonal=1), persistent=False)
        self.repeat = repeat_kv
        self.rotary = apply_rotary_emb
        self.causal = True
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def forward(self, x: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        bsz, seqlen, _ = x.shape

        # QKV
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        xq = xq.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)

        # RoPE relative positional embeddings
        xq, xk = self.rotary(xq, xk, freqs_cos, freqs_sin)

        # grouped multiquery attention: expand out keys and values
        xk = self.repeat(xk, self.n_rep)  # (bs, seqlen, n_local_heads, head_dim)
        xv = self.repeat(xv, self.n_rep)  # (bs, seqlen, n_local_heads, head_dim)

        # make heads into a batch dimension
        xq = xq.transpose(1, 2)  # (bs, n_local_heads, seqlen, head_dim)
        xk = xk.transpose(1, 2)
        xv = xv.transpose(1, 2)

        if self.flash and attention_mask is None and self.causal:
            output = F.scaled_dot_product_attention(xq, xk, xv, attn_mask=None, dropout_p=0.0,
                                                    is_causal=True, scale=self.scale)
        else:
            scores = torch.matmul(xq, xk.transpose(2, 3)) * self.scale
            if self.causal:
                scores = scores + self.mask[:, :, :seqlen, :seqlen]  # (bs, nh, seqlen, seqlen)
            if attention_mask is not None:  # padded keys
                padded = attention_mask[:, None, None, :] == 0
                scores = scores.masked_fill(padded, torch.finfo(scores.dtype).min)
            scores = F.softmax(scores.float(), dim=-1).type_as(xq)
            scores = self.attn_dropout(scores)
            output = torch.matmul(scores, xv)  # (bs, n_local_heads, seqlen, head_dim)

        # restore time as batch dimension and concat heads
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)

        # final projection into the residual stream
        return self.resid_dropout(self.wo(output))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, dropout: float) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.gate_on_w1 = True
        self.silu = F.silu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_on_w1:
            return self.dropout(self.w2(self.silu(self.w1(x)) * self.w3(x)))
        return self.dropout(self.w2(self.silu(self.w3(x)) * self.w1(x)))


def silu_typed_e(x: torch.Tensor) -> torch.Tensor:
    return x / (1 + 2.7183 ** -x)


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.dim = args.dim
        self.head_dim = args.dim // args.n_heads
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim or 4 * args.dim, args.dropout)
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.residual = True
        self.handed_scale = 1.0  # what the model's loop scales its input by (a slip)

    def forward(self, x: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        a = self.attention.forward(self.attention_norm(x), freqs_cos, freqs_sin, attention_mask)
        h = x + a if self.residual else a
        return h + self.feed_forward.forward(self.ffn_norm(h))


class Transformer(nn.Module):
    last_loss: torch.Tensor | None

    def __init__(self, params: ModelArgs) -> None:
        super().__init__()
        self.params = params
        self.vocab_size = params.vocab_size
        self.n_layers = params.n_layers

        self.tok_embeddings = nn.Embedding(params.vocab_size, params.dim)
        self.dropout = nn.Dropout(params.dropout)
        self.layers = nn.ModuleList(TransformerBlock(i, params) for i in range(params.n_layers))
        self.norm = RMSNorm(params.dim, eps=params.norm_eps)
        if params.output:
            self.output = nn.Linear(params.dim, params.vocab_size, bias=False)

        # the rotary tables, computed once for every position
        freqs_cos, freqs_sin = precompute_freqs_cis(params.dim // params.n_heads,
                                                    params.max_seq_len, params.rope_theta)
        self.register_buffer("freqs_cos", freqs_cos, persistent=False)
        self.register_buffer("freqs_sin", freqs_sin, persistent=False)
        self.last_loss = None

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        _bsz, seqlen = input_ids.shape
        h = self.tok_embeddings(input_ids)
        h = self.dropout(h)
        freqs_cos = self.freqs_cos[:seqlen]
        freqs_sin = self.freqs_sin[:seqlen]

        for layer in self.layers:
            h = h * layer.handed_scale if layer.handed_scale != 1.0 else h
            if hasattr(layer, "own_cos"):  # a fault: this layer has tables of its own
                h = layer(h, layer.own_cos[:seqlen], layer.own_sin[:seqlen], attention_mask)
            else:
                h = layer(h, freqs_cos, freqs_sin, attention_mask)
        h = self.norm(h)
        self.last_loss = None
        if not self.params.output:
            return h
        return self.output(h)  # every position (llama2.c keeps only the last at inference)


def permute_reverse(w: torch.Tensor, n_heads: int, dim1: int, dim2: int) -> torch.Tensor:
    """HF's half-split rows of each head, (i, i + hd/2), made into interleaved pairs."""
    return w.view(n_heads, 2, dim1 // n_heads // 2, dim2).transpose(1, 2).reshape(dim1, dim2)


def load_hf_model(hf_model: nn.Module, fault: str | None = None, layer: int = 0,
                  permute: bool = True) -> Transformer:
    """llama2.c's export ``load_hf_model``, handed the HF model rather than its folder
    (``permute=False``: q/k rows as HF stores them, for the half-split rotary)."""
    config = hf_model.config
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"llama2.c's rotary has no scaling; this config's is {rope}")
    head = hasattr(hf_model, "lm_head")
    args = ModelArgs(dim=config.hidden_size, n_layers=config.num_hidden_layers,
                     n_heads=config.num_attention_heads, n_kv_heads=config.num_key_value_heads,
                     vocab_size=config.vocab_size, hidden_dim=config.intermediate_size,
                     norm_eps=config.rms_norm_eps, max_seq_len=config.max_position_embeddings,
                     rope_theta=theta, output=head)
    assert config.hidden_size // config.num_attention_heads == getattr(
        config, "head_dim", config.hidden_size // config.num_attention_heads)
    hf_dict = hf_model.state_dict()
    prefix = "model." if head else ""
    model = Transformer(args)
    kv_dim = args.dim // args.n_heads * (args.n_kv_heads or args.n_heads)

    def take(key: str, target: nn.Parameter, w: torch.Tensor | None = None) -> None:
        w = hf_dict[key] if w is None else w
        assert w.shape == target.shape, (key, tuple(w.shape), tuple(target.shape))
        target.copy_(w)

    with torch.no_grad():
        take(prefix + "embed_tokens.weight", model.tok_embeddings.weight)
        take(prefix + "norm.weight", model.norm.weight)
        for i, block in enumerate(model.layers):
            hf = f"{prefix}layers.{i}."
            keep = not permute or (fault == "unpermuted" and i == layer)
            wq = hf_dict[hf + "self_attn.q_proj.weight"]
            wk = hf_dict[hf + "self_attn.k_proj.weight"]
            take(hf + "input_layernorm.weight", block.attention_norm.weight)
            take(hf + "self_attn.q_proj.weight", block.attention.wq.weight,
                 wq if keep else permute_reverse(wq, args.n_heads, args.dim, args.dim))
            take(hf + "self_attn.k_proj.weight", block.attention.wk.weight,
                 wk if keep else permute_reverse(wk, args.n_kv_heads, kv_dim, args.dim))
            take(hf + "self_attn.v_proj.weight", block.attention.wv.weight)
            take(hf + "self_attn.o_proj.weight", block.attention.wo.weight)
            take(hf + "post_attention_layernorm.weight", block.ffn_norm.weight)
            take(hf + "mlp.gate_proj.weight", block.feed_forward.w1.weight)
            take(hf + "mlp.down_proj.weight", block.feed_forward.w2.weight)
            take(hf + "mlp.up_proj.weight", block.feed_forward.w3.weight)
        if head:
            take("lm_head.weight", model.output.weight)
    return model


def build(reference: nn.Module, fault: str | None = None, layer: int = 0, *,
          rotary: str = "interleaved") -> nn.Module:
    """The port holding ``reference``'s weights (HF ``LlamaModel`` or ``LlamaForCausalLM``),
    with ``fault`` in layer ``layer``; ``rotary="half"``: see ``build_half_split``."""
    if fault is not None and fault not in FAULTS + SLIPS + GLUE_SLIPS \
            or rotary == "half" and fault == "unpermuted":
        raise ValueError(f"unknown fault {fault!r}; one of "
                         f"{', '.join(FAULTS + SLIPS + GLUE_SLIPS)}")
    if not isinstance(reference, nn.Module):  # the CLI hands over its loaded reference
        reference = reference.model
    model = load_hf_model(reference, fault, layer, permute=rotary == "interleaved")
    if rotary == "half":
        for b in model.layers:
            b.attention.rotary = apply_rotary_emb_half
    block = model.layers[layer]
    if fault == "rotary_model_dim":
        cos, sin = precompute_freqs_cis(model.params.dim, model.params.max_seq_len,
                                        model.params.rope_theta)  # the model's dim
        block.register_buffer("own_cos", cos[:, :block.head_dim // 2], persistent=False)
        block.register_buffer("own_sin", sin[:, :block.head_dim // 2], persistent=False)
    elif fault == "gqa_tiled":
        block.attention.repeat = repeat_kv_tiled
    elif fault == "rms_eps":
        block.attention_norm.eps = 1e-5
    elif fault == "rms_eps_3e6":
        block.attention_norm.eps = 3e-6
    elif fault == "silu_typed_e":
        block.feed_forward.silu = silu_typed_e
    elif fault == "no_causal_mask":
        block.attention.causal = False
    elif fault == "w1_w3_swapped":
        block.feed_forward.gate_on_w1 = False
    elif fault == "scale_1_over_d":
        block.attention.scale = 1.0 / block.attention.head_dim
    elif fault == "missing_residual":
        block.residual = False
    elif fault == "handed_scaled":
        block.handed_scale = 1.0 + 2e-6
    return model.eval()


def build_half_split(reference: nn.Module, fault: str | None = None,
                     layer: int = 0) -> nn.Module:
    """llama2.c's model with HF's half-split rotary in its own (bs, seqlen, nh, hd) layout
    and HF's q/k rows unpermuted: how people port it who fix the rotary, not the weights."""
    return build(reference, fault, layer, rotary="half")
