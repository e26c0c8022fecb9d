#!/usr/bin/env python3
"""Issue 39, test (c): a node of a Python job cut off across network namespaces, and the job
finishes exactly. Two nodes of two ranks each, every one a network namespace
(chaos/netns/cluster.py), whose workers are the example GPT (examples/python/gpt.py, torch.nn)
under `troupe agent ... -- /usr/bin/python3 gpt.py`; node n2's link goes down right after step
CUT_AFTER. The coordinator declares n2's ranks lost at the heartbeat timeout and the job goes
on, and finishes, on n1's two Python workers: it exits 0 and commits every step 1..STEPS once.
The cut-off side ends itself: every process of n2 (its agent and Python workers) is gone
within 2 x the heartbeat timeout of the cut.

Exact: every committed step's loss and the final state_dict (torch.save by rank zero, on n1 at
the end) equal an undisturbed run of the same job on one host (`troupe run --world 4 --nodes 2
-- gpt.py`) within 1e-5 relative: a redone step has the same global batch and its
micro-batches' weights, so only the order of the float32 sum moves.

Needs root, namespaces and /usr/bin/python3 with torch; Skipped (exit 77) otherwise."""

import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from harness import TROUPE, Job, fail, main, pid_alive  # noqa: E402
from torch_state import have_torch, max_relative, state_of  # noqa: E402
from netns_jobs import (TroupeJob, logs_of, netns, of, pids_in, wait_for_step,  # noqa: E402
                        wait_gone, wait_job)

ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
PYTHON = "/usr/bin/python3"  # Debian's torch is for this interpreter
GPT = os.path.join(ROOT, "examples", "python", "gpt.py")
BUILD_PYTHON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(TROUPE or "."))),
                            "python")

STEPS = 40
CUT_AFTER = 12
HEARTBEAT_MS = 2000
# Workers and agents give up on a silent coordinator after this (the default is 5 x the
# heartbeat timeout); 1.5 x keeps the cut-off side gone within the bound below.
COORDINATOR_MS = 3 * HEARTBEAT_MS // 2
BOUND_S = 2 * HEARTBEAT_MS / 1000
TOLERANCE = 1e-5
SHAPE = ["--steps", str(STEPS), "--batch", "16", "--micro-batch", "4"]
# The job's options (troupe's --steps/--batch/--micro-batch/--seed win over the script's; the
# same values are given to both). Python jobs take no checkpoints yet.
JOB = SHAPE + ["--seed", "7", "--world", "4", "--nodes", "2", "--metrics-port", "0",
               "--no-progress", "--eval-every", "0",
               "--heartbeat-timeout-ms", str(HEARTBEAT_MS), "--step-timeout-ms", "30000",
               "--coordinator-timeout-ms", str(COORDINATOR_MS),
               # The cut-off side ends itself: its agent does not stay to rejoin.
               "--rejoin-timeout-ms", "0"]


def script(out):
    return [PYTHON, GPT] + SHAPE + ["--d-model", "32", "--out", out]


def step_losses(events):
    steps = [e["step"] for e in of(events, "step")]
    if sorted(steps) != list(range(1, STEPS + 1)):
        fail(f"steps committed: {sorted(steps)} (each of 1..{STEPS} once expected)")
    return {e["step"]: e["loss"] for e in of(events, "step")}


