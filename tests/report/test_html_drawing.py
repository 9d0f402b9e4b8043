"""diff.html's drawing: a viewer that zooms, pans and finds nodes, and a panel per node with
histograms the diff counted; and n/a layers, which show no error anywhere (never 0)."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest

from introspect.diff.histogram import ERROR_BINS
from introspect.report import render_reports
from introspect.report.html_drawing import drawing_data
from introspect.report.overlay import drawn_members
from tests.browser import CHROMIUM, SKIP_REASON


def _decade_bin(value: float) -> int:
    return 0 if value == 0 else min(max(math.floor(math.log10(value)), -11), 1) + 12


def test_every_pair_has_histograms_that_match_its_errors(failing_diff):
    compared = [r for r in failing_diff.rows if r.status not in ("unmatched", "skipped")]
    assert {(r.reference_node, r.candidate_node) for r in compared} == \
        set(failing_diff.histograms)
    for r in compared:
        local, propagated = failing_diff.histograms[(r.reference_node, r.candidate_node)]
        assert len(local) == len(propagated) == len(ERROR_BINS) == 14
        assert sum(local) == sum(propagated) > 0  # the same real-token elements
        top = max(i for i, c in enumerate(local) if c)  # the largest error's decade
        assert top == _decade_bin(r.local_max_abs_err), r.reference_node
        top = max(i for i, c in enumerate(propagated) if c)
        assert top == _decade_bin(r.max_abs_err), r.reference_node
    act = next(r for r in compared if r.status == "fail")
    local, _ = failing_diff.histograms[(act.reference_node, act.candidate_node)]
    assert sum(local[1:]) > sum(local) // 2  # the tanh GELU differs almost everywhere


def test_the_page_embeds_the_panel_data(failing_diff):
    page = render_reports(failing_diff)["diff.html"]
    raw = re.search(r"<script type='application/json' id='drawing-data'>(.*?)</script>",
                    page, re.S).group(1)
    data = json.loads(raw)
    assert data == json.loads(json.dumps(drawing_data(failing_diff, drawn_members(failing_diff))))
    assert data["bins"] == list(ERROR_BINS)
    d = failing_diff.first_divergence
    (entry,) = data["nodes"][d.reference_node]
    assert entry["status"] == "FAIL" and entry["local"] == d.local_max_abs_err
    assert entry["hist_local"] == list(
        failing_diff.histograms[(d.reference_node, d.candidate_node)][0])
    # a drawn node standing for several (a layout chain) lists them for the panel
    assert any(len(members) > 1 for members in data["groups"].values())
    assert len(raw) < 60_000  # per node, a few numbers and 28 counts: the page stays small
    assert f"<a href='#node={d.reference_node}'><code>" in page  # opens the node's panel


def _with_na_layer(result):
    """The diff with its mask layer's pairs gone: a layer where nothing was compared."""
    layers = [dataclasses.replace(r, nodes=0, failing=0, unmatched=r.nodes, passed=True)
              if r.layer == "mask" else r for r in result.layer_rows]
    return dataclasses.replace(result, layer_rows=layers)


def test_a_layer_with_nothing_compared_shows_no_error(failing_diff):
    result = _with_na_layer(failing_diff)
    reports = render_reports(result, drawing=False)
    assert "| mask | n/a | n/a |  | 0 | n/a |" in reports["diff.md"]
    page = reports["diff.html"]
    row = page[page.index("<td>mask</td>") - 20:]
    row = row[:row.index("</tr>")]
    assert row.startswith("lass=''><td>n/a</td><td>mask</td><td class='num' data-v=''>n/a</td>"
                          "<td class='num' data-v=''>n/a</td>")  # status, then both errors
    mask = next(r for r in json.loads(reports["diff.json"])["layers"] if r["layer"] == "mask")
    assert mask["status"] == "n/a" and mask["max_abs_err"] is None \
        and mask["local_max_abs_err"] is None
    csv_row = next(line for line in reports["layers.csv"].splitlines()
                   if line.startswith("mask,"))
    assert csv_row.split(",")[2:4] == ["", ""] and csv_row.endswith(",n/a")
    assert '<testcase classname="introspect.diff" name="mask">\n      <skipped ' \
        'message="nothing compared in mask" />' in reports["junit.xml"]
    assert 'skipped="1"' in reports["junit.xml"]
    assert re.search(r"^mask\s+n/a\s+n/a\s+0", result.layer_table(), re.M)


# -- in a browser ------------------------------------------------------------------------

