#!/usr/bin/env python3
"""Sweeps `troupe bench control-plane` over member counts (issue 41).

Runs each size R times (one lost member, then 10 % lost at once), keeps the median of
every figure, prints a markdown table and writes the curves as SVG beside the table.

  python3 bench/control_plane_sweep.py --sizes 100,1000,4000,10000 --runs 3 \
      --svg-dir docs/benchmarks --json-out /tmp/scale.json

Aggregation through the nodes' relays against members that talk to the coordinator directly,
in one session (the direct sweep first, its JSON then drawn beside the aggregated one):

  python3 bench/control_plane_sweep.py --sizes 1000,4000,10000 --json-out /tmp/direct.json
  python3 bench/control_plane_sweep.py --sizes 1000,4000,10000 --baseline /tmp/direct.json \
      --svg-dir docs/benchmarks -- --aggregate

Each run starts its own coordinator; the machine should be otherwise idle.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TROUPE = os.environ.get("TROUPE_BIN", os.path.join(HERE, "..", "build", "cli", "troupe"))

ROWS = [
    ("forming_s", "forming (s)", 1),
    ("step_control_ms_p50", "control share p50 (ms)", 1),
    ("step_control_ms_p99", "control share p99 (ms)", 1),
    ("loss_to_commit_less_step_s", "1 lost -> commit, less a step (s)", 1),
    ("mass_loss_to_commit_less_step_s", "10 % lost -> commit, less a step (s)", 1),
    ("coordinator_cpu_s_per_step", "coordinator CPU per step (s)", 1),
    ("rss_per_member_bytes", "coordinator memory per member (KB)", 1e-3),
    ("heartbeats_in_per_s", "heartbeats in (1/s)", 1),
    ("coordinator_messages_in_per_step", "messages in per step", 1),
    ("coordinator_messages_out_per_step", "messages out per step", 1),
    ("loopback_bytes_per_s", "control bytes (MB/s)", 1e-6),
    ("events_bytes_per_step", "events.jsonl per step (bytes)", 1),
    ("metrics_bytes", "one /metrics scrape (KB)", 1e-3),
    ("sim_cpu_s_per_step", "simulator CPU per step (s)", 1),
    ("machine_cores_busy", "cores busy (of 2)", 1),
]


def run_once(members, steps, step_ms, extra):
    cmd = [TROUPE, "bench", "control-plane", "--members", str(members), "--steps", str(steps),
           "--step-ms", str(step_ms), "--lose", "1", "--lose-percent", "10", "--json"] + extra
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-2000:])
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def median_of(results, key):
    values = [r[key] for r in results if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def svg_curve(path, title, ylabel, series):
    """A log-log line chart of {name: [(x, y), ...]}, hand-written SVG (no plotting library
    is packaged here)."""
    w, h, left, bottom, top, right = 560, 340, 70, 50, 30, 20
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts if y > 0]
    x0, x1 = math.log10(min(xs)), math.log10(max(xs))
    y0, y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
    if y1 == y0:
        y1 += 1
    px = lambda x: left + (math.log10(x) - x0) / max(1e-9, x1 - x0) * (w - left - right)
    py = lambda y: h - bottom - (math.log10(y) - y0) / (y1 - y0) * (h - bottom - top)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'font-family="sans-serif" font-size="11">',
           f'<text x="{w / 2}" y="16" text-anchor="middle" font-size="13">{title}</text>',
           f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="#000"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="#000"/>',
           f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">members (log)</text>',
           f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" '
           f'text-anchor="middle">{ylabel} (log)</text>']
    for e in range(int(y0), int(y1) + 1):
        y = py(10 ** e)
        out.append(f'<line x1="{left}" y1="{y}" x2="{w - right}" y2="{y}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4}" text-anchor="end">1e{e}</text>')
    for x in sorted(set(xs)):
        out.append(f'<text x="{px(x)}" y="{h - bottom + 16}" text-anchor="middle">{x}</text>')
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    for i, (name, pts) in enumerate(series.items()):
        pts = [(x, y) for x, y in sorted(pts) if y > 0]
        c = colours[i % len(colours)]
        out.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' %
                   (c, " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)))
        for x, y in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{c}"/>')
        out.append(f'<text x="{left + 10}" y="{top + 14 + 14 * i}" fill="{c}">{name}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000,4000,10000")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--step-ms", type=int, default=200)
    ap.add_argument("--svg-dir", default="")
    ap.add_argument("--json-out", default="")
    ap.add_argument("--baseline", default="",
                    help="an earlier sweep's --json-out (direct): drawn beside this one in "
                         "scale_aggregate.svg, with its ratios in the table")
    ap.add_argument("extra", nargs="*", help="more `troupe bench control-plane` options")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    table = {}
    for n in sizes:
        results = []
        for r in range(a.runs):
            res = run_once(n, a.steps, a.step_ms, a.extra)
            print(f"# {n} members, run {r + 1}: " + json.dumps(res), file=sys.stderr, flush=True)
            results.append(res)
        table[n] = {key: median_of(results, key) for key, _, _ in ROWS}
        table[n]["runs"] = results
    print("| figure | " + " | ".join(f"{n:,}" for n in sizes) + " |")
    print("|---|" + "---:|" * len(sizes))
    for key, label, scale in ROWS:
        cells = []
        for n in sizes:
            v = table[n][key]
            cells.append("—" if v is None else f"{v * scale:.3g}")
        print(f"| {label} | " + " | ".join(cells) + " |")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({str(n): table[n] for n in sizes}, f, indent=1)
    if a.baseline:
        with open(a.baseline) as f:
            base = json.load(f)
        print()
        print("| this / baseline | " + " | ".join(f"{n:,}" for n in sizes) + " |")
        print("|---|" + "---:|" * len(sizes))
        for key, label, _ in ROWS:
            cells = []
            for n in sizes:
                b, v = base.get(str(n), {}).get(key), table[n][key]
                cells.append("—" if not b or v is None else f"{v / b:.2g}")
            print(f"| {label} | " + " | ".join(cells) + " |")
        if a.svg_dir:
            both = lambda k, t: [(n, t[n][k]) for n in sizes if t.get(n, {}).get(k)]
            base_n = {int(n): v for n, v in base.items()}
            svg_curve(os.path.join(a.svg_dir, "scale_aggregate.svg"),
                      "Control share of a step: direct against through the relays", "ms",
                      {"direct p50": both("step_control_ms_p50", base_n),
                       "direct p99": both("step_control_ms_p99", base_n),
                       "aggregated p50": both("step_control_ms_p50", table),
                       "aggregated p99": both("step_control_ms_p99", table)})
        return
    if a.svg_dir and len(sizes) > 1:
        pick = lambda k, s=1: [(n, table[n][k] * s) for n in sizes if table[n][k]]
        svg_curve(os.path.join(a.svg_dir, "scale_step.svg"), "The control plane's share of a step",
                  "ms", {"p50": pick("step_control_ms_p50"), "p99": pick("step_control_ms_p99"),
                         "coordinator CPU per step": pick("coordinator_cpu_s_per_step", 1e3)})
        svg_curve(os.path.join(a.svg_dir, "scale_recovery.svg"), "Loss to the next commit, less a step",
                  "s", {"1 member lost": pick("loss_to_commit_less_step_s"),
                        "10 % lost": pick("mass_loss_to_commit_less_step_s"),
                        "forming": pick("forming_s")})


if __name__ == "__main__":
    main()
