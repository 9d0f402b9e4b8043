"""Headless Chromium for the page tests: screenshots, and a page's layout read through
its DOM at a given viewport width (the page sits in a same-origin iframe of that width,
since a headless window is never narrower than 500 px)."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SKIP_REASON = ("headless Chromium is not installed (Debian package chromium; make setup "
               "tries to install it)")
_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
          "--disable-component-update", "--disable-sync", "--no-first-run",
          "--hide-scrollbars")


def screenshot(page: Path, shot: Path, width: int, height: int, fragment: str = "") -> None:
    """A PNG of ``page`` (opened at ``#fragment``) in a ``width`` x ``height`` window."""
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([CHROMIUM, *_FLAGS, f"--user-data-dir={profile}",
                        f"--screenshot={shot}", f"--window-size={width},{height}",
                        page.as_uri() + (f"#{fragment}" if fragment else "")],
                       capture_output=True, timeout=120, check=False)


def probe(page_html: str, width: int, script: str, *, height: int = 900) -> str:
    """What ``script`` returns (an expression over ``d``, the page's document, and ``w``,
    its window), run once the page has loaded in an iframe ``width`` pixels wide."""
    assert CHROMIUM is not None
    wrapper = (
        "<!DOCTYPE html><html><body style='margin:0'>"
        f"<iframe id='f' style='border:0' width='{width}' height='{height}' "
        f"srcdoc=\"{html.escape(page_html, quote=True)}\"></iframe><script>"
        "document.getElementById('f').addEventListener('load', function () {"
        "var d = this.contentDocument, w = this.contentWindow, out;"
        f"try {{ out = String({script}); }} catch (err) {{ out = 'error: ' + err; }}"
        "document.body.setAttribute('data-probe', out); });</script></body></html>")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.html"
        path.write_text(wrapper, encoding="utf-8")
        done = subprocess.run([CHROMIUM, *_FLAGS, f"--user-data-dir={tmp}/profile",
                               "--window-size=1400,1000", "--dump-dom", path.as_uri()],
                              capture_output=True, text=True, timeout=120, check=False)
    found = re.search(r'data-probe="([^"]*)"', done.stdout)
    assert found, f"the probe wrote nothing: {done.stderr[-2000:]}"
    return html.unescape(found.group(1))


# The page's width against its viewport's: text that overflows makes the first larger.
OVERFLOW = "d.documentElement.scrollWidth + '|' + d.documentElement.clientWidth"


def overflow(page_html: str, width: int) -> tuple[int, int]:
    """(scroll width, client width) of the page at a viewport ``width`` pixels wide."""
    scroll, client = probe(page_html, width, OVERFLOW).split("|")
    return int(scroll), int(client)


def framed_screenshot(page: Path, shot: Path, width: int, height: int, fragment: str = "",
                      *, wait_ms: int = 2000) -> None:
    """A PNG of ``page`` at ``#fragment`` in a frame ``width`` x ``height``: a phone's width
    (the window itself is never narrower than 500 px), and a page that scrolls itself to
    the fragment paints as it would on screen (a headless screenshot of a scrolled
    window comes out blank above the fold)."""
    from PIL import Image

    assert CHROMIUM is not None
    target = page.name + (f"#{fragment}" if fragment else "")
    wrapper = page.with_name(f".frame-{width}-{page.name}")
    wrapper.write_text(
        "<!DOCTYPE html><html><body style='margin:0;overflow:hidden'>"
        f"<iframe style='border:0;display:block' width='{width}' height='{height}' "
        f"src=\"{html.escape(target, quote=True)}\"></iframe></body></html>", encoding="utf-8")
    try:
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run([CHROMIUM, *_FLAGS, f"--user-data-dir={profile}",
                            f"--virtual-time-budget={wait_ms}", f"--screenshot={shot}",
                            f"--window-size={max(width, 500)},{height}", wrapper.as_uri()],
                           capture_output=True, timeout=120, check=False)
    finally:
        wrapper.unlink()
    if shot.exists() and width < 500:
        Image.open(shot).crop((0, 0, width, height)).save(shot)