def _viewer(page: str, width: int, script: str) -> list[str]:
    from tests.browser import probe

    wrapped = ("(function () { var D = w.introspectDrawing, svg = d.querySelector("
               "'#drawing-box svg'), box = d.getElementById('drawing-box'), out = [];"
               f"{script}; return out.join('|'); }})()")
    return probe(page, width, wrapped).split("|")


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
@pytest.mark.parametrize("width", [390, 1280])
def test_zoom_search_and_panel_work_in_the_browser(failing_diff, width):
    page = render_reports(failing_diff)["diff.html"]
    d = failing_diff.first_divergence
    out = _viewer(page, width, f"""
        out.push(svg.getAttribute('viewBox'));
        d.querySelector("button[data-zoom='in']").click();
        out.push(svg.getAttribute('viewBox'));
        d.querySelector("button[data-zoom='fit']").click();
        out.push(svg.getAttribute('viewBox'));
        D.search('{d.reference_node}');
        var hit = d.querySelector('g.node.hit'), r = hit.getBoundingClientRect(),
            b = box.getBoundingClientRect();
        out.push(d.getElementById('drawing-found').textContent,
                 Math.round(r.left + r.width / 2 - b.left - b.width / 2),
                 Math.round(r.top + r.height / 2 - b.top - b.height / 2));
        var e = {{bubbles: true, pointerId: 1, clientX: r.left + 2, clientY: r.top + 2,
                 button: 0, isPrimary: true}};
        var shape = hit.querySelector('polygon, ellipse, path');
        shape.dispatchEvent(new PointerEvent('pointerdown', e));
        box.dispatchEvent(new PointerEvent('pointerup', e));
        var panel = d.getElementById('node-panel');
        out.push(panel.hidden, panel.querySelectorAll('svg.hist rect.bar').length,
                 panel.querySelector('h3').textContent);
        var before = D.view().w, c = b.left + b.width / 2, m = b.top + b.height / 4;
        function p(type, id, x) {{ box.dispatchEvent(new PointerEvent(type, {{bubbles: true,
            pointerId: id, clientX: x, clientY: m, button: 0}})); }}
        p('pointerdown', 1, c - 20); p('pointerdown', 2, c + 20);
        p('pointermove', 2, c + 60); p('pointerup', 2, c + 60); p('pointerup', 1, c - 20);
        out.push((before / D.view().w).toFixed(2));
        box.dispatchEvent(new WheelEvent('wheel', {{bubbles: true, cancelable: true,
            deltaY: 100, clientX: c, clientY: m}}));
        out.push((before / D.view().w).toFixed(2))""")
    fitted, zoomed, refitted, found, dx, dy, hidden, bars, title, pinched, wheeled = out
    assert [float(v) for v in zoomed.split()][2] == pytest.approx(
        [float(v) for v in fitted.split()][2] / 1.5, rel=1e-3)  # + zooms in 1.5x
    assert refitted == fitted
    assert found == "1 of 1" and abs(int(dx)) <= 2 and abs(int(dy)) <= 2  # centred
    assert hidden == "false" and int(bars) == 14 and title == d.reference_node
    assert float(pinched) == pytest.approx(2.0, abs=0.05)  # 40 px apart, then 80
    assert float(wheeled) < float(pinched)  # a wheel turned down zooms out


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
@pytest.mark.parametrize("width", [390, 1280])
def test_screenshots_of_the_zoomed_node_and_its_panel(failing_diff, tmp_path, width):
    """The first divergence's link opens the drawing on it, readable, its panel open (on
    a phone, a sheet over the drawing's lower part). INTROSPECT_SCREENSHOTS=DIR keeps the
    PNGs; ``scripts/page_screenshots.py`` writes those under reports/."""
    import os
    from pathlib import Path

    from PIL import Image

    from introspect.report import write_reports
    from tests.browser import framed_screenshot

    write_reports(failing_diff, tmp_path / "report")
    keep = os.environ.get("INTROSPECT_SCREENSHOTS")
    shot = (Path(keep) if keep else tmp_path) / f"diff-node-{width}.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    framed_screenshot(tmp_path / "report" / "diff.html", shot, width, 844,
                      f"node={failing_diff.first_divergence.reference_node}")
    image = Image.open(shot).convert("RGB")
    assert image.size == (width, 844)
    colours = dict((rgb, count) for count, rgb in image.getcolors(maxcolors=1 << 22) or [])
    assert colours.get((130, 80, 223), 0) > 300  # the selected node's purple frame
    if width >= 960:  # beside the drawing (on a phone the sheet opens on the numbers)
        assert colours.get((9, 105, 218), 0) > 100  # the histogram's blue bars
