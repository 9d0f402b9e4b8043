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
        "Parity fails", "First divergence:", "tanh approximation of GELU", "<h2>Layers</h2>",
        "<h2>Compared nodes")]
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
    assert ".drawing svg { max-width: 100%; height: auto;" in page


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
