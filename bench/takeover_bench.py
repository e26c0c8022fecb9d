#!/usr/bin/python3
"""troupe's coordinator takeover measured from its own events.jsonl (issue 27).

takeover: N trials of `troupe run --coordinators 2 --etcd local --fault kill:coordinator:step=10`
    (two coordinator processes, one leading through a private etcd; the leader decides to die as
    step 10 begins, logs a `fault` event, goes silent and is SIGKILLed 100 ms later). Per trial:
      kill -> first commit   the fault event's unix_ms to the first `step` event after it
      minus the silence      the same less the 100 ms the dying leader stays silent before its
                             SIGKILL (the part of the gap that the takeover itself takes)
      exit code              of `troupe run`
      all steps              every step 1..--steps committed, in order; a step may come twice only
                             when it is redone right after a takeover, with the same loss
      same workers           every member kept one pid over all its rank_joined events, and no
                             rank_lost event
    The summary gives the median and max over the trials that exited 0.

overhead: the per-step cost of etcd: the default job (troupe run's embedded model and batch,
    --steps small, --no-progress --metrics-port 0) as it is, with --etcd local (one
    coordinator), and with --coordinators 2 --etcd local, interleaved A B C A B C ...; each run's
    median `step_s` (steps after the first --skip), then the median over runs and the ratios.

    bench/takeover_bench.py [--troupe build/cli/troupe] [--only takeover|overhead]
                            [--trials 20] [--world 4] [--steps 30] [--kill-step 10]
                            [--timeout 300] [-- EXTRA troupe run options]
                            [--runs 5] [--overhead-steps 400] [--skip 5]

bench/torchrun_takeover.py measures torchrun's peer (its rendezvous host killed).
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recovery_bench import of, summary  # noqa: E402
from troupe_events import read_events  # noqa: E402

HA = ["--coordinators", "2", "--etcd", "local"]
# The smallest model: 32 sequences of one each, so that any world up to 32 divides the batch.
SMALL = ["--layers", "2", "--heads", "2", "--d-model", "32", "--context", "32", "--batch", "32",
         "--micro-batch", "1", "--eval-every", "0", "--no-progress", "--metrics-port", "0"]
SILENT_S = 0.100  # the dying leader's silence before its SIGKILL (actors/coordinator/job_supervisor.cpp die)


def run(troupe, args, timeout):
    """(exit code, events, output, wall seconds) of one `troupe run`; a run past `timeout` is
    killed (its whole process group) and reported with exit code None. A run that did not exit
    0 leaves its directory behind (the path ends its output)."""
    with tempfile.TemporaryDirectory(prefix="troupe-takeover-bench-") as tmp:
        run_dir = os.path.join(tmp, "run")
        start = time.monotonic()
        proc = subprocess.Popen([troupe, "run", "--run-dir", run_dir] + args, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            output, _ = proc.communicate()
            code = None
        kill_leftovers(run_dir)
        wall = time.monotonic() - start
        path = os.path.join(run_dir, "events.jsonl")
        events = read_events(path) if os.path.exists(path) else []
        if code != 0 and os.path.isdir(run_dir):
            # A failed run's directory (events, etcd.log) is kept for a look afterwards.
            kept = tempfile.mkdtemp(prefix="troupe-takeover-bench-failed-")
            shutil.move(run_dir, kept)
            with open(os.path.join(kept, "output.txt"), "w") as f:
                f.write(output)
            output += f"\n(run directory and output kept in {kept})"
        return code, events, output, wall


def kill_leftovers(run_dir):
    """SIGKILLs any process still running whose command line names `run_dir` (the job's etcd, a
    worker or coordinator in a session of its own), by pid."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        if run_dir in cmdline and int(pid) != os.getpid():
            try:
                os.kill(int(pid), 9)
            except OSError:
                pass


def committed_in_order(events, steps):
    """None when every step 1..steps was committed, in order, a step coming twice only right
    after a takeover with the same loss; else what is wrong."""
    seen, last, takeover = {}, 0, False
    for e in events:
        if e.get("event") == "leader":
            takeover = True
        if e.get("event") != "step":
            continue
        step, loss = e["step"], e["loss"]
        if step in seen:
            if not (takeover and step == last):
                return f"step {step} committed again without a takeover just before"
            if seen[step] != loss:
                return f"step {step} committed with two losses, {seen[step]} and {loss}"
        elif step != last + 1:
            return f"step {step} committed after step {last}"
        seen[step], last, takeover = loss, step, False
    if sorted(seen) != list(range(1, steps + 1)):
        return f"committed steps {sorted(seen)[:3]}..{sorted(seen)[-3:]} ({len(seen)} of {steps})"
    return None


def workers_kept(events):
    """None when each member kept one pid and none was lost; else what changed."""
    pids = {}
    for e in of(events, "rank_joined"):
        pids.setdefault(e["member"], set()).add(e["pid"])
    moved = {m: sorted(p) for m, p in pids.items() if len(p) > 1}
    if moved:
        return f"members with new processes: {moved}"
    if of(events, "rank_lost"):
        return f"{len(of(events, 'rank_lost'))} rank_lost events"
    if not pids:
        return "no rank_joined events"
    return None


