"""Goodput accounting (issue 28): every rank-second of a job is in exactly one phase, so the
phases sum to wall time x rank slots within 2 %, on four real jobs: the default job (fewer
steps), 4 ranks with one killed (a recovery), a pipeline (a bubble) and a straggler (the
others wait for it). Checked three ways: the final `goodput` event against the job's own
start and end in events.jsonl, the per-step `phases` against each step's interval, and the
live `troupe_rank_seconds_total{phase}` counters of a real scrape against the clock."""

import os
import tempfile
import time
import urllib.request

from harness import SMALL_MODEL, Job, fail, free_port, main, read_events, run_ok, wait_until

PHASES = {"compute", "exposed_comm", "bubble", "straggler_wait", "control", "checkpoint_stall",
          "recovery", "redone", "forming", "idle"}
TOLERANCE = 0.02


def of(events, name):
    return [e for e in events if e.get("event") == name]


def check_sums(name, events, slots):
    """The last goodput event covers the job's wall time x slots; returns its phases."""
    goodput = of(events, "goodput")
    if not goodput:
        fail(f"{name}: no goodput event")
    last = goodput[-1]
    phases = last["phases"]
    if set(phases) != PHASES:
        fail(f"{name}: the goodput event names phases {sorted(phases)}, not {sorted(PHASES)}")
    if any(v < 0 for v in phases.values()):
        fail(f"{name}: a negative phase: {phases}")
    total = sum(phases.values())
    if last["slots"] != slots:
        fail(f"{name}: {last['slots']} slots accounted, the job ran {slots}")
    # Against the job's own bounds in events.jsonl (written by other code than the ledger).
    start = of(events, "job_start")[0]["unix_ms"]
    end = [e for e in events if e.get("event") in ("job_done", "job_failed")][-1]["unix_ms"]
    wall = (end - start) / 1000
    expected = wall * slots
    if abs(total - expected) > TOLERANCE * expected:
        fail(f"{name}: the phases sum to {total:.3f} rank-seconds, wall x slots is "
             f"{wall:.3f} x {slots} = {expected:.3f} (more than 2 % apart)")
    if abs(last["rank_seconds"] - total) > 1e-6 * max(total, 1):
        fail(f"{name}: rank_seconds {last['rank_seconds']} is not the phases' sum {total}")
    if not 0 < last["goodput"] <= 1 or abs(last["goodput"] - phases["compute"] / total) > 1e-9:
        fail(f"{name}: goodput {last['goodput']} is not compute / rank-seconds")
    if not 0 < last["mfu"] < 1 or last["peak_flops"] <= 0:
        fail(f"{name}: MFU {last['mfu']} against peak {last['peak_flops']} is not an estimate")
    # Each step's phases cover its interval: the time since the previous step (or the mark the
    # ledger moved at a generation's start) times the slots.
    steps = of(events, "step")
    for s in steps:
        if "phases" not in s:
            fail(f"{name}: step {s['step']} has no phases")
    per_step = sum(sum(s["phases"].values()) for s in steps)
    if per_step > total * (1 + 1e-9):
        fail(f"{name}: the steps' phases ({per_step:.3f}) exceed the job's total ({total:.3f})")
    print(f"ok: {name}: {total:.2f} rank-seconds over {wall:.2f} s x {slots} slots; "
          + ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(phases.items(), key=lambda x: -x[1])
                      if v > 0), flush=True)
    return phases, total


def scrape_phases(port):
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in body.splitlines():
        if line.startswith("troupe_rank_seconds_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('phase="')[1].split('"')[0]] = float(value)
    return out


def live(tmp):
    """A straggler job, scraped while it trains: the counters keep up with the clock."""
    name = "straggler (live scrape)"
    port = free_port()
    args = SMALL_MODEL + ["--world", "2", "--steps", "100", "--checkpoint-every", "20",
                          "--fault", "slow:rank=1:factor=30:from=1",
                          "--metrics-port", str(port)]
    with Job(args, run_dir=os.path.join(tmp, "straggler")) as job:
        wait_until(lambda: len(of(job.events(), "step")) >= 15 or job.proc.poll() is not None,
                   180, "15 committed steps")
        # Steps logged before the scrape are counted in it; nothing after it can be.
        before = job.events()
        phases = scrape_phases(port)
        scraped_at = time.time()
        if set(phases) != PHASES:
            fail(f"{name}: troupe_rank_seconds_total exports phases {sorted(phases)}")
        start = of(before, "job_start")[0]["unix_ms"] / 1000
        last_step = of(before, "step")[-1]["unix_ms"] / 1000
        total = sum(phases.values())
        # Counted up to the last commit at least, and never past the scrape.
        low, high = (last_step - start) * 2, (scraped_at - start) * 2
        if not low * (1 - TOLERANCE) <= total <= high * (1 + TOLERANCE):
            fail(f"{name}: {total:.3f} rank-seconds scraped, the clock says between "
                 f"{low:.3f} and {high:.3f}")
        code = job.wait(300)
        events = job.events()
    if code != 0:
        fail(f"{name}: exit {code}")
    final, total = check_sums("straggler", events, 2)
    if final["straggler_wait"] < 0.15 * total:
        fail(f"straggler: rank 0 waited {final['straggler_wait']:.2f} of {total:.2f} "
             "rank-seconds for the slow rank; expected at least 15 %")


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-goodput-") as tmp:
        # The default job, as `troupe run` trains it, with fewer steps.
        events = run_ok("default", ["--steps", "40", "--no-progress", "--metrics-port", "0"],
                        os.path.join(tmp, "default"))
        phases, total = check_sums("default job", events, of(events, "job_start")[0]["world"])
        if max(phases, key=phases.get) != "compute":
            fail(f"default job: compute is not the largest phase: {phases}")

        events = run_ok("kill", SMALL_MODEL + ["--world", "4", "--steps", "150",
                                               "--checkpoint-every", "10", "--metrics-port", "0",
                                               "--fault", "kill:rank=1:step=40"],
                        os.path.join(tmp, "kill"))
        if not of(events, "rank_lost"):
            fail("kill: no rank was lost")
        phases, total = check_sums("4 ranks, one killed", events, 4)
        if phases["recovery"] <= 0:
            fail(f"kill: no time in recovery: {phases}")

        events = run_ok("pipeline", SMALL_MODEL + ["--world", "2", "--pp", "2", "--micro-batches",
                                                   "4", "--steps", "400", "--metrics-port", "0"],
                        os.path.join(tmp, "pipeline"))
        phases, total = check_sums("pipeline pp2", events, 2)
        if phases["bubble"] <= 0:
            fail(f"pipeline: no bubble accounted: {phases}")

        live(tmp)


if __name__ == "__main__":
    main(test)
