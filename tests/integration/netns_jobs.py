"""Helpers of the partition tests (issue 25, item 4): a troupe job across the network-namespace
cluster (chaos/netns), which processes run in which node's namespace, waits on their end with a
deadline, and the reference runs on one host that a job across the cluster is compared with.
Not a test itself."""

import os
import sys
import time

from harness import fail, pid_alive, relative_difference, run_ok, step_losses

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "chaos", "netns"))
import cluster as netns  # noqa: E402,F401  (re-exported)
from troupe_job import JobError, TroupeJob  # noqa: E402,F401


def of(events, name):
    return [e for e in events if e.get("event") == name]


def pids_in(cluster, node):
    """The live processes of one namespace of the cluster."""
    target = os.stat(cluster.netns_path(node))
    out = []
    for pid in cluster.pids_in_namespaces():
        try:
            st = os.stat(f"/proc/{pid}/ns/net")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            out.append(pid)
    return out


def wait_gone(pids, since, limit, what):
    """Waits until none of `pids` lives; fails if that takes more than `limit` seconds after
    the monotonic time `since`. Returns how long after `since` the last one went."""
    while any(pid_alive(p) for p in pids):
        if time.monotonic() - since > limit:
            left = [p for p in pids if pid_alive(p)]
            fail(f"{what}: processes {left} still run {time.monotonic() - since:.2f}s after, "
                 f"more than {limit:.1f}s")
        time.sleep(0.005)
    return time.monotonic() - since


def logs_of(job, tail=4000):
    return "\n".join(f"--- {who}\n{text[-tail:]}" for who, text in job.logs().items())


def wait_job(job, timeout, name):
    try:
        return job.wait(timeout)
    except JobError as e:
        fail(f"{name}: {e}\n{logs_of(job)}")


def wait_for_step(job, step, timeout, name):
    """Waits until the job has committed `step`; fails (with the logs) after `timeout`."""
    deadline = time.monotonic() + timeout
    while not any(e.get("event") == "step" and e["step"] >= step for e in job.events()):
        if job.coordinator.poll() is not None:
            fail(f"{name}: the coordinator exited {job.coordinator.returncode} before step "
                 f"{step}:\n{logs_of(job)}")
        if time.monotonic() > deadline:
            fail(f"{name}: no step {step} within {timeout}s:\n{logs_of(job)}")
        time.sleep(0.005)


def compare_losses(name, reference, got, steps, tolerance):
    """Worst relative difference of the loss at `steps` between two {step: loss} maps."""
    missing = [s for s in steps if s not in reference or s not in got]
    if missing:
        fail(f"{name}: steps {missing[:10]} missing (reference has {len(reference)}, run "
             f"{len(got)})")
    worst = max(relative_difference(reference[s], got[s]) for s in steps)
    if worst > tolerance:
        bad = [s for s in steps if relative_difference(reference[s], got[s]) > tolerance]
        fail(f"{name}: the loss differs from the reference by {worst:.2e} relative (more than "
             f"{tolerance:.0e}) at steps {bad[:10]}")
    return worst


def run_schedule(name, args, schedule, run_dir):
    """Runs on one host the schedule of worlds a job went through: `schedule` is a list of
    (world, nodes, last step); each segment but the last stops after its last step with a
    checkpoint (--exit-after-step) and the next resumes from it with its own world. Returns
    {step: loss} over all segments."""
    losses = {}
    for i, (world, nodes, last) in enumerate(schedule):
        seg = args + ["--world", str(world), "--nodes", str(nodes)]
        if i > 0:
            seg += ["--resume"]
        if i + 1 < len(schedule):
            seg += ["--exit-after-step", str(last)]
        events = run_ok(f"{name} (world {world} to step {last})", seg, run_dir, timeout=300)
        starts = [k for k, e in enumerate(events) if e.get("event") == "job_start"]
        losses.update(step_losses(events[starts[-1]:] if starts else events))
    return losses


def batch_of(args, batch):
    """`args` with --batch set to `batch`: 24 sequences of micro-batches of 2 are 12
    micro-batches, which worlds of 2, 3 and 4 all divide, so one host can start any world a
    job passes through (a job that regrows one member at a time passes through 3)."""
    out = list(args)
    out[out.index("--batch") + 1] = str(batch)
    return out


def worlds_of(events, steps):
    """The schedule of worlds a job of two nodes of two ranks trained through, for
    run_schedule: (world, nodes, last step) per stretch of generations of one world that
    committed steps. Members that return after a cut may join one at a time (4, 2, 3, 4); a
    node keeps two ranks, so a world of 3 spans both nodes, as on one host with --nodes 2."""
    starts = [(g["world"], g["start_step"]) for g in of(events, "generation")]
    schedule = []
    for i, (world, start) in enumerate(starts):
        end = starts[i + 1][1] if i + 1 < len(starts) else steps
        if end == start:
            continue  # formed and replaced before it committed a step
        if schedule and schedule[-1][0] == world:
            schedule[-1] = (world, schedule[-1][1], end)
        else:
            schedule.append((world, 1 if world <= 2 else 2, end))
    return schedule
