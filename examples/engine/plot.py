"""An SVG of a run, written by hand (no plotting library): the prefix hit rate and the host-tier
traffic (offloads and onboards, cumulative) over the steps, from `Engine.trace`."""

from __future__ import annotations

W, H, PAD = 720, 200, 48  # one panel: width, height, margin for the labels


def polyline(values, top: float, peak: float, color: str, steps: int) -> str:
    """The values as a polyline in the panel whose top edge is at `top`, scaled to `peak`."""
    stride = max(1, len(values) // 600)  # at most ~600 points
    pts = []
    for i in range(0, len(values), stride):
        x = PAD + (W - 2 * PAD) * i / max(1, steps - 1)
        y = top + H - (H * values[i] / peak if peak > 0 else 0)
        pts.append(f"{x:.1f},{y:.1f}")
    return f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{" ".join(pts)}"/>'


def panel(top: float, title: str, series, peak: float, steps: int, fmt: str) -> list:
    out = [f'<rect x="{PAD}" y="{top}" width="{W - 2 * PAD}" height="{H}" fill="none" stroke="#999"/>',
           f'<text x="{PAD}" y="{top - 8}" font-size="13">{title}</text>',
           f'<text x="{PAD - 4}" y="{top + 4}" font-size="11" text-anchor="end">{fmt.format(peak)}</text>',
           f'<text x="{PAD - 4}" y="{top + H}" font-size="11" text-anchor="end">0</text>']
    for i, (name, values, color) in enumerate(series):
        out.append(polyline(values, top, peak, color, steps))
        out.append(f'<text x="{W - PAD}" y="{top + 16 + 14 * i}" font-size="11" fill="{color}" '
                   f'text-anchor="end">{name}</text>')
    return out


def svg(trace) -> str:
    """trace: per step (prefix hit rate, offloads, onboards), the last two cumulative."""
    steps = len(trace)
    hit = [t[0] for t in trace]
    off, on = [t[1] for t in trace], [t[2] for t in trace]
    top2 = PAD + H + PAD
    body = panel(PAD, "prefix hit rate (cumulative)", [("hit rate", hit, "#1f77b4")],
                 max(hit + [1e-9]), steps, "{:.3f}")
    body += panel(top2, "host-tier traffic, blocks (cumulative)",
                  [("offloads", off, "#d62728"), ("onboards", on, "#2ca02c")], max(off + on + [1]), steps, "{:.0f}")
    body.append(f'<text x="{W / 2}" y="{top2 + H + 32}" font-size="12" text-anchor="middle">step (of {steps})</text>')
    height = top2 + H + PAD
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" font-family="sans-serif">\n'
            f'<rect width="{W}" height="{height}" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n")


def write(path: str, trace) -> None:
    with open(path, "w") as f:
        f.write(svg(trace))
