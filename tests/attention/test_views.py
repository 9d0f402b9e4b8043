"""Static pictures: golden SVGs, escaped labels, and long inputs that stay readable.

Golden files live in tests/attention/golden/; after a deliberate change, regenerate them
with ``INTROSPECT_UPDATE_GOLDEN=1 pytest tests/attention`` and review the diff.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import torch

import introspect
from introspect.attention.maps import AttentionMaps
from introspect.attention.views import (
    HEAD_VIEW_MAX_TOKENS,
    MATRIX_MAX_TOKENS,
    render_view,
    thumbnail_pixels,
)
from introspect.errors import InputError
from tests.bounds import close
from tests.golden import check_golden

from .conftest import HOSTILE_TEXT

GOLDEN = Path(__file__).parent / "golden"
SVG = "{http://www.w3.org/2000/svg}"


@pytest.mark.parametrize("view", ["head", "matrix", "model"])
def test_golden_svg_of_bert_tiny(tiny_short_maps, view):
    svg = tiny_short_maps.svg(view, layers=[1] if view != "model" else None,
                              heads=[0, 1] if view != "model" else None)
    check_golden(GOLDEN / f"bert_tiny_{view}.svg", svg)
    assert svg == tiny_short_maps.svg(view, layers=[1] if view != "model" else None,
                                      heads=[0, 1] if view != "model" else None)


def test_head_view_draws_every_token_twice_and_a_line_per_weight(tiny_short_maps):
    root = ElementTree.fromstring(tiny_short_maps.svg("head", layers=[0], heads=[1]))
    texts = [t.text for t in root.iter(f"{SVG}text")]
    for token in tiny_short_maps.real_tokens(0):
        assert texts.count(token) == 2, token
    lines = list(root.iter(f"{SVG}line"))
    weights = tiny_short_maps.head(0, 1)
    assert len(lines) == int((weights >= 0.01).sum())
    first = float(lines[0].get("stroke-opacity"))
    # written as {w:.3f}: half its last digit off at most (a bound that is exact, not tuned)
    assert abs(first - float(weights[0, 0])) <= 5e-4


def test_padding_is_never_drawn(tiny_models):
    loaded = tiny_models("base", "sdpa")
    maps = introspect.attention(loaded.model, introspect.tokenize(
        loaded.tokenizer, ["I love cats!", "He hates pineapple pizza."]))
    for view in ("head", "matrix"):
        svg = maps.svg(view, batch=0)
        assert "[PAD]" not in svg
        assert svg.count("[SEP]") >= 1


def test_hostile_tokens_are_escaped(tiny_models):
    loaded = tiny_models("base", "sdpa")
    inputs = introspect.tokenize(loaded.tokenizer, [HOSTILE_TEXT])
    maps = introspect.attention(loaded.model, inputs, title="a <b> & \"c\"")
    for view in ("head", "matrix", "model"):
        svg = maps.svg(view)
        root = ElementTree.fromstring(svg)  # well-formed XML
        assert "<script" not in svg and "<b>" not in svg
        assert "&lt;" in svg and "&amp;" in svg and "&quot;" in svg
        assert root.find(f"{SVG}script") is None
        text = " ".join(root.itertext())
        assert "script" in text and "&" in text  # the tokens are shown, as text


def _long_maps(n: int, layers: int = 1, heads: int = 1) -> AttentionMaps:
    generator = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(layers, 1, heads, n, n, generator=generator), dim=-1)
    tokens = (tuple(f"t{i}" for i in range(n)),)
    return AttentionMaps(probs, tokens, torch.ones(1, n, dtype=torch.bool), title="long")


def test_512_tokens_head_view_is_cropped_with_a_notice():
    maps = _long_maps(512)
    root = ElementTree.fromstring(maps.svg("head"))
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert any("showing tokens 0 to 63 of 512" in t for t in texts)
    assert texts.count("t63") == 2 and "t64" not in texts
    assert sum(t.startswith("t") and t[1:].isdigit() for t in texts) == 2 * HEAD_VIEW_MAX_TOKENS
    window = ElementTree.fromstring(maps.svg("head", window=(200, 230)))
    labels = [t.text for t in window.iter(f"{SVG}text")]
    assert "t200" in labels and "t229" in labels and "t230" not in labels
    matrix = maps.svg("matrix")
    assert f"of 512 (at most {MATRIX_MAX_TOKENS})" in matrix or \
        f"showing tokens 0 to {MATRIX_MAX_TOKENS - 1} of 512" in matrix
    with pytest.raises(InputError, match="outside the 512 real tokens"):
        maps.svg("head", window=(600, 700))


def test_model_view_averages_long_rows_and_keeps_them_distributions():
    maps = _long_maps(512, layers=2, heads=3)
    pixels = thumbnail_pixels(maps.probs[0, 0, 0])
    assert pixels.shape == (64, 64)
    assert close(pixels.sum(-1), torch.ones(64), rtol=0, atol=1e-5, what="rows sum to 1")
    svg = maps.svg("model")
    assert svg.count("<image ") == 6 and "averaged in blocks to 64 per side" in svg
    for uri in re.findall(r'href="data:image/png;base64,([^"]+)"', svg):
        assert uri.startswith("iVBORw0KGgo")  # PNG signature


def test_unknown_view_and_out_of_range_indices(tiny_short_maps):
    with pytest.raises(InputError, match="unknown attention view 'pie'"):
        render_view(tiny_short_maps, "pie")
    with pytest.raises(InputError, match="layer 2 is out of range"):
        tiny_short_maps.svg("matrix", layers=[2])
    with pytest.raises(InputError, match="batch row 1 is out of range: the input has 1"):
        tiny_short_maps.svg("head", batch=1)


def test_png_is_made_from_the_svg(tiny_short_maps):
    pytest.importorskip("cairosvg")
    from introspect.attention.raster import svg_to_png

    png = svg_to_png(tiny_short_maps.svg("matrix"))
    assert png.startswith(b"\x89PNG\r\n\x1a\n")


def test_html_page_is_self_contained_and_escapes_tokens(tiny_models):
    loaded = tiny_models("base", "sdpa")
    maps = introspect.attention(loaded.model, introspect.tokenize(
        loaded.tokenizer, [HOSTILE_TEXT, "fine"]))
    page = maps.html(batch=0)
    assert "http://" not in page and "https://" not in page  # no CDN, nothing fetched
    assert "<link" not in page and " src=" not in page
    assert page.count("<script") == 2 and page.count("</script>") == 2  # data + code only
    assert '<select id="layer">' in page and '<select id="head">' in page
    assert "\\u003cscript\\u003e" in page  # the hostile token, inert inside the JSON
    assert page == maps.html(batch=0)


def test_a_long_text_does_not_widen_the_picture():
    maps = _long_maps(16)
    maps.texts = ("word " * 600,)
    root = ElementTree.fromstring(maps.svg("head"))
    assert float(root.get("width")) < 1000
    assert any(t.text and t.text.endswith("…") for t in root.iter(f"{SVG}text"))
