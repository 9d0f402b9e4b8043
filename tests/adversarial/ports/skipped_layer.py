"""A layer loop that leaves a layer out: ``faulty_first`` starts at block 1 (``range(1,
n)``), ``faulty_middle`` steps over block N; ``correct`` runs them all."""

import adv_bert


class Bert(adv_bert.Bert):
    skip: int | None = None

    def forward(self, input_ids, token_type_ids, attention_mask):
        mask = attention_mask[:, None, None, :].bool()
        x = self.embed(input_ids, token_type_ids)
        for i, block in enumerate(self.blocks):
            if i != self.skip:
                x = block(x, mask)
        return {"last_hidden_state": x, "pooler_output": self.pool(x[:, 0]).tanh()}


def _build(reference, skip):
    model = adv_bert.load(Bert(reference.config), reference)
    model.skip = skip
    return model


def correct(reference):
    return _build(reference, None)


def faulty_first(reference):
    return _build(reference, 0)


def faulty_middle(reference):
    return _build(reference, adv_bert.fault_layer(reference))
