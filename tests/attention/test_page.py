"""The attention page in a real browser (headless Chromium): bertviz's three views, the
head toggles, the sentence filter, hover/click/tap on tokens, the model view's zoom, the
matrix's colour scale; readable at 390 px; the same maps give the same bytes."""

from __future__ import annotations

import json
import re

import pytest

import introspect
from introspect.attention.page import sentence_segments
from tests.attention.conftest import SHORT_TEXT
from tests.browser import CHROMIUM, SKIP_REASON

chromium = pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
PAIR = ["the cat sat on the mat", "it was tired"]


@pytest.fixture(scope="module")
def pair_maps(tiny_models):
    """bert-tiny on a text pair: [CLS] A [SEP] B [SEP]."""
    loaded = tiny_models("base", "sdpa")
    inputs = introspect.tokenize(loaded.tokenizer, PAIR, head="next-sentence")
    return introspect.attention(loaded.model, inputs, title="bert-tiny")


def _data(page: str) -> dict:
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert found
    return json.loads(found.group(1))


def test_sentence_segments_start_b_after_the_first_inner_separator():
    assert sentence_segments(["[CLS]", "a", "[SEP]", "b", "c", "[SEP]"]) == [0, 0, 0, 1, 1, 1]
    assert sentence_segments(["[CLS]", "a", "b", "[SEP]"]) == [0, 0, 0, 0]  # one sentence
    assert sentence_segments(["<s>", "a", "</s>", "</s>", "b", "</s>"]) == [0, 0, 0, 1, 1, 1]
    assert sentence_segments([]) == []


def test_page_is_offline_deterministic_and_fits_a_phone(pair_maps):
    page = pair_maps.html()
    assert page == pair_maps.html()  # byte-identical for the same maps
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    assert "@import" not in page and "url(" not in page and "<link" not in page
    assert not re.search(r"\bsrc=", page) and "https://" not in page
    data = _data(page)
    assert data["segments"] == [0] * 8 + [1] * 4  # [CLS] the cat sat on the mat [SEP] | B
    assert data["tokens"][7] == "[SEP]" and data["tokens"][8] == "it"


# One probe per page load: it drives the page and reports what the DOM shows.
_HEAD_VIEW = """(function () {
  var lines = function () { return d.querySelectorAll('#view line').length; };
  var visible = function () { return Array.prototype.filter.call(
    d.querySelectorAll('#view line'), function (x) { return !x.classList.contains('off'); }
  ).length; };
  var out = {all: lines(), colours: Array.from(new Set(Array.prototype.map.call(
    d.querySelectorAll('#view line'), function (x) { return x.getAttribute('stroke'); })))};
  var head1 = d.querySelectorAll('#heads button.head')[1];
  head1.click(); out.without1 = lines(); out.pressed1 = head1.getAttribute('aria-pressed');
  head1.click();
  head1.dispatchEvent(new MouseEvent('dblclick', {bubbles: true})); out.only1 = lines();
  d.querySelectorAll('#heads button.all')[0].click();
  var token = d.querySelector('#view text.tok[data-side="q"][data-i="2"]');
  token.dispatchEvent(new MouseEvent('mouseover', {bubbles: true})); out.hover = visible();
  token.dispatchEvent(new MouseEvent('mouseout', {bubbles: true})); out.left = visible();
  token = d.querySelector('#view text.tok[data-side="q"][data-i="2"]');
  token.dispatchEvent(new MouseEvent('click', {bubbles: true})); out.pinned = visible();
  token.dispatchEvent(new MouseEvent('mouseout', {bubbles: true})); out.stays = visible();
  out.mine = Array.prototype.every.call(d.querySelectorAll('#view line'), function (x) {
    return x.classList.contains('off') || x.classList.contains('q2'); });
  token.dispatchEvent(new MouseEvent('click', {bubbles: true})); out.unpinned = visible();
  var s = d.getElementById('sentence'); s.value = 'ab';
  s.dispatchEvent(new Event('change')); out.ab = lines();
  out.abOk = Array.prototype.every.call(d.querySelectorAll('#view line'), function (x) {
    var c = x.getAttribute('class').split(' ');
    return +c[0].slice(1) < 8 && +c[1].slice(1) >= 8; });
  out.sentenceShown = !d.getElementById('sentence-box').hidden;
  return JSON.stringify(out); })()"""


