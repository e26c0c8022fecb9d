"""The soak's results: OUT/soak.json (every fault, the comparison, the job's goodput) and
OUT/soak.md, the table: faults by kind with detection, recovery and back-to-whole times
(p50 / p99 / max), steps redone, and the job's phase breakdown."""

import json
import os


def quantile(values, q):
    """The q-quantile by nearest rank (q in [0, 1]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))
    return ordered[index]


def seconds(ms):
    return "-" if ms is None else f"{ms / 1000:.2f}"


def triple(values):
    if not values:
        return "-"
    return " / ".join(seconds(quantile(values, q)) for q in (0.5, 0.99, 1.0))


def diverge_records(view):
    """The poisoned batches as faults: detected at the vote that saw them, recovered at the
    first step of the generation the rollback opened."""
    out = []
    for e in view.events:
        if e.get("event") != "diverged":
            continue
        first = view.first(e["unix_ms"], "step", lambda s: s["generation"] > e["generation"])
        r = {"kind": "diverge", "target": f"batch of step {e['step']} ({e.get('what', '')})",
             "t0": e["unix_ms"], "detect_ms": 0}
        if first:
            r["recover_ms"] = first["unix_ms"] - e["unix_ms"]
        out.append(r)
    return out


def accounting(view, slots=4):
    """Where the soak's rank-seconds went, from the events alone (every leader's, across
    takeovers): wall time from the job's first event to its last x the 4 ranks; inside each
    committed step the phases the step event carries (a step committed again after a rollback
    counts as redone); the rest is time between committed steps: detecting, recovering,
    forming, waiting for a replacement."""
    if not view.events:
        return None
    wall = (view.events[-1]["unix_ms"] - view.events[0]["unix_ms"]) / 1000
    total = wall * slots
    phases, seen = {}, set()
    for e in view.steps:
        again = e["step"] in seen
        seen.add(e["step"])
        for name, value in (e.get("phases") or {}).items():
            key = "redone" if again else name
            phases[key] = phases.get(key, 0.0) + value
    phases["between steps"] = max(0.0, total - sum(phases.values()))
    return {"wall_s": wall, "rank_seconds": total, "phases": phases,
            "goodput": phases.get("compute", 0.0) / total if total > 0 else 0.0}


def write(out, soak, failed=None):
    view = getattr(soak, "view", None)
    records = list(soak.records) + (diverge_records(view) if view else [])
    kinds = sorted({r["kind"] for r in records})
    goodput = None
    if view:
        g = [e for e in view.events if e.get("event") == "goodput"]
        goodput = g[-1] if g else None
    summary = {
        "faults": len(records),
        "seed": soak.opts.seed,
        "failed": failed,
        "steps_committed": len(view.steps) if view else 0,
        "steps_redone": view.redone if view else 0,
        "last_step": view.max_step if view else 0,
        "generations": view.generation if view else 0,
        "steps_without_event": (view.max_step - len({e["step"] for e in view.steps}))
        if view else 0,
        "comparison": getattr(soak, "result", None),
        "accounting": accounting(view) if view else None,
        "last_leader_goodput": goodput,
    }
    with open(os.path.join(out, "soak.json"), "w") as f:
        json.dump({"summary": summary, "faults": records}, f, indent=1, default=str)

    lines = [f"# troupe soak: {len(records)} faults, seed {soak.opts.seed}"
             + (f" — FAILED: {failed}" if failed else ""), "",
             "| kind | faults | detected p50 / p99 / max (s) | trained again p50 / p99 / max (s)"
             " | whole again p50 / p99 / max (s) | steps redone |",
             "|---|---:|---|---|---|---:|"]
    for kind in kinds:
        rs = [r for r in records if r["kind"] == kind]
        lines.append(
            f"| {kind} | {len(rs)} | {triple([r['detect_ms'] for r in rs if 'detect_ms' in r])}"
            f" | {triple([r['recover_ms'] for r in rs if 'recover_ms' in r])}"
            f" | {triple([r['full_ms'] for r in rs if 'full_ms' in r])}"
            f" | {sum(r.get('redone', 0) for r in rs)} |")
    lines.append(f"| **all** | {len(records)} | | | | {summary['steps_redone']} |")
    lines.append("")
    lines.append(f"Steps committed: {summary['steps_committed']} (last {summary['last_step']}, "
                 f"{summary['steps_redone']} redone; {summary['steps_without_event']} committed "
                 f"while the disk was full left no event), generations: "
                 f"{summary['generations']}.")
    c = summary["comparison"]
    if c:
        bits = ("every step's loss and the final state bit for bit"
                if c.get("same_state_bits") and not c.get("unequal_loss_steps") else
                f"{c.get('unequal_loss_steps', '?')} steps' losses unequal")
        lines.append(f"Against the undisturbed run of steps 1..{c['end_step']} "
                     f"(--reduction exact): {bits}; worst step loss "
                     f"difference {c['worst_loss_difference']:.1e} (step "
                     f"{c['worst_loss_step']}), final parameters "
                     f"{c['parameter_difference']:.1e} (relative L2).")
    a = summary["accounting"]
    if a:
        lines += ["", f"Goodput over the whole soak: {a['goodput']:.2%} (useful compute / "
                      f"{a['wall_s']:.0f} s x 4 ranks = {a['rank_seconds']:.0f} rank-seconds; "
                      "from the step events, every leader's):", "",
                  "| phase | rank-seconds | share |", "|---|---:|---:|"]
        for name, value in sorted(a["phases"].items(), key=lambda kv: -kv[1]):
            lines.append(f"| {name} | {value:.1f} | {value / a['rank_seconds']:.1%} |")
    if goodput:
        phases = goodput.get("phases", {})
        total = sum(phases.values()) or 1.0
        lines += ["", f"The last leader's own ledger (since it took the job over; spares "
                      f"included): goodput {goodput.get('goodput', 0):.2%} of {total:.0f} "
                      "rank-seconds, " +
                  ", ".join(f"{k} {v / total:.1%}" for k, v in
                            sorted(phases.items(), key=lambda kv: -kv[1]) if v > 0) + "."]
    with open(os.path.join(out, "soak.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
