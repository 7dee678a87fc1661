#!/usr/bin/env python3
"""Plot quiver-bench-learners' table: samples/s relative to single-stream against the number of
learners, one line per model and batch. Writes a self-contained SVG (no plotting library needed).

usage: scripts/plot_learners.py learners.md docs/learners.svg
"""
import argparse
import html
import math
import sys

from atomic_write import write_atomically  # scripts/atomic_write.py


MOST_RATIO = 1e12  # k learners against one: anything near this is a broken table, and the plot's
                  # scale (1.1x the largest) must stay finite


def read_table(path):
    """The learner counts in ascending order and, per table row, its name and its ratios to
    single-stream in that order. Raises ValueError when the file holds no such table."""
    rows = []
    with open(path) as f:
        lines = [line.strip() for line in f if line.strip().startswith("|")]
    if len(lines) < 3:
        raise ValueError(f"{path}: no table with data rows (expected quiver-bench-learners --output)")
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    if "single-stream samples/s" not in header:
        raise ValueError(f"{path}: no 'single-stream samples/s' column: not a quiver-bench-learners table")
    ks = [int(h.split()[0]) for h in header if h.endswith("learner(s)")]
    if not ks:
        raise ValueError(f"{path}: no 'k learner(s)' columns")
    order = sorted(range(len(ks)), key=lambda i: ks[i])
    first = header.index("single-stream samples/s")
    gated = "staleness" in header
    period = header.index("sync period") if "sync period" in header else None  # tables since 2026-11-27
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) < first + 1 + len(ks):
            raise ValueError(f"{path}: row '{line}' has {len(cells)} cells, the header {len(header)}")
        name = f"{cells[0]} b{cells[1]}" + (f" s{cells[2]}" if gated else "")
        if period is not None and cells[period] != "1":
            name += f" p{cells[period]}"  # SMA every that many rounds

        def rate(cell, column):
            """A samples/s cell as a finite, positive number: an inf or nan would draw nothing."""
            try:
                value = float(cell)
            except ValueError:
                value = float("nan")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{path}: {column} of '{name}' is '{cell}', not a positive finite samples/s")
            return value

        single = rate(cells[first], "single-stream samples/s")
        rates = [rate(c, header[first + 1 + i]) for i, c in enumerate(cells[first + 1:first + 1 + len(ks)])]
        ratios = [rates[i] / single for i in order]
        if not all(r <= MOST_RATIO for r in ratios):  # also an overflow to inf
            raise ValueError(f"{path}: a ratio of '{name}' to its single-stream samples/s is above {MOST_RATIO:g}: "
                             "no measurement")
        rows.append((name, ratios))
    return [ks[i] for i in order], rows


def svg(ks, rows, title):
    width, height, left, right, top, bottom = 640, 400, 60, 150, 40, 50
    plot_w, plot_h = width - left - right, height - top - bottom
    top_ratio = max(1.5, max(max(r) for _, r in rows) * 1.1)
    x = lambda k: left + (k - ks[0]) / max(1, ks[-1] - ks[0]) * plot_w
    y = lambda r: top + plot_h - r / top_ratio * plot_h
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="22" font-size="14">{title}</text>']
    step = 0.25  # a grid line every 0.25, or every 0.5, 1, 2, ... where that would draw more than 16
    while top_ratio / step > 16:
        step *= 2
    for i in range(int(top_ratio / step) + 1):
        r = i * step
        label = f"{r:.2f}" if step < 1 else f"{r:g}"
        out.append(f'<line x1="{left}" y1="{y(r):.1f}" x2="{left + plot_w}" y2="{y(r):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 8}" y="{y(r) + 4:.1f}" text-anchor="end">{label}</text>')
    out.append(f'<line x1="{left}" y1="{y(1):.1f}" x2="{left + plot_w}" y2="{y(1):.1f}" stroke="black" stroke-dasharray="4 3"/>')
    for k in ks:
        out.append(f'<text x="{x(k):.1f}" y="{top + plot_h + 18}" text-anchor="middle">{k}</text>')
    out.append(f'<text x="{left + plot_w / 2}" y="{height - 10}" text-anchor="middle">learners</text>')
    out.append(f'<text x="16" y="{top + plot_h / 2}" transform="rotate(-90 16 {top + plot_h / 2})" '
               f'text-anchor="middle">samples/s / single-stream</text>')
    for i, (name, ratios) in enumerate(rows):
        color = colors[i % len(colors)]
        points = " ".join(f"{x(k):.1f},{y(r):.1f}" for k, r in zip(ks, ratios))
        out.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="2"/>')
        for k, r in zip(ks, ratios):
            out.append(f'<circle cx="{x(k):.1f}" cy="{y(r):.1f}" r="3" fill="{color}"/>')
        out.append(f'<text x="{left + plot_w + 12}" y="{top + 14 + 18 * i}" fill="{color}">{html.escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(prog="plot_learners.py", description=__doc__.strip().split("\n\n")[0])
    parser.add_argument("table", help="a table written by quiver-bench-learners --output")
    parser.add_argument("svg", help="the SVG to write (atomically)")
    args = parser.parse_args()
    try:
        ks, rows = read_table(args.table)
    except (OSError, ValueError, IndexError) as error:
        sys.exit(f"plot_learners: {error}")
    text = svg(ks, rows, "k learners with SMA vs single-stream (dashed: 1.0)")
    try:
        write_atomically(args.svg, text)
    except OSError as error:
        sys.exit(f"plot_learners: cannot write {args.svg}: {error}")


if __name__ == "__main__":
    main()
