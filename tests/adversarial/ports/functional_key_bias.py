"""A fairseq-style BERT (probe round t, port 12): hidden states kept (S, B, H), heads
folded into the batch (B*nh, S, d), scores by ``torch.baddbmm``, every layer written as
functions over its own parameters. The attention is no module: the layer is the only
module holding the key.

Correct: layer 3's key without its bias (``F.linear(x, w)``: the softmax over the keys
takes away the constant ``q · b`` each query's scores gain).
Faulty: layer 3's key scaled by 1 + 1e-5 (every score moves; the layer within its
budget); the key without its bias and, where the key is float32 only, scaled by 1 + 1e-5
(an extra op), or multiplied by a number picked by its dtype (1 + 1e-5 in float32, 1 in
float64): right in float64, where the layer is checked, and wrong as the user runs it;
the key without its bias in layer 3 beside a tanh GELU in layer 2."""

import torch
import torch.nn.functional as F
from torch import nn


class Layer(nn.Module):
    def __init__(self, sd, i, c, key="bias", tanh=False):
        super().__init__()
        p = f"encoder.layer.{i}."

        def get(k):
            return nn.Parameter(sd[p + k].clone())

        names = {"q": "attention.self.query", "k": "attention.self.key",
                 "v": "attention.self.value", "o": "attention.output.dense",
                 "ln1": "attention.output.LayerNorm", "fc1": "intermediate.dense",
                 "fc2": "output.dense", "ln2": "output.LayerNorm"}
        for short, long in names.items():
            setattr(self, f"{short}_w", get(f"{long}.weight"))
            setattr(self, f"{short}_b", get(f"{long}.bias"))
        self.nh, self.eps, self.key, self.tanh = c.num_attention_heads, c.layer_norm_eps, key, tanh

    def keys(self, x):
        if self.key == "bias":
            return F.linear(x, self.k_w, self.k_b)
        k = F.linear(x, self.k_w)  # no bias: the softmax takes it away
        if self.key == "scaled":
            return F.linear(x, self.k_w, self.k_b) * (1 + 1e-5)
        if self.key == "extra_op_in_float32" and k.dtype == torch.float32:
            k = k * (1 + 1e-5)
        if self.key == "number_by_dtype":
            k = k * (1 + 1e-5 if k.dtype == torch.float32 else 1.0)
        if self.key == "in_bfloat16":  # (a float32 run's fault alone: float64's is exact)
            k = F.linear(x.bfloat16(), self.k_w.bfloat16()).to(x.dtype)
        return k

    def forward(self, x, mask_bhs):  # x: (S, B, H); mask_bhs: (B*nh, 1, S) additive
        S, B, H = x.shape
        nh, d = self.nh, H // self.nh
        q = F.linear(x, self.q_w, self.q_b) * (d ** -0.5)
        k = self.keys(x)
        v = F.linear(x, self.v_w, self.v_b)

        def fold(t):
            return t.contiguous().view(S, B * nh, d).transpose(0, 1)  # (B*nh, S, d)

        q, k, v = fold(q), fold(k), fold(v)
        scores = torch.baddbmm(mask_bhs.expand(B * nh, S, S), q, k.transpose(1, 2))
        ctx = torch.bmm(F.softmax(scores, dim=-1), v)
        ctx = ctx.transpose(0, 1).contiguous().view(S, B, H)
        x = F.layer_norm(x + F.linear(ctx, self.o_w, self.o_b), (H,), self.ln1_w, self.ln1_b,
                         self.eps)
        h = F.linear(x, self.fc1_w, self.fc1_b)
        h = F.gelu(h, approximate="tanh" if self.tanh else "none")
        y = F.linear(h, self.fc2_w, self.fc2_b)
        return F.layer_norm(x + y, (H,), self.ln2_w, self.ln2_b, self.eps)


class Bert(nn.Module):
    def __init__(self, loaded, key=None, tanh_layer=None):
        super().__init__()
        sd, c = loaded.model.state_dict(), loaded.config
        self.tok = nn.Parameter(sd["embeddings.word_embeddings.weight"].clone())
        self.pos = nn.Parameter(sd["embeddings.position_embeddings.weight"].clone())
        self.seg = nn.Parameter(sd["embeddings.token_type_embeddings.weight"].clone())
        self.emb_ln_w = nn.Parameter(sd["embeddings.LayerNorm.weight"].clone())
        self.emb_ln_b = nn.Parameter(sd["embeddings.LayerNorm.bias"].clone())
        self.layers = nn.ModuleList(
            Layer(sd, i, c, key if i == 3 and key else "bias", tanh=i == tanh_layer)
            for i in range(c.num_hidden_layers))
        self.pool_w = nn.Parameter(sd["pooler.dense.weight"].clone())
        self.pool_b = nn.Parameter(sd["pooler.dense.bias"].clone())
        self.nh, self.eps = c.num_attention_heads, c.layer_norm_eps

    def forward(self, input_ids, token_type_ids, attention_mask):
        B, S = input_ids.shape
        ids, tt = input_ids.t(), token_type_ids.t()  # (S, B)
        x = self.tok[ids] + self.seg[tt] + self.pos[:S, None, :]
        x = F.layer_norm(x, (x.shape[-1],), self.emb_ln_w, self.emb_ln_b, self.eps)
        m = (1.0 - attention_mask.float()) * torch.finfo(torch.float32).min  # (B, S)
        m = m[:, None, None, :].expand(B, self.nh, 1, S).reshape(B * self.nh, 1, S)
        for layer in self.layers:
            x = layer(x, m)
        x = x.transpose(0, 1)  # back to (B, S, H)
        return {"last_hidden_state": x,
                "pooler_output": torch.tanh(F.linear(x[:, 0], self.pool_w, self.pool_b))}


def correct(loaded):
    return Bert(loaded).eval()


def key_bias_left_out(loaded):
    return Bert(loaded, key="no_bias").eval()


def faulty_key_scaled(loaded):
    return Bert(loaded, key="scaled").eval()


def faulty_key_extra_op_in_float32(loaded):
    return Bert(loaded, key="extra_op_in_float32").eval()


def faulty_key_number_by_dtype(loaded):
    return Bert(loaded, key="number_by_dtype").eval()


def faulty_key_in_bfloat16(loaded):
    return Bert(loaded, key="in_bfloat16").eval()


def faulty_tanh_beside_key_bias_left_out(loaded):
    return Bert(loaded, key="no_bias", tanh_layer=2).eval()