@chromium
def test_head_view_overlays_heads_toggles_filters_and_pins(pair_maps):
    from tests.browser import probe

    out = json.loads(probe(pair_maps.html(), 1280, _HEAD_VIEW))
    weights = pair_maps.probs[0, 0]  # (heads, n, n) of layer 0
    per_head = [int((w >= 0.01).sum()) for w in weights]
    assert out["all"] == sum(per_head) and len(out["colours"]) == 2  # both heads, 2 colours
    assert out["without1"] == per_head[0] and out["pressed1"] == "false"
    assert out["only1"] == per_head[1]
    from_token_2 = int((weights[:, 2] >= 0.01).sum())
    assert out["hover"] == out["pinned"] == out["stays"] == from_token_2  # click pins
    assert out["left"] == out["unpinned"] == sum(per_head) and out["mine"]
    assert out["ab"] == int((weights[:, :8, 8:] >= 0.01).sum()) and out["abOk"]
    assert out["sentenceShown"]


_MODEL_VIEW = """(function () {
  d.querySelector('.tabs button[data-view="model"]').click();
  var canvases = d.querySelectorAll('#view canvas'), out = {thumbnails: canvases.length};
  var pixel = canvases[0].getContext('2d').getImageData(0, 0, 1, 1).data;
  out.pixel = [pixel[0], pixel[1], pixel[2]];
  out.scale = !d.getElementById('scale').hidden;
  out.zoomedBefore = !d.getElementById('zoom').hidden;
  canvases[3].dispatchEvent(new MouseEvent('click', {bubbles: true}));
  out.zoomed = !d.getElementById('zoom').hidden;
  out.title = d.getElementById('zoom-title').textContent;
  out.zoomLines = d.querySelectorAll('#zoom-view line').length;
  out.zoomColours = Array.from(new Set(Array.prototype.map.call(
    d.querySelectorAll('#zoom-view line'), function (x) { return x.getAttribute('stroke'); })));
  d.dispatchEvent(new KeyboardEvent('keydown', {key: 'Escape'}));
  out.closed = d.getElementById('zoom').hidden;
  d.querySelector('.tabs button[data-view="matrix"]').click();
  out.rects = d.querySelectorAll('#view rect[data-i]').length;
  out.matrixScale = !d.getElementById('scale').hidden;
  d.getElementById('layer').value = '1'; d.getElementById('head').value = '1';
  d.getElementById('head').dispatchEvent(new Event('change'));
  var cell = d.querySelector('#view rect[data-i="0"][data-j="0"]');
  cell.dispatchEvent(new MouseEvent('click', {bubbles: true}));
  out.readout = d.getElementById('readout').textContent;
  return JSON.stringify(out); })()"""


@chromium
def test_model_view_zooms_on_click_and_the_matrix_has_a_scale(pair_maps):
    from tests.browser import probe

    out = json.loads(probe(pair_maps.html(), 1280, _MODEL_VIEW))
    assert out["thumbnails"] == 2 * 2  # layers x heads
    level = round(float(pair_maps.probs[0, 0, 0, 0, 0]) * 255) / 255
    assert out["pixel"] == [round(255 + (8 - 255) * level), round(255 + (48 - 255) * level),
                            round(255 + (107 - 255) * level)]  # query 0, key 0 of layer 0 h0
    assert out["scale"] and not out["zoomedBefore"]
    assert out["zoomed"] and out["title"] == "layer 1 · head 1"  # the 4th: layer 1, head 1
    assert out["zoomLines"] == int((pair_maps.probs[1, 0, 1] >= 0.01).sum())
    assert out["zoomColours"] == ["#d62728"] and out["closed"]  # head 1's colour; Escape
    n = pair_maps.length(0)
    assert out["rects"] == n * n and out["matrixScale"]
    weight = round(float(pair_maps.probs[1, 0, 1, 0, 0]) * 255) / 255
    assert out["readout"] == f"[CLS] → [CLS]: {weight:.3f}"  # a tap reads a cell


