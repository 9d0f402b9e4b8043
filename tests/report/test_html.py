"""diff.html is a page a person reads: verdict, first divergence, hint and layers first;
a sortable, filterable node table with the errors first; a drawing that fits the page;
nothing fetched from the network. A headless Chromium screenshot proves it renders."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from introspect.report import html_report, render_reports, write_reports


def test_the_page_leads_with_verdict_divergence_hint_and_layers(failing_diff):
    page = html_report(failing_diff)
    order = [page.index(marker) for marker in (
        "Parity fails", "First divergence:", "tanh approximation of GELU", ">Layers</h2>",
        ">Compared nodes")]
    assert order == sorted(order)
    assert "<tr class='fail'><td>FAIL</td><td>encoder.layer.1</td>" in page


def test_node_table_has_error_columns_first_and_sorts_and_filters(failing_diff):
    page = html_report(failing_diff)
    nodes = page[page.index("<table id='nodes'"):]
    headers = re.findall(r"<th>([^<]*)</th>", nodes[:nodes.index("</thead>")])
    assert headers[:3] == ["status", "local max abs err", "max abs err"]
    assert "class='introspect-diff sortable'" in nodes and "introspectFilter('nodes')" in page
    assert "data-v='" in nodes  # numbers sort by value, not as text
    assert "background-color:#f8d7da" in page  # failing rows highlighted


def test_self_contained_no_network(failing_diff):
    page = render_reports(failing_diff)["diff.html"]
    assert "<script src" not in page and "<link" not in page and "@import" not in page
    urls = set(re.findall(r"https?://[^\"' )]+", page))
    assert all(u.startswith("http://www.w3.org/") for u in urls), urls  # SVG namespaces only
    assert ".drawing svg { width: 100%; height: 100%;" in page  # fitted to its zoomable box


def test_a_passing_page_says_so(passing_diff):
    page = html_report(passing_diff)
    assert "<div class='verdict pass'><span class='word'>Parity holds</span>" in page
    assert "First divergence" not in page


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (Debian "
                    "package chromium; make setup tries to install it)")
def test_browser_screenshot_is_not_blank(failing_diff, tmp_path):
    from PIL import Image

    write_reports(failing_diff, tmp_path / "report")
    shot = tmp_path / "diff.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                        "--disable-background-networking", "--disable-component-update",
                        "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                        f"--screenshot={shot}", "--window-size=1280,2000",
                        (tmp_path / "report" / "diff.html").as_uri()],
                       capture_output=True, timeout=120, check=False)
    assert shot.exists(), "chromium wrote no screenshot"
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 2000)
    colours = image.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50  # text, tables and a drawing, not a blank page
    top = image.crop((0, 0, 1280, 200))
    pink = sum(count for count, rgb in (top.getcolors(maxcolors=1 << 20) or [])
               if rgb == (255, 235, 233))
    assert pink > 10_000  # the red verdict box "Parity fails" is at the top


def test_html_file_round_trip(failing_diff, tmp_path):
    paths = write_reports(failing_diff, tmp_path / "r", drawing=False)
    page = next(p for p in paths if p.name == "diff.html").read_text()
    assert Path(tmp_path / "r" / "diff.html").read_text() == page and "<svg" not in page


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed")
def test_sorting_and_filtering_work_in_the_browser(failing_diff, tmp_path):
    page = html_report(failing_diff)
    probe = """<script>
    var t = document.getElementById("nodes");
    var th = t.querySelectorAll("th")[1]; th.click(); th.click();   // local error, descending
    var first = t.tBodies[0].rows[0].cells[1].dataset.v;
    document.getElementById("nodes-failing").checked = false;
    document.getElementById("nodes-text").value = "layer_norm"; introspectFilter("nodes");
    var shown = Array.prototype.filter.call(t.tBodies[0].rows,
        function (r) { return r.style.display !== "none"; }).length;
    document.body.setAttribute("data-probe", first + "|" + shown);
    </script></body>"""
    (tmp_path / "probe.html").write_text(page.replace("</body>", probe))
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                               "--disable-background-networking", "--disable-component-update",
                               "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                               "--dump-dom", (tmp_path / "probe.html").as_uri()],
                              capture_output=True, text=True, timeout=120, check=False)
    probe_value = re.search(r'data-probe="([^"]*)"', done.stdout)
    assert probe_value, done.stderr[-2000:]
    first, shown = probe_value.group(1).split("|")
    worst = max(r.local_max_abs_err or 0.0 for r in failing_diff.rows)
    assert float(first) == worst  # sorted by value, largest first
    compared = [r for r in failing_diff.rows if r.status not in ("unmatched", "skipped")]
    assert int(shown) == sum("layer_norm" in r.reference_node + r.candidate_node
                             for r in compared) > 0


def test_the_failing_layer_is_outlined_and_linked_from_the_verdict(failing_diff):
    reports = render_reports(failing_diff)
    page, svg = reports["diff.html"], reports["diff.svg"].decode("utf-8")
    verdict = page[page.index("<div class='verdict fail'>"):]
    verdict = verdict[:verdict.index("</div>")]
    assert "Failing: <a href='#outline_encoder.layer.1'>encoder.layer.1</a>" in verdict
    assert page.count('id="outline_encoder.layer.1"') == 1  # the link has one target
    group = svg[svg.index('id="outline_encoder.layer.1"'):]
    assert 'stroke="#cf222e"' in group[:1500] and 'stroke-width="5"' in group[:1500]
    assert "outline_encoder.layer.0" not in page  # the passing layer is not outlined
    assert svg.count('stroke="#cf222e"') == 1  # not handed down to the clusters inside it
    order = [page.index(m) for m in (">Layers</h2>", "<h2 id='drawing'>", ">Compared nodes")]
    assert order == sorted(order)  # the drawing right under the layers, not at the end
    assert "<a href='#outline_encoder.layer.1'>encoder.layer.1</a></td>" in page  # table too


def test_without_a_drawing_the_links_go_to_the_layers_table(failing_diff, passing_diff):
    page = html_report(failing_diff)
    assert "Failing: <a href='#layers'>encoder.layer.1</a>." in page
    assert "outline_" not in page and "href='#drawing'" not in page
    assert "Failing:" not in html_report(passing_diff)
    from introspect.diff.status import STATUS_LEGEND

    assert page.count(STATUS_LEGEND) == 1  # the status words' legend, once


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed")
@pytest.mark.parametrize("width", [390, 1280])
def test_no_horizontal_overflow(failing_diff, width):
    """On a phone the page once was 433 px wide at 390: long code spans did not wrap."""
    from tests.browser import overflow

    page = render_reports(failing_diff)["diff.html"]
    scroll, client = overflow(page, width)
    assert client <= width and scroll <= client, (scroll, client)


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed")
def test_the_verdict_link_scrolls_to_the_outlined_layer(failing_diff, tmp_path):
    """Opening the verdict's link puts the outlined layer at the top of the window."""
    page = render_reports(failing_diff)["diff.html"]
    href = re.search(r"Failing: <a href='(#[^']+)'>", page).group(1)
    probe = ("<script>window.addEventListener('load', function () { setTimeout(function () {"
             f"var box = document.getElementById('{href[1:]}').getBoundingClientRect();"
             "document.body.setAttribute('data-probe', Math.round(box.top) + '|' +"
             " Math.round(window.scrollY)); }, 200); });</script></body>")
    path = tmp_path / "diff.html"
    path.write_text(page.replace("</body>", probe), encoding="utf-8")
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                               "--no-first-run", f"--user-data-dir={profile}",
                               "--window-size=1280,900", "--virtual-time-budget=3000",
                               "--dump-dom", path.as_uri() + href],
                              capture_output=True, text=True, timeout=120, check=False)
    found = re.search(r'data-probe="(-?\d+)\|(\d+)"', done.stdout)
    assert found, done.stderr[-2000:]
    top, scrolled = int(found.group(1)), int(found.group(2))
    assert scrolled > 500 and -2 <= top <= 24, (top, scrolled)  # at the top of the window


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed")
@pytest.mark.parametrize("width", [390, 1280])
def test_screenshots_at_phone_and_desktop_width(failing_diff, tmp_path, width):
    """A look at the page; INTROSPECT_SCREENSHOTS=DIR keeps the PNGs to look at (the
    screenshot test above, at 1280 x 2000, checks the page is not blank)."""
    import os

    from PIL import Image

    from tests.browser import screenshot

    write_reports(failing_diff, tmp_path / "report")
    keep = os.environ.get("INTROSPECT_SCREENSHOTS")
    shot = (Path(keep) if keep else tmp_path) / f"diff-{width}.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    screenshot(tmp_path / "report" / "diff.html", shot, width, 2400)
    image = Image.open(shot).convert("RGB")
    assert image.size == (width, 2400)
    top = image.crop((0, 0, width, 400)).getcolors(maxcolors=1 << 20) or []
    assert sum(count for count, rgb in top if rgb == (255, 235, 233)) > 5_000  # the verdict
    red = sum(count for count, rgb in (image.getcolors(maxcolors=1 << 22) or [])
              if rgb == (207, 34, 46))
    assert red > 200 * 390 / width  # the failing layer's thick red outline is on screen


def test_a_failing_embeddings_block_is_outlined_and_linked_too(tiny_models, tiny_inputs):
    import torch

    import introspect

    hf = tiny_models("base", "sdpa").model
    faulty = introspect.scratch.BertModel.from_hf(hf)
    with torch.no_grad():
        faulty.embeddings.LayerNorm.bias += 0.05
    result = introspect.diff(hf, faulty, tiny_inputs)
    page = render_reports(result)["diff.html"]
    assert "Failing: <a href='#outline_embeddings'>embeddings</a>" in page
    assert page.count('id="outline_embeddings"') == 1
    assert page == render_reports(result)["diff.html"]  # byte-identical, drawing included
