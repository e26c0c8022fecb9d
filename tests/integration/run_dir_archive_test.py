"""A fresh run in a directory that holds checkpoints moves the old run aside (README "What a run
leaves behind"): the old run is found whole under RUN_DIR.prev-<seconds> (its events byte for
byte, its committed checkpoint verifying), the new run's directory holds only the new job, and
the console names where the old run went. Runs archived within the same second (jobs of a
step or two) each get a name of their own. `--resume` instead continues in place."""

import os
import re
import subprocess
import tempfile
import time

from harness import SMALL_MODEL, TROUPE, fail, main, read_events, run_to_end

ARGS = SMALL_MODEL + ["--checkpoint-every", "2", "--metrics-port", "0"]


def latest(run_dir):
    with open(os.path.join(run_dir, "checkpoints", "LATEST")) as f:
        return f.read().strip()


def run(run_dir, extra, name):
    code, events, out = run_to_end(ARGS + extra, timeout=120, run_dir=run_dir)
    if code != 0:
        fail(f"{name} exited {code}:\n{out}")
    return events, out


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-archive-") as tmp:
        run_dir = os.path.join(tmp, "run")
        run(run_dir, ["--steps", "4"], "the first run")
        with open(os.path.join(run_dir, "events.jsonl"), "rb") as f:
            old_events = f.read()
        old_latest = latest(run_dir)

        before = int(time.time())
        events, out = run(run_dir, ["--steps", "2"], "a fresh run in the same directory")
        after = int(time.time())
        moved = [n for n in os.listdir(tmp) if n.startswith("run.prev-")]
        if len(moved) != 1 or not re.fullmatch(r"run\.prev-\d+", moved[0]):
            fail(f"expected the old run under one run.prev-<seconds>, found {sorted(os.listdir(tmp))}")
        archived = os.path.join(tmp, moved[0])
        if not before <= int(moved[0].rsplit("-", 1)[1]) <= after:
            fail(f"{moved[0]}: the suffix is not the time of the move ({before}..{after})")
        if f"moved it to {archived}" not in out:
            fail(f"the console does not say where the old run went:\n{out}")
        with open(os.path.join(archived, "events.jsonl"), "rb") as f:
            if f.read() != old_events:
                fail("the old run's events.jsonl was not moved unchanged")
        if latest(archived) != old_latest:
            fail(f"the old run's LATEST changed: {latest(archived)} against {old_latest}")
        verify = subprocess.run([TROUPE, "ckpt", "verify", archived], capture_output=True,
                                text=True, timeout=120)
        if verify.returncode != 0:
            fail(f"the old run's checkpoints do not verify:\n{verify.stdout}{verify.stderr}")
        starts = [e for e in read_events(run_dir) if e.get("event") == "job_start"]
        if len(starts) != 1 or max(e["step"] for e in events if e.get("event") == "step") != 2:
            fail(f"the new run's directory mixes runs: {len(starts)} job_start events")
        print(f"the old run (LATEST {old_latest}) moved whole to {moved[0]}; the new one alone "
              f"in run/ (LATEST {latest(run_dir)})")

        # Earlier archives that hold this second's name and the next 19 stay as they are; the
        # run in run/ is moved under the next free name.
        with open(os.path.join(run_dir, "events.jsonl"), "rb") as f:
            second_events = f.read()
        first = max(int(time.time()), int(moved[0].rsplit("-", 1)[1]) + 1)
        taken = [f"run.prev-{t}" for t in range(first, first + 20)]
        for name in taken:
            os.makedirs(os.path.join(tmp, name))
            with open(os.path.join(tmp, name, "marker"), "w") as f:
                f.write(name)
        run(run_dir, ["--steps", "2"], "a fresh run whose second's archive name is taken")
        new = [n for n in os.listdir(tmp) if n.startswith("run.prev-") and n not in moved + taken]
        if new != [f"run.prev-{first + 20}"]:
            fail(f"expected the run moved to run.prev-{first + 20}, the first free name after "
                 f"{taken[0]}..{taken[-1]}; found {sorted(os.listdir(tmp))}")
        with open(os.path.join(tmp, new[0], "events.jsonl"), "rb") as f:
            if f.read() != second_events:
                fail(f"{new[0]} does not hold the run that was in run/")
        for name in taken:
            if sorted(os.listdir(os.path.join(tmp, name))) != ["marker"]:
                fail(f"{name}, an earlier archive, was changed: {os.listdir(os.path.join(tmp, name))}")
        moved += taken + new
        print(f"with {taken[0]}..{taken[-1]} taken, the run moved to {new[0]}")

        # --resume continues in place: nothing is moved.
        run(run_dir, ["--steps", "4", "--resume"], "--resume")
        if sorted(n for n in os.listdir(tmp) if n.startswith("run.prev-")) != sorted(moved):
            fail(f"--resume moved the run: {sorted(os.listdir(tmp))}")
        print("--resume continued in place")


if __name__ == "__main__":
    main(test)
