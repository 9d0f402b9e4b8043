"""Label text: escaping, shapes, counts, and what layout chains and ops are called."""

from __future__ import annotations

import pytest

from introspect.render.labels import (
    compact_count,
    escape,
    layout_title,
    op_title,
    shape_text,
    shorten,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<script>", "&lt;script&gt;"),
        ("a & b", "a &amp; b"),
        ('say "hi"', "say &quot;hi&quot;"),
        ("it's", "it&#39;s"),
        ("bell\x07 tab\tok", "bell tab\tok"),  # XML cannot hold \x07; it is dropped
        ("##apple", "##apple"),
    ],
)
def test_escape(text, expected):
    assert escape(text) == expected


@pytest.mark.parametrize(
    "shape, expected",
    [
        ((2, 9, 768), "(2, 9, 768)"),
        ((9,), "(9,)"),
        ((), "()"),
        (None, ""),
    ],
)
def test_shape_text(shape, expected):
    assert shape_text(shape) == expected


def test_compact_count_and_shorten():
    assert [compact_count(n) for n in (590, 16_512, 23_440_896, 1_000_000)] == [
        "590",
        "16.5K",
        "23.4M",
        "1M",
    ]
    assert shorten("abcdef", 4) == "abc…" and shorten("abc", 4) == "abc"


@pytest.mark.parametrize(
    "ops, before, after, expected",
    [
        (["view", "transpose"], (2, 9, 768), (2, 12, 9, 64), "split heads"),
        (["view"], (2, 9, 768), (2, 9, 12, 64), "split heads"),
        (["view", "transpose", "transpose"], (2, 9, 768), (2, 12, 64, 9), "split heads, transpose"),
        (
            ["reshape", "transpose", "contiguous", "reshape"],
            (2, 12, 9, 64),
            (2, 9, 768),
            "merge heads",
        ),
        (["transpose"], (2, 12, 9, 64), (2, 12, 64, 9), "transpose"),
        (["squeeze", "contiguous"], (2, 9, 1), (2, 9), "squeeze"),
        (["contiguous"], (2, 9), (2, 9), "layout (shape unchanged)"),
        (["view"], (2, 3, 4), (6, 4), "flatten"),
        (["view"], (2, 1), (1, 2), "reshape"),  # multiple choice: (B·C, 1) -> (B, C)
        (["view"], (1, 2, 8), (2, 8), "squeeze"),
        (["view", "permute"], None, (2, 3), "view → permute"),
    ],
)
def test_layout_title(ops, before, after, expected):
    assert layout_title(ops, before, after) == expected


def test_split_heads_when_batch_equals_heads():
    # bert-tiny: B = nh = 2; the shapes still say which dim is which
    assert layout_title(["view", "transpose"], (2, 8, 128), (2, 2, 8, 64)) == "split heads"


def test_op_title():
    assert op_title("scaled_dot_product_attention", "x", [], None) == "scaled dot-product attention"
    assert op_title("getitem", "bert.pooler", [(2, 9, 768)], (2, 768)) == "select [CLS] (token 0)"
    assert (
        op_title("getitem", "bert.embeddings", [(1, 512)], (1, 9), ["bert_embeddings_position_ids"])
        == "position_ids[:, :S]"
    )
    assert op_title("tanh", "x", [], None) == "tanh"
