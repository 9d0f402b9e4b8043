"""A BERT port whose hidden dimension is permuted throughout (probe round i): every weight
permuted alike, the last hidden state put back in the reference's order at the end. Nothing
of it pairs with the reference by its weights or its values, only its outputs.
``correct`` computes the reference's function; ``ln2_of_layer_3_unpermuted`` leaves layer
3's last LayerNorm in the reference's order (a fault in layer 3), and
``embedding_norm_unpermuted`` the embeddings' LayerNorm (a fault in the embeddings)."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        H = c.hidden_size
        self.nh, self.hd = c.num_attention_heads, H // c.num_attention_heads
        self.q, self.k, self.v, self.o = (nn.Linear(H, H) for _ in range(4))
        self.ln1 = nn.LayerNorm(H, eps=c.layer_norm_eps)
        self.up = nn.Linear(H, c.intermediate_size)
        self.down = nn.Linear(c.intermediate_size, H)
        self.ln2 = nn.LayerNorm(H, eps=c.layer_norm_eps)

    def forward(self, x, mask_add):
        B, S, H = x.shape

        def sp(t):
            return t.view(B, S, self.nh, self.hd).transpose(1, 2)

        q, k, v = sp(self.q(x)), sp(self.k(x)), sp(self.v(x))
        p = (q @ k.transpose(-1, -2) / math.sqrt(self.hd) + mask_add).softmax(-1)
        a = (p @ v).transpose(1, 2).reshape(B, S, H)
        x = self.ln1(x + self.o(a))
        return self.ln2(x + self.down(F.gelu(self.up(x))))


class Bert(nn.Module):
    def __init__(self, c):
        super().__init__()
        H = c.hidden_size
        self.word = nn.Embedding(c.vocab_size, H)
        self.pos = nn.Embedding(c.max_position_embeddings, H)
        self.typ = nn.Embedding(c.type_vocab_size, H)
        self.ln = nn.LayerNorm(H, eps=c.layer_norm_eps)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))
        self.pool = nn.Linear(H, H)

    def forward(self, input_ids, attention_mask, token_type_ids):
        S = input_ids.shape[1]
        x = self.ln(self.word(input_ids) + self.typ(token_type_ids) + self.pos.weight[:S])
        mask_add = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, mask_add)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


NAMES = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
         "o": "attention.output.dense", "ln1": "attention.output.LayerNorm",
         "up": "intermediate.dense", "down": "output.dense", "ln2": "output.LayerNorm"}
FIXED = {"word": "embeddings.word_embeddings", "pos": "embeddings.position_embeddings",
         "typ": "embeddings.token_type_embeddings", "ln": "embeddings.LayerNorm",
         "pool": "pooler.dense"}


def port(ref):
    sd = ref.state_dict()
    model = Bert(ref.config)
    state = {}
    for name in model.state_dict():
        mod, _, leaf = name.rpartition(".")
        if mod in FIXED:
            state[name] = sd[f"{FIXED[mod]}.{leaf}"].clone()
        else:
            _, i, part = mod.split(".")
            state[name] = sd[f"encoder.layer.{i}.{NAMES[part]}.{leaf}"].clone()
    model.load_state_dict(state)
    return model.eval()


class PermBert(Bert):
    def forward(self, input_ids, attention_mask, token_type_ids):
        out = super().forward(input_ids, attention_mask, token_type_ids)
        return {"last_hidden_state": out["last_hidden_state"][..., self.inv],
                "pooler_output": out["pooler_output"]}


def permuted(ref, skip=None):
    cand = port(ref)
    cand.__class__ = PermBert
    H = ref.config.hidden_size
    P = torch.randperm(H, generator=torch.Generator().manual_seed(5))
    cand.register_buffer("inv", torch.argsort(P))
    with torch.no_grad():
        for emb in (cand.word, cand.pos, cand.typ):
            emb.weight.copy_(emb.weight[:, P])
        if skip != "embeddings":
            cand.ln.weight.copy_(cand.ln.weight[P])
            cand.ln.bias.copy_(cand.ln.bias[P])
        for i, L in enumerate(cand.layers):
            for lin in (L.q, L.k, L.v, L.up):
                lin.weight.copy_(lin.weight[:, P])
            for lin in (L.o, L.down):
                lin.weight.copy_(lin.weight[P])
                lin.bias.copy_(lin.bias[P])
            for nm in ("ln1", "ln2"):
                if (i, nm) == skip:
                    continue
                ln = getattr(L, nm)
                ln.weight.copy_(ln.weight[P])
                ln.bias.copy_(ln.bias[P])
        cand.pool.weight.copy_(cand.pool.weight[:, P])
    return cand


def correct(reference):
    return permuted(reference.model)


def ln2_of_layer_3_unpermuted(reference):
    return permuted(reference.model, skip=(3, "ln2"))


def embedding_norm_unpermuted(reference):
    return permuted(reference.model, skip="embeddings")
