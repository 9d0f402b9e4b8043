"""A Llama whose modules hold two layers each (``pairs.k.first`` is layer 2k,
``pairs.k.second`` layer 2k+1), built of ``llama_key_map``'s blocks, as a port that runs
its decoder in pairs does. ``load(reference, slips)``: ``slips`` maps a (layer, weight of
the block) to the HF layer its values are read from (an off-by-one in the key map)."""

import torch
from llama_key_map import KEYS, Block, RMSNorm, keep_rope_table
from torch import nn


class Pair(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.first, self.second = Block(config), Block(config)

    def forward(self, x, cos, sin):
        return self.second(self.first(x, cos, sin), cos, sin)


class PairedLlama(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.pairs = nn.ModuleList(Pair(config) for _ in range(config.num_hidden_layers // 2))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        keep_rope_table(self, config)

    def forward(self, input_ids, attention_mask=None):
        t = input_ids.shape[1]
        x = self.tok_embeddings(input_ids)
        for pair in self.pairs:
            x = pair(x, self.cos[:t], self.sin[:t])
        return {"last_hidden_state": self.norm(x)}


def load(reference, slips=None):
    slips = slips or {}
    state = reference.state_dict()
    model = PairedLlama(reference.config)
    with torch.no_grad():
        model.tok_embeddings.weight.copy_(state["embed_tokens.weight"])
        model.norm.weight.copy_(state["norm.weight"])
        for k, pair in enumerate(model.pairs):
            for j, block in enumerate((pair.first, pair.second)):
                layer = 2 * k + j
                for mine, theirs in KEYS.items():
                    source = slips.get((layer, mine), layer)
                    block.get_submodule(mine).weight.copy_(
                        state[f"layers.{source}.{theirs}.weight"])
    return model.eval()


def correct(reference):
    return load(reference)


def second_half_from_layer_1(reference):  # pairs.1.second, layer 3, holds layer 1's
    return load(reference, {(3, key): 1 for key in KEYS})


def second_half_from_first(reference):  # pairs.1.second holds layer 2's, as pairs.1.first
    return load(reference, {(3, key): 2 for key in KEYS})


def wo_of_second_from_first(reference):
    return load(reference, {(3, "attn.wo"): 2})


def wo_of_first_from_pair_before(reference):
    return load(reference, {(2, "attn.wo"): 1})
