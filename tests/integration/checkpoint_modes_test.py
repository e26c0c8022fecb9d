"""The two ways a checkpoint may cost training less or more (README "Checkpoints"), end to end:

- `--set checkpoint_async=false` writes inside the step: every chunk file of the checkpoint
  of step N is on disk before step N+1 commits (its mtime is earlier than the step's event),
  which the default background write does not wait for;
- `--checkpoint-overlap skip`: a checkpoint due while the previous one is still being committed
  (the commit held 400 ms by TROUPE_CHAOS_COMMIT_PAUSE_MS) is skipped with a
  `checkpoint_skipped` event instead of holding the steps; the ones that commit verify, and
  the job's last checkpoint is never skipped: its last step, or the step a SIGTERM stops it
  at (exit 75), is committed with one."""

import json
import os
import signal
import tempfile

from harness import SMALL_MODEL, Job, fail, main, wait_until

WORLD_ARGS = ["--world", "2", "--metrics-port", "0", "--keep-last", "0"]
BIG = ["--d-model", "256", "--heads", "4", "--layers", "4"]


def of(events, name):
    return [e for e in events if e.get("event") == name]


def chunk_files(run_dir, step):
    """The chunk files the manifest of `step` names."""
    with open(os.path.join(run_dir, "checkpoints", f"step-{step:08d}", "manifest.json")) as f:
        manifest = json.load(f)
    keys = set()

    def collect(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "chunks" and isinstance(v, list):
                    keys.update(x for x in v if isinstance(x, str))
                else:
                    collect(v)
        elif isinstance(node, list):
            for v in node:
                collect(v)
    collect(manifest)
    return [os.path.join(run_dir, "checkpoints", "chunks", k[:2], k) for k in sorted(keys)]


def written_late(run_dir, events):
    """{step N: chunk files of N's checkpoint written after step N+1 committed}."""
    committed_ms = {e["step"]: e["unix_ms"] for e in of(events, "step")}
    late = {}
    for c in of(events, "checkpoint"):
        n = c["step"]
        if n + 1 not in committed_ms:
            continue
        files = chunk_files(run_dir, n)
        if not files:
            fail(f"the manifest of step {n} names no chunk")
        after = [p for p in files if os.stat(p).st_mtime_ns // 1_000_000 > committed_ms[n + 1]]
        if after:
            late[n] = after
    return late


def synchronous(tmp):
    run_dir = os.path.join(tmp, "sync")
    args = SMALL_MODEL + BIG + WORLD_ARGS + ["--steps", "20", "--checkpoint-every", "4",
                                             "--set", "checkpoint_async=false"]
    with Job(args, run_dir=run_dir) as job:
        code = job.wait(180)
        if code != 0:
            fail(f"checkpoint_async=false: exited {code}:\n{job.output()}")
        events = job.events()
        checkpoints = [c["step"] for c in of(events, "checkpoint")]
        if checkpoints != [4, 8, 12, 16, 20]:
            fail(f"checkpoint_async=false: checkpoints at {checkpoints}")
        late = written_late(run_dir, events)
        if late:
            fail(f"checkpoint_async=false: chunks written after the next step committed: {late}")
    print(f"checkpoint_async=false: every chunk of checkpoints {checkpoints[:-1]} was on disk "
          f"before the next step committed")


def overlap_skip(tmp):
    env = dict(os.environ, TROUPE_CHAOS_COMMIT_PAUSE_MS="400")
    args = SMALL_MODEL + WORLD_ARGS + ["--steps", "30", "--checkpoint-every", "2",
                                       "--checkpoint-overlap", "skip"]
    with Job(args, run_dir=os.path.join(tmp, "skip"), env=env) as job:
        code = job.wait(180)
        if code != 0:
            fail(f"--checkpoint-overlap skip: exited {code}:\n{job.output()}")
        events = job.events()
    skipped = [e["step"] for e in of(events, "checkpoint_skipped")]
    committed = [e["step"] for e in of(events, "checkpoint")]
    if not skipped:
        fail(f"--checkpoint-overlap skip: no checkpoint_skipped although every commit takes "
             f"400 ms; committed {committed}")
    if set(skipped) & set(committed) or any(s % 2 for s in skipped + committed[:-1]):
        fail(f"skipped {skipped} and committed {committed} should be distinct checkpoint steps")
    if not committed or committed[-1] != 30:
        fail(f"the job's last step should be committed with a checkpoint: {committed}")
    # The steps went on while a commit was held: some step after a checkpoint's step committed
    # before that checkpoint did.
    order = [(e["event"], e["step"]) for e in events if e.get("event") in ("step", "checkpoint")]
    overtaken = [s for s in committed if ("step", s + 2) in order
                 and order.index(("checkpoint", s)) > order.index(("step", s + 2))]
    if not overtaken:
        fail(f"no step committed while a checkpoint was held: {order}")
    print(f"--checkpoint-overlap skip: checkpoints {committed} committed, {skipped} skipped; "
          f"steps ran past checkpoints {overtaken} while they committed")

    # Preempted while a commit is held: the step it stops at still gets its checkpoint.
    args = args[:args.index("--steps")] + ["--steps", "100000"] + args[args.index("--steps") + 2:]
    with Job(args, run_dir=os.path.join(tmp, "preempted"), env=env) as job:
        wait_until(lambda: any(e.get("event") == "checkpoint_skipped" for e in job.events())
                   or job.proc.poll() is not None, 60, "a checkpoint skipped")
        job.proc.send_signal(signal.SIGTERM)
        code = job.wait(60)
        events = job.events()
    last = max(e["step"] for e in of(events, "step"))
    committed = [e["step"] for e in of(events, "checkpoint")]
    if code != 75 or not committed or committed[-1] != last:
        fail(f"--checkpoint-overlap skip, SIGTERM: expected exit 75 with a checkpoint of the last "
             f"step {last}, got {code} and checkpoints {committed}")
    print(f"--checkpoint-overlap skip, SIGTERM: exit 75, step {last} checkpointed")


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-ckpt-modes-") as tmp:
        synchronous(tmp)
        overlap_skip(tmp)


if __name__ == "__main__":
    main(test)
