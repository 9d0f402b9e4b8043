"""SVG text, written by hand: a document builder, stable numbers, escaped text, colours.

Every number goes through ``num`` (at most two decimals) and every colour is quantised to
8 bits per channel, so the same picture gives the same bytes; every piece of text goes
through ``esc``, so a token such as ``<script>`` is drawn, never run.
"""

from __future__ import annotations

import html
import re

MAX_LABEL_CHARS = 24
FONT = "DejaVu Sans Mono, Menlo, Consolas, monospace"
CHAR_WIDTH = 0.6  # of the font size, for a monospace font
INK, MUTED = "#24292f", "#57606a"
# One colour per head (cycled), as bertviz colours heads.
HEAD_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                "#e377c2", "#17becf", "#6b8e23", "#7f7f7f", "#393b79", "#ad494a")
_LOW, HIGH = (255, 255, 255), (8, 48, 107)  # white to dark blue
_NEGATIVE = (178, 24, 43)  # difference views: red below zero, blue above


def num(x: float) -> str:
    """A coordinate with at most two decimals and no trailing zeros: stable text."""
    text = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def esc(text: str) -> str:
    """Text safe inside an SVG/XML element or attribute.

    Characters XML 1.0 does not allow (controls other than tab and newline, lone
    surrogates, U+FFFE and U+FFFF) are written as U+FFFD, so that the document stays
    well-formed whatever the text held.
    """
    return html.escape(_NOT_XML.sub("\ufffd", text), quote=True)


_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def mix(colour: tuple[int, int, int], weight: float) -> tuple[int, int, int]:
    """White blended toward ``colour`` by ``weight`` in [0, 1], as 8-bit channels."""
    w = min(max(weight, 0.0), 1.0)
    r, g, b = (round(lo + (hi - lo) * w) for lo, hi in zip(_LOW, colour, strict=True))
    return r, g, b


def blue(weight: float) -> str:
    """The fill of a weight in [0, 1]: white to dark blue, quantised to 8 bits."""
    return "#{:02x}{:02x}{:02x}".format(*mix(HIGH, weight))


def diverging(value: float, scale: float) -> str:
    """The fill of a signed difference: red below zero, blue above, white at zero."""
    w = abs(value) / scale if scale > 0 else 0.0
    return "#{:02x}{:02x}{:02x}".format(*mix(HIGH if value > 0 else _NEGATIVE, w))


def label(token: str) -> str:
    """A token as drawn: shortened to ``MAX_LABEL_CHARS``, control characters shown."""
    text = "".join(c if c.isprintable() else "?" for c in token)
    return text if len(text) <= MAX_LABEL_CHARS else text[: MAX_LABEL_CHARS - 1] + "…"


def text_width(text: str, size: float) -> float:
    return len(text) * size * CHAR_WIDTH


class Svg:
    """An SVG document built element by element, in drawing order."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.right = 0.0  # the rightmost end of any text, so the page is wide enough

    def add(self, element: str) -> None:
        self.parts.append(element)

    def rect(self, x: float, y: float, w: float, h: float, fill: str, tip: str = "") -> None:
        element = (f'<rect x="{num(x)}" y="{num(y)}" width="{num(w)}" height="{num(h)}" '
                   f'fill="{fill}"')
        self.add(f"{element}><title>{esc(tip)}</title></rect>" if tip else f"{element}/>")

    def text(self, x: float, y: float, content: str, *, size: float = 12, anchor: str = "start",
             fill: str = INK, bold: bool = False, rotate: bool = False) -> None:
        attributes = f'x="{num(x)}" y="{num(y)}" font-size="{num(size)}"'
        if anchor != "start":
            attributes += f' text-anchor="{anchor}"'
        if fill != INK:
            attributes += f' fill="{fill}"'
        if bold:
            attributes += ' font-weight="bold"'
        if rotate:
            attributes += f' transform="rotate(-90 {num(x)} {num(y)})"'
        else:
            shown = text_width(content, size) * (1.1 if bold else 1.0)
            self.right = max(self.right, x + {"start": shown, "middle": shown / 2}.get(anchor, 0))
        self.add(f"<text {attributes}>{esc(content)}</text>")

    def document(self, width: float, height: float, title: str) -> str:
        width = max(width, self.right + 12)
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{num(width)}" '
                f'height="{num(height)}" viewBox="0 0 {num(width)} {num(height)}" '
                f'font-family="{FONT}">\n<title>{esc(title)}</title>\n'
                f'<rect width="100%" height="100%" fill="#ffffff"/>\n')
        return head + "\n".join(self.parts) + "\n</svg>\n"
