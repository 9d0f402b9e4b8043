"""Pixels: small PNG images written by hand (model-view thumbnails) and SVG → PNG.

A thumbnail of a head is one pixel per (query, key) weight, encoded as an RGB PNG with
``zlib`` at a fixed level (1: heatmaps compress little, and the model view of BERT-large
holds 384 of them), so the same weights give the same bytes. A whole picture
becomes PNG through ``cairosvg`` (the extra ``png``; needs the cairo library, which Graphviz
installs too).
"""

from __future__ import annotations

import struct
import zlib
from typing import TYPE_CHECKING

from introspect.errors import IntrospectError

if TYPE_CHECKING:
    import numpy

PNG_SCALE = 2.0  # pictures are rasterised at twice their SVG size, to read in a README


class PngConverterMissingError(IntrospectError):
    """cairosvg (or the cairo library under it) is not installed."""


def _chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def png_rgb(pixels: numpy.ndarray) -> bytes:
    """An 8-bit RGB PNG of a ``(height, width, 3)`` uint8 array, byte-stable."""
    import numpy as np

    height, width = pixels.shape[0], pixels.shape[1]
    rows = pixels.astype(np.uint8).reshape(height, width * 3)
    raw = np.concatenate([np.zeros((height, 1), dtype=np.uint8), rows], axis=1).tobytes()
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(raw, 1)) + _chunk(b"IEND", b""))


def svg_to_png(svg: str, scale: float = PNG_SCALE) -> bytes:
    """Rasterise an SVG picture of this package to PNG.

    Raises:
        PngConverterMissingError: cairosvg or the cairo library is missing.
    """
    try:
        import cairosvg
    except (ImportError, OSError) as e:  # OSError: cairocffi found no libcairo
        missing = "cairosvg" if isinstance(e, ImportError) else "the cairo library"
        raise PngConverterMissingError(
            f"PNG output needs the 'png' extra ({missing} is missing): "
            "pip install 'introspect-bert[png]' (and apt-get install libcairo2); "
            "or write .svg or .html instead"
        ) from e
    try:
        return bytes(cairosvg.svg2png(bytestring=svg.encode("utf-8"), scale=scale))
    except Exception as e:  # cairo refuses sizes it cannot hold; say so in one line
        raise IntrospectError(f"cannot rasterise this picture to PNG ({e}); "
                              "write .svg or .html instead") from e


def check_png_converter() -> None:
    """Fail early, before any model work, when PNG cannot be made here."""
    svg_to_png('<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>', scale=1.0)