@chromium
@pytest.mark.parametrize("width", [390, 1280])
def test_no_horizontal_overflow_in_any_view(tiny_models, width):
    """A long pair: its matrix at 24 px a cell is 700 px wide, it must scale to the page."""
    from tests.browser import probe

    loaded = tiny_models("base", "sdpa")
    long_pair = ["the quick brown fox jumps over the lazy dog near the old river bank",
                 "internationalization of supercalifragilisticexpialidocious words"]
    pair_maps = introspect.attention(loaded.model, introspect.tokenize(
        loaded.tokenizer, long_pair, head="next-sentence"))
    assert pair_maps.length(0) > 24

    script = """["head", "model", "matrix", "neuron"].map(function (view) {
      d.querySelector('.tabs button[data-view="' + view + '"]').click();
      return view + ':' + d.documentElement.scrollWidth + ':' + d.documentElement.clientWidth;
    }).join('|')"""
    for result in probe(pair_maps.html(), width, script).split("|"):
        view, scroll, client = result.split(":")
        assert int(client) <= width and int(scroll) <= int(client), (view, scroll, client)


@chromium
def test_a_single_sentence_has_no_sentence_filter(tiny_short_maps):
    from tests.browser import probe

    assert probe(tiny_short_maps.html(), 1280,
                 "d.getElementById('sentence-box').hidden") == "true"
    assert SHORT_TEXT in _data(tiny_short_maps.html())["text"]


@chromium
@pytest.mark.parametrize("width", [390, 1280])
def test_screenshots(pair_maps, tmp_path, width):
    """A look at the head and model views; INTROSPECT_SCREENSHOTS=DIR keeps the PNGs."""
    import os
    from pathlib import Path

    from PIL import Image

    from tests.browser import screenshot

    page = tmp_path / "attention.html"
    page.write_text(pair_maps.html(), encoding="utf-8")
    keep = os.environ.get("INTROSPECT_SCREENSHOTS")
    folder = Path(keep) if keep else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    for view in ("head", "model"):
        shot = folder / f"attention-{view}-{width}.png"
        screenshot(page, shot, width, 900, fragment=view)
        image = Image.open(shot).convert("RGB")
        assert image.size == (width, 900)
        colours = {rgb for _, rgb in image.getcolors(maxcolors=1 << 20) or []}
        assert (9, 105, 218) in colours  # the pressed tab
        assert len(colours) > 50  # text and drawings, not a blank page


def test_the_neuron_view_gets_the_heads_own_queries_and_keys(pair_maps):
    """The float16 vectors on the page give back the model's weights: softmax(q·k × scale)
    over the real keys is the probability the graph computed."""
    import base64

    import numpy as np
    import torch

    neurons = _data(pair_maps.html())["neurons"]
    n, size = neurons["n"], neurons["size"]
    assert n == pair_maps.length(0) and size == 64 and neurons["scales"] == [0.125, 0.125]
    shape = (pair_maps.num_layers, pair_maps.num_heads, n, size)
    q, k = (torch.from_numpy(np.frombuffer(base64.b64decode(neurons[name]), "<f2")
                             .reshape(shape).astype("float32")) for name in ("queries", "keys"))
    scores = torch.einsum("lhqd,lhkd->lhqk", q, k) * 0.125
    weights = pair_maps.probs[:, 0][:, :, :n, :n]
    assert (scores.softmax(-1) - weights).abs().max() < 2e-3  # float16 rounding only


def test_the_neuron_view_is_read_from_eager_attention_too(tiny_models):
    """Eager attention has no sdpa call: q and k are found behind the softmax."""
    import torch

    sdpa, eager = (introspect.attention(tiny_models("base", attn).model, introspect.tokenize(
        tiny_models("base", attn).tokenizer)) for attn in ("sdpa", "eager"))
    assert eager.scales == sdpa.scales == (0.125, 0.125)
    assert torch.equal(eager.queries[0], sdpa.queries[0])  # layer 0: the same inputs
    assert torch.equal(eager.keys[0], sdpa.keys[0])
    assert (eager.queries - sdpa.queries).abs().max() < 1e-5  # later: sdpa's own rounding
    assert (eager.keys - sdpa.keys).abs().max() < 1e-5


