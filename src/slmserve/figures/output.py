"""Figures: the output of a figure (:func:`save`): PNG and SVG (vl-convert), a self-contained HTML and the
caption as Markdown.
"""

from __future__ import annotations

import os
from pathlib import Path

import altair as alt

from slmserve import io

# --- output ---------------------------------------------------------------------------------------


def save(chart: alt.TopLevelMixin, caption_md: str, stem: str | os.PathLike[str]) -> list[Path]:
    """Write ``stem.png``, ``stem.svg``, ``stem.html`` (self-contained) and ``stem.caption.md``."""
    import vl_convert as vlc

    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    spec = chart.to_json()
    png = vlc.vegalite_to_png(spec, scale=2)
    svg = vlc.vegalite_to_svg(spec)
    html = vlc.vegalite_to_html(spec, bundle=True)
    out = []
    for ext, data in (
        (".png", png),
        (".svg", svg.encode()),
        (".html", html.encode()),
        (".caption.md", caption_md.encode()),
    ):
        path = stem.with_name(stem.name + ext)
        io.atomic_write_bytes(path, data)
        out.append(path)
    return out
