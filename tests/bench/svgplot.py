# SPDX-License-Identifier: Apache-2.0
"""Two small SVG charts for the benchmarks (no plotting library in the tool chain).

`xy_chart`: lines with an optional min/max band and single reference points (the
job start time against job size, as the pcocc paper's Figure 2 draws it). `cdf_chart`:
empirical CDFs of latency samples (pod setup, podnet against the CNI bridge plugin).
Plain SVG 1.1: GitHub, browsers and docs viewers render it as is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf"]
REFERENCE = "#d62728"


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]
    #: (x, low, high) for a shaded band under the line
    band: list[tuple[float, float, float]] = field(default_factory=list)
    color: str = ""
    dashed: bool = False
    markers: bool = True


@dataclass
class Reference:
    """A single published point, drawn as a red square with its label."""

    label: str
    x: float
    y: float


def nice_step(span: float, ticks: int = 5) -> float:
    """A 1/2/5 x 10^k step giving about `ticks` intervals over `span`."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _fmt(v: float) -> str:
    return f"{v:.0f}" if abs(v - round(v)) < 1e-9 else f"{v:g}"


class _Canvas:
    def __init__(
        self,
        title: str,
        xlabel: str,
        ylabel: str,
        xmax: float,
        ymax: float,
        ymin: float = 0.0,
        ylog: bool = False,
        size: tuple[int, int] = (720, 440),
    ) -> None:
        self.w, self.h = size
        self.left, self.right, self.top, self.bottom = 72, 48, 44, 56
        self.ylog = ylog
        self.xstep = nice_step(xmax)
        self.xmax = math.ceil(xmax / self.xstep) * self.xstep
        if ylog:  # ticks at 1, 2, 5 x 10^k, from the one below ymin to the one above ymax
            k0, k1 = math.floor(math.log10(max(ymin, 1e-9))), math.ceil(math.log10(ymax))
            ticks = [m * 10**k for k in range(k0, k1 + 1) for m in (1, 2, 5)]
            self.ymin = max(t for t in ticks if t <= max(ymin, ticks[0]))
            self.ymax = min(t for t in ticks if t >= ymax)
            yticks = [t for t in ticks if self.ymin <= t <= self.ymax]
        else:
            ystep = nice_step(ymax)
            self.ymin, self.ymax = 0.0, math.ceil(ymax / ystep) * ystep
            yticks = [i * ystep for i in range(round(self.ymax / ystep) + 1)]
        self.out = [
            f'<text x="{self.w / 2}" y="22" text-anchor="middle" font-size="14" '
            f'font-weight="bold">{escape(title)}</text>',
        ]
        x0, y0, x1, y1 = self.left, self.h - self.bottom, self.w - self.right, self.top
        for i in range(round(self.xmax / self.xstep) + 1):
            v = i * self.xstep
            x, _ = self.xy(v, self.ymin)
            self.out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y1}" stroke="#eee"/>')
            self.out.append(
                f'<text x="{x:.1f}" y="{y0 + 16}" text-anchor="middle">{_fmt(v)}</text>'
            )
        for v in yticks:
            _, y = self.xy(0, v)
            self.out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" stroke="#eee"/>')
            self.out.append(
                f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(v)}</text>'
            )
        self.out += [
            f'<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="black"/>',
            f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>',
            f'<text x="{(x0 + x1) / 2}" y="{self.h - 14}" text-anchor="middle">'
            f"{escape(xlabel)}</text>",
            f'<text x="18" y="{(y0 + y1) / 2}" text-anchor="middle" '
            f'transform="rotate(-90 18 {(y0 + y1) / 2})">{escape(ylabel)}</text>',
        ]
        self.legend: list[tuple[str, str, str]] = []  # (label, color, kind)

    def xy(self, x: float, y: float) -> tuple[float, float]:
        pw = self.w - self.left - self.right
        ph = self.h - self.top - self.bottom
        if self.ylog:
            lo, hi = math.log10(self.ymin), math.log10(self.ymax)
            f = (math.log10(max(y, self.ymin)) - lo) / (hi - lo)
        else:
            f = y / self.ymax
        return self.left + x / self.xmax * pw, self.h - self.bottom - f * ph

    def path(self, pts: Sequence[tuple[float, float]]) -> str:
        return " ".join(f"{self.xy(x, y)[0]:.1f},{self.xy(x, y)[1]:.1f}" for x, y in pts)

    def finish(self) -> str:
        """The SVG, with the legend under the plot (it never hides a curve)."""
        lx, ly = self.left, self.h + 4
        height = self.h + 18 * len(self.legend) + 12
        head = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.w}" height="{height}" '
            f'viewBox="0 0 {self.w} {height}" font-family="DejaVu Sans, Arial, sans-serif" '
            'font-size="12">',
            f'<rect width="{self.w}" height="{height}" fill="white"/>',
        ]
        for label, color, kind in self.legend:
            if kind == "band":
                self.out.append(
                    f'<rect x="{lx}" y="{ly - 6}" width="22" height="10" fill="{color}" '
                    'fill-opacity="0.18"/>'
                )
            elif kind == "ref":
                self.out.append(
                    f'<rect x="{lx + 6}" y="{ly - 6}" width="10" height="10" fill="{color}"/>'
                )
            else:
                dash = ' stroke-dasharray="6 4"' if kind == "dashed" else ""
                self.out.append(
                    f'<line x1="{lx}" y1="{ly}" x2="{lx + 22}" y2="{ly}" stroke="{color}" '
                    f'stroke-width="2"{dash}/>'
                )
            self.out.append(f'<text x="{lx + 28}" y="{ly + 4}">{escape(label)}</text>')
            ly += 18
        self.out.append("</svg>")
        return "\n".join(head + self.out) + "\n"