def across_namespaces(tmp):
    """The job across the cluster, n2 cut after CUT_AFTER: its events and final state."""
    run_dir = os.path.join(tmp, "across")
    out = os.path.join(tmp, "across.pt")
    with netns.Cluster(nodes=2) as c:
        job = TroupeJob(c, TROUPE, run_dir, JOB, agents={"n1": None, "n2": None},
                        program=script(out))
        started = time.monotonic()
        job.start()
        wait_for_step(job, CUT_AFTER, 150, "before the cut")
        cut_side = pids_in(c, "n2")
        members = {e["member"]: e for e in of(job.events(), "rank_joined")}
        if len(cut_side) < 3:
            fail(f"expected n2's agent and two Python workers in its namespace, found pids "
                 f"{cut_side}")
        c.cut("n2")
        cut = time.monotonic()
        committed_at_cut = max(e["step"] for e in of(job.events(), "step"))
        commands = {pid: _cmdline(pid) for pid in cut_side}
        print(f"cut n2 after step {committed_at_cut} ({cut - started:.1f}s into the job); its "
              f"processes: {commands}", flush=True)
        if committed_at_cut >= STEPS:
            fail("the job had finished when the link went down")
        if sum(PYTHON in cmd and GPT in cmd for cmd in commands.values()) < 2:
            fail(f"expected two Python workers (gpt.py) in n2's namespace: {commands}")

        ends, watcher = gone_times(cut_side, cut)
        gone = wait_gone(cut_side, cut, BOUND_S, "n2 after the cut")
        watcher.join()
        print(f"every process of n2 gone {gone:.2f}s after the cut (bound {BOUND_S:.1f}s): "
              + ", ".join(f"{os.path.basename(commands[p].split()[0])} {p} at {t:.2f}s"
                          for p, t in sorted(ends.items(), key=lambda kv: kv[1])), flush=True)
        n2_log = job.log("agent-n2")
        if "lost the coordinator" not in n2_log or "fenced: this node's workers" not in n2_log:
            fail(f"n2's agent does not say it lost the coordinator:\n{n2_log}")
        fenced = [line for line in n2_log.splitlines()
                  if "lost the coordinator" in line and "fenced: this worker" in line]
        if len(fenced) != 2:
            fail(f"expected both Python workers of n2 to say they lost the coordinator and "
                 f"fenced themselves, got {len(fenced)}:\n{n2_log}")
        for line in n2_log.splitlines():
            if "lost the coordinator" in line:
                print(f"n2: {line}", flush=True)

        code = wait_job(job, 150, "after the cut")
        ended = time.monotonic()
        if code != 0:
            fail(f"the job exited {code}:\n{logs_of(job)}")
        deadline = time.monotonic() + 30
        while c.pids_in_namespaces() and time.monotonic() < deadline:
            time.sleep(0.05)
        if c.pids_in_namespaces():
            fail(f"processes left in the namespaces after the job: {c.pids_in_namespaces()}")
        events = job.events()
        print(f"the job ended {ended - cut:.1f}s after the cut ({ended - started:.1f}s in all)",
              flush=True)
        # Across nodes the data plane is gloo's TCP pairs, signed (--data-plane-auth tcp-md5):
        # each Python worker had troupe's bind()/connect() preloaded, or it would say so.
        for who, text in job.logs().items():
            if "cannot be signed" in text:
                fail(f"{who}: a Python worker could not sign its gloo pairs:\n{text[-2000:]}")

    cut_members = {m for m, e in members.items() if e["pid"] in cut_side}
    if len(cut_members) != 2:
        fail(f"expected two members in n2's namespace, found {sorted(cut_members)} of {members}")
    lost = of(events, "rank_lost")
    if {e["member"] for e in lost} != cut_members:
        fail(f"expected n2's members {sorted(cut_members)} lost, got {lost}")
    print(f"lost: {[(e['member'], e.get('cause')) for e in lost]}", flush=True)
    final = of(events, "generation")[-1]
    if final["world"] != 2:
        fail(f"the job should end on n1's 2 ranks, its last generation has world {final['world']}")
    if not os.path.exists(out):
        fail(f"rank zero wrote no state_dict to {out}:\n{logs_of(job)}")
    return step_losses(events), out, final


def undisturbed(tmp):
    """The same job on one host, no namespaces, no fault."""
    out = os.path.join(tmp, "calm.pt")
    with Job(JOB + ["--"] + script(out), run_dir=os.path.join(tmp, "calm")) as job:
        code = job.wait(150)
        if code != 0:
            fail(f"the undisturbed run exited {code}:\n{job.output()[-6000:]}")
        events = job.events()
        job.assert_no_process_left()
    return step_losses(events), out


def test():
    if not have_torch():
        print(f"SKIP: {PYTHON} cannot import torch (apt install python3-torch)", flush=True)
        sys.exit(77)
    if not os.path.isfile(os.path.join(BUILD_PYTHON, "troupe", "__init__.py")):
        fail(f"the troupe module is not built in {BUILD_PYTHON}")
    with tempfile.TemporaryDirectory(prefix="troupe-netns-python-") as tmp:
        got, got_out, final = across_namespaces(tmp)
        calm, calm_out = undisturbed(tmp)
        worst = max(abs(calm[s] - got[s]) / max(abs(calm[s]), abs(got[s])) for s in calm)
        if worst > TOLERANCE:
            bad = [s for s in calm if abs(calm[s] - got[s]) / abs(calm[s]) > TOLERANCE]
            fail(f"a committed step's loss differs from the undisturbed run by {worst:.3g} "
                 f"relative (more than {TOLERANCE:.0e}) at steps {bad[:10]}")
        diff = max_relative(state_of(calm_out), state_of(got_out))
        if diff > TOLERANCE:
            fail(f"the final state_dict differs from the undisturbed run by {diff:.3g} relative")
        print(f"exact: world 4 then 2 from step {final['start_step']}: every loss within "
              f"{worst:.2g} and the final state_dict within {diff:.2g} of the undisturbed run",
              flush=True)


def gone_times(pids, since):
    """Watches `pids` on a thread: ({pid: seconds after `since` it was first seen gone}, the
    thread), filled in as each goes."""
    ends = {}

    def watch():
        left = set(pids)
        while left and time.monotonic() - since < 2 * BOUND_S:
            for p in list(left):
                if not pid_alive(p):
                    ends[p] = time.monotonic() - since
                    left.discard(p)
            time.sleep(0.002)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return ends, thread


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return " ".join(w.decode(errors="replace") for w in f.read().split(b"\0") if w)
    except OSError:
        return "?"


if __name__ == "__main__":
    netns.require_netns()  # exit 77 (Skipped) where namespaces cannot be made
    main(test)
