"""The explorer's charts, drawn on the server as inline SVG: a heat strip of partition depths and sparklines.

Colours are SVG presentation attributes (not style attributes), so the page's Content-Security-Policy can forbid
inline styles. Every text that ends up in the SVG is escaped.
"""

from __future__ import annotations

from markupsafe import Markup, escape

CELL = 34  # px per partition in the heat strip
STRIP_HEIGHT = 32
DOWN_FILL = "#c62828"


def _heat(fraction: float) -> str:
    """White-blue for empty, deep blue for the fullest partition."""
    fraction = min(max(fraction, 0.0), 1.0)
    r = int(235 - fraction * (235 - 21))
    g = int(242 - fraction * (242 - 101))
    b = int(250 - fraction * (250 - 192))
    return f"#{r:02x}{g:02x}{b:02x}"


def heat_strip(depths: list[int | None], labels: list[str] | None = None) -> Markup:
    """One cell per partition coloured by its depth against the deepest; None (a partition down) is red with a
    cross. ``labels``: each cell's tooltip."""
    n = len(depths)
    deepest = max((d for d in depths if d is not None), default=0) or 1
    width = max(n, 1) * CELL
    parts = [
        f'<svg class="heat" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{STRIP_HEIGHT + 14}" '
        f'viewBox="0 0 {width} {STRIP_HEIGHT + 14}" role="img" aria-label="depth per partition">'
    ]
    for i, depth in enumerate(depths):
        x = i * CELL
        title = escape(labels[i]) if labels else escape(f"partition {i}: {depth}")
        if depth is None:
            parts.append(
                f'<g data-partition="{i}" data-down="1"><title>{title}</title>'
                f'<rect x="{x + 1}" y="1" width="{CELL - 2}" height="{STRIP_HEIGHT - 2}" fill="{DOWN_FILL}" rx="3"/>'
                f'<path d="M{x + 7} 8 L{x + CELL - 7} {STRIP_HEIGHT - 8} M{x + CELL - 7} 8 L{x + 7} {STRIP_HEIGHT - 8}"'
                ' stroke="#fff" stroke-width="2.5"/></g>'
            )
        else:
            fill = _heat(depth / deepest)
            parts.append(
                f'<g data-partition="{i}"><title>{title}</title>'
                f'<rect x="{x + 1}" y="1" width="{CELL - 2}" height="{STRIP_HEIGHT - 2}" fill="{fill}" '
                f'stroke="#9fb3c8" stroke-width="0.5" rx="3"/></g>'
            )
        parts.append(
            f'<text x="{x + CELL / 2}" y="{STRIP_HEIGHT + 11}" font-size="10" text-anchor="middle" '
            f'fill="#52606d">{i}</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def sparkline(
    values: list[float], color: str = "#1565c0", top: float | None = None, width: int = 120, height: int = 26
) -> Markup:
    """A line of ``values`` (oldest first) scaled to ``top`` (default: their largest; one ``top`` for all of an
    entity's partitions makes them comparable); a flat grey line while there are fewer than two."""
    head = (
        f'<svg class="spark" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img">'
    )
    if len(values) < 2:
        y = height - 2
        return Markup(
            f'{head}<line x1="0" y1="{y}" x2="{width}" y2="{y}" stroke="#cbd2d9" stroke-dasharray="3 3"/></svg>'
        )
    top = max(top or 0.0, max(values)) or 1.0
    step = width / (len(values) - 1)
    points = " ".join(f"{i * step:.1f},{height - 2 - (v / top) * (height - 4):.1f}" for i, v in enumerate(values))
    area = f"0,{height} {points} {width},{height}"
    return Markup(
        f"{head}<title>{escape(f'max {top:.1f}/s')}</title>"
        f'<polygon points="{area}" fill="{color}" fill-opacity="0.12"/>'
        f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="1.5"/></svg>'
    )