@chromium
@pytest.mark.slow
@pytest.mark.parametrize("width", [390, 1280])
def test_the_neuron_view_draws_one_head_and_one_query(pair_maps, width):
    from tests.browser import probe

    n = pair_maps.length(0)
    script = """(function () {
      d.querySelector('.tabs button[data-view="neuron"]').click();
      d.getElementById('layer').value = '1'; d.getElementById('head').value = '1';
      var query = d.getElementById('query');
      query.value = '2'; query.dispatchEvent(new Event('change'));
      var svg = d.querySelector('#view svg'), out = [];
      out.push(svg.querySelectorAll('rect.cell').length,
               svg.querySelector('text.qtok').textContent);
      out.push(Array.prototype.map.call(svg.querySelectorAll('text.score'),
        function (t) { return t.textContent; }).join(','));
      svg.querySelectorAll('text.ntok')[3].dispatchEvent(new MouseEvent('click', {bubbles: true}));
      out.push(d.getElementById('query').value, d.querySelector('#view svg text.qtok').textContent);
      out.push(d.documentElement.scrollWidth <= d.documentElement.clientWidth);
      return out.join('|'); })()"""
    cells, query, scores, chosen, query_after, fits = probe(pair_maps.html(), width,
                                                           script).split("|")
    tokens = pair_maps.real_tokens(0)
    assert int(cells) == 64 * (1 + 2 * n)  # q, then k and q×k for each key
    assert query == tokens[2] and chosen == "3" and query_after == tokens[3]
    q, k = pair_maps.queries[1, 0, 1, 2, :], pair_maps.keys[1, 0, 1, :n, :]
    expected = (k @ q) * 0.125
    shown = [float(s) for s in scores.split(",")]
    assert shown == pytest.approx(expected.tolist(), abs=0.02)  # from the float16 vectors
    assert fits == "true"


@chromium
@pytest.mark.slow
def test_dark_mode_follows_the_system_and_the_toggle(pair_maps):
    from tests.browser import probe

    script = """(function () {
      var out = [], bg = function () { return w.getComputedStyle(d.body).backgroundColor; };
      out.push(bg());
      d.getElementById('theme').click(); out.push(bg(), d.documentElement.dataset.theme);
      d.querySelector('.tabs button[data-view="matrix"]').click();
      out.push(d.querySelector('#view rect').getAttribute('fill'));
      d.getElementById('theme').click(); out.push(bg());
      return out.join('|'); })()"""
    light, dark, theme, cell, again = probe(pair_maps.html(), 1280, script).split("|")
    assert light == again == "rgb(255, 255, 255)"  # headless Chromium prefers light
    assert dark == "rgb(13, 17, 23)" and theme == "dark"
    weight = round(float(pair_maps.probs[0, 0, 0, 0, 0]) * 255) / 255
    assert cell == "rgb(" + ",".join(str(round(a + (b - a) * weight)) for a, b in
                                     zip((13, 17, 23), (121, 192, 255), strict=True)) + ")"
    page = pair_maps.html()
    assert "@media (prefers-color-scheme: dark)" in page and page == pair_maps.html()


@chromium
@pytest.mark.slow
@pytest.mark.parametrize("width", [390, 1280])
def test_screenshots_of_the_neuron_view(pair_maps, tmp_path, width):
    """INTROSPECT_SCREENSHOTS=DIR keeps the PNGs; scripts/page_screenshots.py writes the
    demo's under reports/."""
    import os
    from pathlib import Path

    from PIL import Image

    from tests.browser import framed_screenshot

    page = tmp_path / "attention.html"
    page.write_text(pair_maps.html(), encoding="utf-8")
    keep = os.environ.get("INTROSPECT_SCREENSHOTS")
    shot = (Path(keep) if keep else tmp_path) / f"attention-neuron-{width}.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    framed_screenshot(page, shot, width, 700, fragment="neuron")
    colours = dict((rgb, count) for count, rgb in
                   Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 22) or [])
    blue = sum(c for rgb, c in colours.items() if rgb[2] > rgb[0] + 60)  # positive cells
    orange = sum(c for rgb, c in colours.items() if rgb[0] > rgb[2] + 60)  # negative cells
    assert blue > 500 and orange > 500
