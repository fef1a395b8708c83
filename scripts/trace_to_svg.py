#!/usr/bin/env python3
"""Render a megadecode decode-step trace (Chrome/Perfetto JSON from `bench decode --trace`) as an
SVG timeline: one row per SM (process 0 of the trace), a coloured bar per task, its counter waits
(red) and weight-page waits (black) drawn over it from process 1, idle time blank. Standard
library only (runs on the GPU machine too).

  scripts/trace_to_svg.py TRACE.json[.gz] OUT.svg [--width 1800] [--row 5] [--pid 0]
"""
import argparse
import gzip
import html
import json
import sys

COLOURS = {
    "qkv": "#1f77b4", "attn": "#ff7f0e", "o_proj": "#2ca02c", "router": "#17becf", "expert_up": "#bcbd22",
    "expert_down": "#7f7f7f", "lm_head": "#637939", "sample": "#843c39", "wait": "#d62728", "pages": "#000000",
}
OTHER = "#aaaaaa"


def nice_step(span_us, target_ticks=10):
    raw = span_us / max(target_ticks, 1)
    step = 1.0
    while step * 10 <= raw:
        step *= 10
    while step > raw and step > 1e-3:
        step /= 10
    for m in (1, 2, 5, 10):
        if step * m >= raw:
            return step * m
    return step * 10


def load(path, pid):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    rows, overlay = {}, {}
    for e in events:
        if e.get("ph") != "X":
            continue
        if e.get("pid") == pid:
            rows.setdefault(int(e["tid"]), []).append((float(e["ts"]), float(e["dur"]), e.get("cat", "")))
        elif pid == 0 and e.get("pid") == 1 and (e.get("cat") == "wait" or e.get("name") == "pages"):
            cat = "wait" if e.get("cat") == "wait" else "pages"
            overlay.setdefault(int(e["tid"]), []).append((float(e["ts"]), float(e["dur"]), cat))
    other = doc.get("otherData", {}) if isinstance(doc, dict) else {}
    return rows, overlay, other


def render(rows, overlay, other, width, row_h):
    left, top, legend_h = 60, 40, 40
    tids = sorted(rows)
    t0 = min((s[0] for r in rows.values() for s in r), default=0.0)
    t1 = max((s[0] + s[1] for r in rows.values() for s in r), default=1.0)
    span = max(t1 - t0, 1e-6)
    plot_w = width - left - 20
    height = top + len(tids) * row_h + 30 + legend_h
    scale = plot_w / span
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    title = "decode step trace"
    if other:
        keys = ("backend", "batch", "context", "policy", "device")
        title += ": " + ", ".join(f"{k} {other[k]}" for k in keys if k in other)
        if "busy_frac" in other:
            title += (f" | working {100 * other['busy_frac']:.1f}%, waiting on counters "
                      f"{100 * other.get('wait_frac', 0):.1f}%, for pages {100 * other.get('page_frac', 0):.1f}%, "
                      f"outside tasks {100 * other.get('idle_frac', 0):.1f}%")
    out.append(f'<text x="{left}" y="16" font-size="13">{html.escape(title)} ({span:.1f} us)</text>')
    totals = {}
    n_rects = 0
    for i, tid in enumerate(tids):
        y = top + i * row_h
        if row_h >= 8 or i % max(1, int(10 / row_h)) == 0:
            out.append(f'<text x="{left - 4}" y="{y + row_h - 1}" text-anchor="end" font-size="{min(9, max(6, row_h))}">'
                       f'SM {tid}</text>')
        # Merge neighbours of the same category closer than half a pixel: keeps the file small.
        # Tasks first, then the waits inside them on top.
        cur = None
        for ts, dur, cat in sorted(rows[tid]) + [(None, None, None)] + sorted(overlay.get(tid, [])):
            if ts is None:
                if cur:
                    out.append(rect(cur, y, row_h))
                    n_rects += 1
                cur = None
                continue
            totals[cat] = totals.get(cat, 0.0) + dur
            x0, x1 = left + (ts - t0) * scale, left + (ts + dur - t0) * scale
            if cur and cur[2] == cat and x0 <= cur[1] + 0.5:
                cur[1] = max(cur[1], x1)
                continue
            if cur:
                out.append(rect(cur, y, row_h))
                n_rects += 1
            cur = [x0, x1, cat]
        if cur:
            out.append(rect(cur, y, row_h))
            n_rects += 1
    # Time axis.
    axis_y = top + len(tids) * row_h + 4
    out.append(f'<line x1="{left}" y1="{axis_y}" x2="{left + plot_w}" y2="{axis_y}" stroke="black"/>')
    step = nice_step(span)
    t = 0.0
    while t <= span + 1e-9:
        x = left + t * scale
        out.append(f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{axis_y + 4}" stroke="black"/>')
        out.append(f'<text x="{x:.1f}" y="{axis_y + 15}" text-anchor="middle">{t:g} us</text>')
        t += step
    # Legend: categories in pipeline order, with their share of the SM time.
    ly = axis_y + 30
    x = left
    sm_time = span * max(len(tids), 1)
    for cat in [c for c in COLOURS if c in totals] + sorted(c for c in totals if c not in COLOURS):
        label = f"{cat} {100 * totals[cat] / sm_time:.1f}%"
        out.append(f'<rect x="{x}" y="{ly - 9}" width="10" height="10" fill="{COLOURS.get(cat, OTHER)}"/>')
        out.append(f'<text x="{x + 13}" y="{ly}">{html.escape(label)}</text>')
        x += 13 + 7 * len(label) + 12
    out.append("</svg>")
    return "\n".join(out) + "\n", n_rects, totals, span


def rect(cur, y, row_h):
    x0, x1, cat = cur
    w = max(x1 - x0, 0.3)
    return (f'<rect x="{x0:.1f}" y="{y}" width="{w:.1f}" height="{max(row_h - 1, 1)}" '
            f'fill="{COLOURS.get(cat, OTHER)}"/>')


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--width", type=int, default=1800)
    ap.add_argument("--row", type=int, default=5, help="pixels per SM row")
    ap.add_argument("--pid", type=int, default=0, help="trace process to draw (0: SM work and waits)")
    a = ap.parse_args(argv)
    if a.width < 200 or a.row < 1:
        ap.error("--width must be >= 200 and --row >= 1")
    rows, overlay, other = load(a.trace, a.pid)
    if not rows:
        print(f"{a.trace}: no complete ('X') events in process {a.pid}", file=sys.stderr)
        return 1
    svg, n_rects, totals, span = render(rows, overlay, other, a.width, a.row)
    with open(a.out, "w") as f:
        f.write(svg)
    print(f"{a.out}: {len(rows)} rows, {n_rects} bars, {span:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
