"""Screenshots of the demo's pages under reports/screenshots/, at a phone's width (390 px)
and a desktop's (1280 px): diff.html opened on its first divergence (zoomed, the node's
panel open) and the attention page's neuron view. ``make demo`` runs it after writing
reports/diff/ and reports/attention.html; without headless Chromium it says so and exits 0.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.browser import CHROMIUM, SKIP_REASON, framed_screenshot  # noqa: E402


def main() -> int:
    if CHROMIUM is None:
        print(f"page_screenshots: skipped, {SKIP_REASON}")
        return 0
    reports, out = ROOT / "reports", ROOT / "reports" / "screenshots"
    out.mkdir(exist_ok=True)
    diff = reports / "diff" / "diff.html"
    first = json.loads((reports / "diff" / "diff.json").read_text())["first_divergence"]
    # a passing diff has no divergence: open the drawing on the classifier, its last node
    node = first["reference_node"] if first else _last_drawn(diff.read_text())
    for width in (390, 1280):
        framed_screenshot(diff, out / f"diff-node-{width}.png", width, 844,
                          f"node={quote(node)}")
        framed_screenshot(reports / "attention.html", out / f"attention-neuron-{width}.png",
                          width, 844, "neuron")
    print(f"page_screenshots: wrote {out.relative_to(ROOT)}/ (node {node})")
    return 0


def _last_drawn(page: str) -> str:
    names = re.findall(r'<g id="node\d+" class="node">\s*<title>([^<]*)</title>', page)
    return [n for n in names if not n.startswith(("box/", "output"))][-1]


if __name__ == "__main__":
    raise SystemExit(main())
