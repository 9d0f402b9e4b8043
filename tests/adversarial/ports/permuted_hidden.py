"""A BERT port whose hidden dimension is permuted throughout (probe round i): every weight
permuted alike, the last hidden state put back in the reference's order at the end. Nothing
of it pairs with the reference by its weights or its values, only its outputs
(the plain BERT of ``index_slip.py``, permuted).
``correct`` computes the reference's function; ``ln2_of_layer_3_unpermuted`` leaves layer
3's last LayerNorm in the reference's order (a fault in layer 3), and
``embedding_norm_unpermuted`` the embeddings' LayerNorm (a fault in the embeddings)."""

import torch
from index_slip import Bert, port  # the plain BERT of probe round i, loaded by a key map


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
