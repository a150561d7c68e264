"""The sizing curve as an inline SVG (no script: renders offline and in the fragment as is)."""

from __future__ import annotations

from html import escape
from typing import Any

W, H = 640, 260
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 16, 40


def curve_svg(rep: dict[str, Any]) -> str:
    """Reload share (of the blocks the GPU computed or reloaded) vs tier size; current and knee marked."""
    sizes = rep.get("sizes") or []
    if len(sizes) < 2:
        return ""
    in_gib = all(s.get("offload_gib") is not None for s in sizes)
    xs = [float(s["offload_gib"] if in_gib else s["blocks"]) for s in sizes]
    ys = [float(s["reload_share"]) for s in sizes]
    x_max = max(xs[-1], 1e-9)
    y_max = max(0.05, min(1.0, max(ys) * 1.15))

    def px(x: float) -> float:
        return LEFT + (W - LEFT - RIGHT) * min(x, x_max) / x_max

    def py(y: float) -> float:
        return TOP + (H - TOP - BOTTOM) * (1 - y / y_max)

    unit = "GiB" if in_gib else "blocks"
    parts = [
        f'<svg class="sizing-curve" viewBox="0 0 {W} {H}" role="img" '
        f'aria-label="share of computed prompt blocks a tier would reload, by tier size in {unit}">',
        f'<line x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}" class="axis"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{H - BOTTOM}" class="axis"/>',
    ]
    for i in range(5):
        x = x_max * i / 4
        parts.append(f'<text x="{px(x):.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{x:.3g}</text>')
        y = y_max * i / 4
        parts.append(f'<text x="{LEFT - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y * 100:.0f}%</text>')
    parts.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 6}" text-anchor="middle">tier size ({unit})</text>')
    pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys, strict=True))
    parts.append(f'<polyline points="{pts}" class="curve" fill="none"/>')
    cur = (rep.get("current_offload_gib") or {}).get("value")
    if in_gib and cur is not None:
        parts.append(
            f'<line x1="{px(cur):.1f}" y1="{TOP}" x2="{px(cur):.1f}" y2="{H - BOTTOM}" class="current">'
            f"<title>current tier: {cur:.3g} GiB</title></line>"
            f'<text x="{px(cur) + 4:.1f}" y="{TOP + 12}">current {cur:.3g} GiB</text>'
        )
    room = (rep.get("headroom") or {}).get("headroom_gib")
    if in_gib and room is not None and room <= x_max * 1.001:
        parts.append(
            f'<line x1="{px(room):.1f}" y1="{TOP}" x2="{px(room):.1f}" y2="{H - BOTTOM}" class="headroom">'
            f"<title>the host's pinned headroom ends at {room:.3g} GiB: the curve stops here</title></line>"
            f'<text x="{px(room) - 4:.1f}" y="{TOP + 26}" text-anchor="end">headroom ends {room:.3g} GiB</text>'
        )
    rec = rep.get("recommendation") or {}
    knee = rec.get("offload_gib") if in_gib else rec.get("blocks")
    if knee:
        share = _share_at(xs, ys, float(knee))
        parts.append(
            f'<circle cx="{px(float(knee)):.1f}" cy="{py(share):.1f}" r="5" class="knee">'
            f"<title>{escape(str(rec.get('why', '')))}</title></circle>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _share_at(xs: list[float], ys: list[float], x: float) -> float:
    for (x0, y0), (x1, y1) in zip(zip(xs, ys, strict=True), zip(xs[1:], ys[1:], strict=True), strict=False):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]
