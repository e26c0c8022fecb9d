"""Crash consistency: kill -9 a rank or the coordinator at a random moment while checkpoints
are being written (every 2 steps, so a kill usually lands inside a save or its commit), over
20 trials. Afterwards every checkpoint the run directory reports as committed must verify
(`troupe ckpt verify`: every chunk against its hash) and the newest must load
(checkpoint_diff reads it whole): no torn checkpoint is ever reported as committed."""

import os
import random
import signal
import subprocess
import time

from harness import TROUPE, Job, fail, main, read_events, tempfile, wait_until

ARGS = ["--world", "2", "--steps", "400", "--checkpoint-every", "2", "--keep-last", "3", "--eval-every", "0",
        "--layers", "4", "--d-model", "128", "--heads", "4", "--no-progress", "--metrics-port", "0"]
TRIALS = 20


def committed(run_dir):
    root = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(root):
        return []
    return sorted(d for d in os.listdir(root)
                  if d.startswith("step-") and os.path.exists(os.path.join(root, d, "manifest.json")))


def test():
    rng = random.Random(int(os.environ.get("TROUPE_CRASH_SEED", "20261203")))
    diff_tool = os.environ.get("CHECKPOINT_DIFF", "")
    verified = 0
    with tempfile.TemporaryDirectory(prefix="troupe-crash-") as tmp:
        for trial in range(TRIALS):
            run_dir = os.path.join(tmp, f"trial{trial}")
            target = rng.choice(["coordinator", "rank"])
            env = os.environ.copy()
            # Widen the coordinator's window between "every share durable" and LATEST.
            env["TROUPE_CHAOS_COMMIT_PAUSE_MS"] = "20"
            with Job(ARGS, run_dir=run_dir, env=env) as job:
                # Wait for the first committed checkpoint, then kill at a random moment after it.
                wait_until(lambda: committed(run_dir), 60, "a first checkpoint")
                time.sleep(rng.uniform(0.0, 0.6))
                events = read_events(run_dir)
                if target == "coordinator":
                    victim = job.proc.pid
                else:
                    ranks = [e["pid"] for e in events if e.get("event") == "rank_joined"]
                    victim = rng.choice(ranks)
                os.kill(victim, signal.SIGKILL)
                time.sleep(0.05)
                job.kill_all()
                job.assert_no_process_left()
            steps = committed(run_dir)
            code = subprocess.run([TROUPE, "ckpt", "verify", run_dir], capture_output=True, text=True)
            if code.returncode != 0:
                fail(f"trial {trial} ({target} killed): committed {steps} do not verify:\n"
                     f"{code.stdout}{code.stderr}")
            # A kill between the first manifest and LATEST commits nothing: what it leaves is
            # that one complete manifest (verified above), never more.
            first_cut_short = not os.path.exists(os.path.join(run_dir, "checkpoints", "LATEST"))
            if first_cut_short and len(steps) != 1:
                fail(f"trial {trial}: no LATEST beside manifests {steps}")
            if diff_tool and not first_cut_short:
                loaded = subprocess.run([diff_tool, run_dir, run_dir], capture_output=True, text=True)
                if loaded.returncode != 0:
                    fail(f"trial {trial}: the newest checkpoint does not load: {loaded.stderr}")
            verified += 1
            print(f"trial {trial}: killed the {target}; {len(steps)} committed checkpoints "
                  f"(newest {steps[-1] if steps else 'none'}) verify" +
                  (" (the first commit was cut short before LATEST)" if first_cut_short else ""))
    if verified != TRIALS:
        fail(f"only {verified} of {TRIALS} trials verified")


if __name__ == "__main__":
    main(test)