def xy_chart(
    title: str,
    xlabel: str,
    ylabel: str,
    series: Sequence[Series],
    references: Sequence[Reference] = (),
    xmax: float | None = None,
    ymax: float | None = None,
    ylog: bool = False,
) -> str:
    """Lines with their values at the points, optional bands, reference points."""
    xs = [x for s in series for x, _ in s.points] + [r.x for r in references]
    ys = (
        [y for s in series for _, y in s.points]
        + [hi for s in series for _, _, hi in s.band]
        + [r.y for r in references]
    )
    lows = [y for s in series for _, y in s.points] + [lo for s in series for _, lo, _ in s.band]
    c = _Canvas(
        title,
        xlabel,
        ylabel,
        xmax or max(xs) * 1.05,
        ymax or max(ys) * (1.0 if ylog else 1.1),
        min(lows) if ylog else 0.0,
        ylog,
    )
    labels: dict[float, list[tuple[float, float, str, str]]] = {}  # x -> (px, py, text, color)
    for i, s in enumerate(series):
        color = s.color or PALETTE[i % len(PALETTE)]
        if s.band:
            pts = [(x, lo) for x, lo, _ in s.band] + [(x, hi) for x, _, hi in reversed(s.band)]
            c.out.append(f'<polygon points="{c.path(pts)}" fill="{color}" fill-opacity="0.18"/>')
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        c.out.append(
            f'<polyline points="{c.path(s.points)}" fill="none" stroke="{color}" '
            f'stroke-width="2"{dash}/>'
        )
        if s.markers:
            for x, y in s.points:
                px, py = c.xy(x, y)
                c.out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3.5" fill="{color}"/>')
                labels.setdefault(x, []).append((px, py, f"{y:.0f}", color))
        c.legend.append((s.label, color, "dashed" if s.dashed else "line"))
    last = max(labels, default=0)
    for x, group in labels.items():
        # beside the points (left of the last column), pushed apart to 14 px or more
        group.sort(key=lambda g: g[1])
        ys = [g[1] + 4 for g in group]
        for k in range(1, len(ys)):
            ys[k] = max(ys[k], ys[k - 1] + 14)
        for (px, _, text, color), y in zip(group, ys, strict=True):
            tx, anchor = (px - 7, "end") if x == last else (px + 7, "start")
            c.out.append(
                f'<text x="{tx:.1f}" y="{y:.1f}" fill="{color}" text-anchor="{anchor}" '
                f'stroke="white" stroke-width="3" paint-order="stroke">{text}</text>'
            )
    for r in references:
        px, py = c.xy(r.x, r.y)
        c.out.append(
            f'<rect x="{px - 5:.1f}" y="{py - 5:.1f}" width="10" height="10" fill="{REFERENCE}"/>'
        )
        c.out.append(f'<text x="{px + 9:.1f}" y="{py + 4:.1f}" fill="{REFERENCE}">{r.y:.0f}</text>')
        c.legend.append((r.label, REFERENCE, "ref"))
    return c.finish()


def cdf_points(samples: Sequence[float]) -> list[tuple[float, float]]:
    """The empirical CDF as a step line: (value, fraction of samples <= value)."""
    s = sorted(samples)
    n = len(s)
    pts: list[tuple[float, float]] = [(s[0], 0.0)] if s else []
    for i, v in enumerate(s):
        pts.append((v, i / n))
        pts.append((v, (i + 1) / n))
    return pts


@dataclass
class Cdf:
    label: str
    samples: Sequence[float]
    color: str = ""
    dashed: bool = False


def cdf_chart(title: str, xlabel: str, series: Sequence[Cdf], xmax: float | None = None) -> str:
    """One CDF line per series; x cut at `xmax` (default: the largest p99.5, so that one
    outlier does not squash the curves; the legend gives p50 and p99 of all samples)."""
    if xmax is None:
        tails = [
            sorted(c.samples)[min(len(c.samples) - 1, int(len(c.samples) * 0.995))]
            for c in series
            if c.samples
        ]
        xmax = max(tails) * 1.05
    c = _Canvas(title, xlabel, "fraction of pods set up (CDF)", xmax, 1.0)
    c.out.append(
        f'<clipPath id="plot"><rect x="{c.left}" y="{c.top}" '
        f'width="{c.w - c.left - c.right}" height="{c.h - c.top - c.bottom}"/></clipPath>'
    )
    for i, cdf in enumerate(series):
        if not cdf.samples:
            continue
        color = cdf.color or PALETTE[i % len(PALETTE)]
        dash = ' stroke-dasharray="6 4"' if cdf.dashed else ""
        c.out.append(
            f'<polyline points="{c.path(cdf_points(cdf.samples))}" fill="none" '
            f'stroke="{color}" stroke-width="2"{dash} clip-path="url(#plot)"/>'
        )
        s = sorted(cdf.samples)
        p50, p99 = s[len(s) // 2], s[min(len(s) - 1, int(len(s) * 0.99))]
        c.legend.append(
            (
                f"{cdf.label}: p50 {p50:.1f} ms, p99 {p99:.1f} ms (n={len(s)})",
                color,
                "dashed" if cdf.dashed else "line",
            )
        )
    return c.finish()