def takeover(a, extra):
    job = HA + SMALL + ["--world", str(a.world), "--steps", str(a.steps), "--checkpoint-every", "5",
                        "--fault", f"kill:coordinator:step={a.kill_step}"] + extra
    print(f"takeover, world {a.world}: troupe run {' '.join(job)}", flush=True)
    gaps, leads, ok = [], [], 0
    for trial in range(1, a.trials + 1):
        code, events, output, wall = run(a.troupe, job, a.timeout)
        problems = []
        faults = [e for e in of(events, "fault") if e.get("target") == "coordinator"]
        gap = lead = None
        if len(faults) != 1:
            problems.append(f"{len(faults)} coordinator fault events")
        else:
            at = events.index(faults[0])
            after = next((e for e in events[at:] if e.get("event") == "step"), None)
            leader = next((e for e in events[at:] if e.get("event") == "leader"), None)
            if after is None:
                problems.append("nothing committed after the kill")
            else:
                gap = (after["unix_ms"] - faults[0]["unix_ms"]) / 1000
            if leader is not None:
                lead = (leader["unix_ms"] - faults[0]["unix_ms"]) / 1000
        steps_bad = committed_in_order(events, a.steps)
        workers_bad = workers_kept(events)
        done = of(events, "job_done")
        tail = (wall - (done[0]["unix_ms"] - of(events, "job_start")[0]["unix_ms"]) / 1000
                if done and of(events, "job_start") else None)
        line = (f"trial {trial}: exit {code}, kill -> first commit "
                f"{'-' if gap is None else f'{gap * 1e3:.0f} ms'} (less the {SILENT_S * 1e3:.0f} ms silence: "
                f"{'-' if gap is None else f'{(gap - SILENT_S) * 1e3:.0f} ms'}), kill -> new leader "
                f"{'-' if lead is None else f'{lead * 1e3:.0f} ms'}, all steps {'yes' if not steps_bad else 'NO'}, "
                f"same workers {'yes' if not workers_bad else 'NO'}, wall {wall:.1f} s"
                + (f" ({tail:.1f} s of it after job_done)" if tail is not None else ""))
        print(line, flush=True)
        for p in problems + [steps_bad, workers_bad]:
            if p:
                print(f"  trial {trial}: {p}", flush=True)
        if code != 0 or problems or steps_bad or workers_bad:
            print("  output tail:\n    " + "\n    ".join(output.strip().splitlines()[-15:]), flush=True)
        if code == 0 and gap is not None:
            gaps.append(gap)
            if lead is not None:
                leads.append(lead)
            if not steps_bad and not workers_bad and not problems:
                ok += 1
    print(f"world {a.world}: {ok} of {a.trials} trials exited 0 with every step committed and the same workers",
          flush=True)
    if gaps:
        summary(f"world {a.world}: kill -> first commit", [g * 1e3 for g in gaps], "ms", 0)
        summary(f"world {a.world}: kill -> first commit, less the {SILENT_S * 1e3:.0f} ms the dying leader "
                f"is silent before its SIGKILL", [(g - SILENT_S) * 1e3 for g in gaps], "ms", 0)
    if leads:
        summary(f"world {a.world}: kill -> the standby's leader event", [v * 1e3 for v in leads], "ms", 0)


def overhead(a, extra):
    base = ["--steps", str(a.overhead_steps), "--no-progress", "--metrics-port", "0"] + extra
    configs = {"plain": [], "etcd": ["--etcd", "local"], "ha": HA}
    medians = {name: [] for name in configs}
    for r in range(1, a.runs + 1):
        for name, opts in configs.items():
            code, events, output, wall = run(a.troupe, base + opts, a.timeout)
            steps = [e["step_s"] for e in of(events, "step") if e["step"] > a.skip]
            if code != 0 or not steps:
                print(f"run {r} {name}: exit {code}, {len(steps)} steps; output tail:\n    "
                      + "\n    ".join(output.strip().splitlines()[-15:]), flush=True)
                continue
            medians[name].append(statistics.median(steps))
            print(f"run {r} {name}: median step {medians[name][-1] * 1e3:.2f} ms over steps {a.skip + 1}.."
                  f"{a.overhead_steps}, wall {wall:.1f} s", flush=True)
    print(f"troupe run {' '.join(base)} [--etcd local | --coordinators 2 --etcd local]", flush=True)
    for name, values in medians.items():
        if values:
            summary(f"{name}: median step", [v * 1e3 for v in values], "ms", 2)
    plain = statistics.median(medians["plain"]) if medians["plain"] else None
    for name in ("etcd", "ha"):
        if plain and medians[name]:
            m = statistics.median(medians[name])
            # Per-run ratios too: run r's config against run r's plain (taken side by side).
            pairs = [v / p for v, p in zip(medians[name], medians["plain"])]
            print(f"{name} / plain: {m / plain:.4f} ({(m / plain - 1) * 100:+.2f} %; median of per-run ratios "
                  f"{statistics.median(pairs):.4f}, range {min(pairs):.4f}..{max(pairs):.4f})", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--troupe", default=os.path.join(os.path.dirname(__file__), "..", "build", "cli", "troupe"))
    ap.add_argument("--only", choices=["takeover", "overhead"])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--kill-step", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per run")
    ap.add_argument("--runs", type=int, default=5, help="overhead: runs of each configuration")
    ap.add_argument("--overhead-steps", type=int, default=400)
    ap.add_argument("--skip", type=int, default=5, help="overhead: steps left out at the start")
    a, extra = ap.parse_known_args()
    extra = [x for x in extra if x != "--"]
    if not os.access("/usr/bin/etcd", os.X_OK):
        sys.exit("takeover_bench: needs /usr/bin/etcd (apt-get install etcd-server)")
    if a.only in (None, "takeover"):
        takeover(a, extra)
    if a.only in (None, "overhead"):
        overhead(a, extra)


if __name__ == "__main__":
    main()
