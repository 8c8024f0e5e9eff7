#!/usr/bin/env python3
"""Draws the benchmark's scaling chart as an SVG, from bench.sh's results.

    loadtest/scaling_chart.py WORK_DIR OUT.svg CLIENT_CEILINGS WALLET_CEILINGS

WORK_DIR holds wallet-loadtest's JSON reports (throughput-N.json for N
clients, wallets-N.json for N wallets; throughput-32.json is also the
1,000-wallet point). Each ceiling list reads "x:transfers_per_s,...": the
database alone at that point. Two panels: against clients, and against
wallets; each shows accepted transfers/s and the database alone on the
left axis, the p99 of accepted transfers on the right.
"""
import json
import math
import sys
from pathlib import Path

CLIENTS = [8, 32, 128, 512]
WALLETS = [1_000, 100_000, 1_000_000]
PANEL_W, PANEL_H = 440, 300
SUPERSCRIPTS = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")
MARGIN = {"left": 64, "right": 60, "top": 40, "bottom": 48}


def report(work: Path, name: str) -> dict:
    data = json.loads((work / f"{name}.json").read_text())
    accepted = [o for o in data["outcomes"] if o["outcome"] in ("accepted", "degraded")]
    return {"rate": data["accepted_per_s"], "p99": accepted[0]["p99_ms"] if accepted else 0.0}


def ceilings(text: str) -> dict:
    pairs = (item.split(":") for item in text.split(",") if ":" in item)
    return {int(x): float(y) for x, y in pairs if y}


def nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    step = 10 ** math.floor(math.log10(value))
    for multiple in (1, 2, 2.5, 5, 10):
        if value <= multiple * step:
            return multiple * step
    return 10 * step


def panel(x0: int, title: str, xs: list, label, service: dict, alone: dict, x_name: str) -> str:
    plot_w = PANEL_W - MARGIN["left"] - MARGIN["right"]
    plot_h = PANEL_H - MARGIN["top"] - MARGIN["bottom"]
    left, top = x0 + MARGIN["left"], MARGIN["top"]
    lo, hi = math.log10(xs[0]), math.log10(xs[-1])

    def px(x):
        return left + (math.log10(x) - lo) / (hi - lo) * plot_w

    rate_max = nice_max(max([p["rate"] for p in service.values()] + list(alone.values())))
    p99_max = nice_max(max(p["p99"] for p in service.values()))

    def py_rate(v):
        return top + plot_h - v / rate_max * plot_h

    def py_p99(v):
        return top + plot_h - v / p99_max * plot_h

    parts = [
        f'<text x="{x0 + PANEL_W / 2}" y="20" text-anchor="middle" font-weight="bold">{title}</text>',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>',
    ]
    for x in xs:
        parts.append(f'<line x1="{px(x):.1f}" y1="{top + plot_h}" x2="{px(x):.1f}" y2="{top + plot_h + 4}" stroke="#999"/>')
        parts.append(f'<text x="{px(x):.1f}" y="{top + plot_h + 18}" text-anchor="middle">{label(x)}</text>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{PANEL_H - 8}" text-anchor="middle">{x_name} (log scale)</text>')
    for i in range(5):
        rate, p99 = rate_max * i / 4, p99_max * i / 4
        y = py_rate(rate)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{rate:,.0f}</text>')
        p99_text = f"{p99:,.1f}".rstrip("0").rstrip(".")
        parts.append(f'<text x="{left + plot_w + 6}" y="{y + 4:.1f}" fill="#b35900">{p99_text}</text>')
    parts.append(
        f'<text transform="translate({x0 + 14},{top + plot_h / 2}) rotate(-90)" text-anchor="middle">transfers/s</text>'
    )
    parts.append(
        f'<text transform="translate({x0 + PANEL_W - 12},{top + plot_h / 2}) rotate(90)" text-anchor="middle" '
        f'fill="#b35900">p99, ms</text>'
    )

    def polyline(points, colour, dash=""):
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in points)
        return f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2"{dashed}/>{dots}'

    # The database alone where it could run: pgbench needs a connection per
    # client, so its points need not be the service's.
    reachable = sorted(x for x in alone if xs[0] <= x <= xs[-1])
    parts.append(polyline([(px(x), py_rate(alone[x])) for x in reachable], "#888", "6 4"))
    parts.append(polyline([(px(x), py_rate(service[x]["rate"])) for x in xs], "#0550ae"))
    parts.append(polyline([(px(x), py_p99(service[x]["p99"])) for x in xs], "#b35900", "2 3"))
    return "\n".join(parts)


def main() -> None:
    work, out = Path(sys.argv[1]), Path(sys.argv[2])
    by_clients = {c: report(work, f"throughput-{c}") for c in CLIENTS}
    by_wallets = {w: report(work, "throughput-32" if w == 1_000 else f"wallets-{w}") for w in WALLETS}
    width, height = 2 * PANEL_W, PANEL_H + 40
    legend_y = PANEL_H + 24
    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        panel(0, "Against clients (1,000 wallets)", CLIENTS, str, by_clients, ceilings(sys.argv[3]), "clients"),
        panel(
            PANEL_W,
            "Against wallets (32 clients)",
            WALLETS,
            lambda w: "10" + str(round(math.log10(w))).translate(SUPERSCRIPTS),
            by_wallets,
            ceilings(sys.argv[4]),
            "wallets",
        ),
        f'<line x1="70" y1="{legend_y - 4}" x2="100" y2="{legend_y - 4}" stroke="#0550ae" stroke-width="2"/>'
        f'<text x="106" y="{legend_y}">the service, accepted transfers/s</text>'
        f'<line x1="330" y1="{legend_y - 4}" x2="360" y2="{legend_y - 4}" stroke="#888" stroke-width="2" '
        f'stroke-dasharray="6 4"/><text x="366" y="{legend_y}">the database alone (pgbench, transfer())</text>'
        f'<line x1="640" y1="{legend_y - 4}" x2="670" y2="{legend_y - 4}" stroke="#b35900" stroke-width="2" '
        f'stroke-dasharray="2 3"/><text x="676" y="{legend_y}">p99 of accepted transfers</text>',
        "</svg>",
    ]
    out.write_text("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
