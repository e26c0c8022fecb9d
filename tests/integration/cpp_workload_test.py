#!/usr/bin/env python3
"""A C++ workload of a user's own, built the way a user builds it (issue 39): `cmake --install`
puts troupe's package under a prefix; examples/cpp_workload configures against that prefix
alone (find_package(troupe), nothing from the source tree), builds with warnings as errors,
and trains its linear regression at world 1, driven as the runtime drives a workload; then
the same workload as the workers of a job (troupe::program, `troupe run -- linear_train`) at
world 2, and through a kill -9 of a worker, every committed loss unchanged.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

from harness import TROUPE, fail

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def run(args, timeout=300, cwd=None):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if p.returncode != 0:
        fail(f"{' '.join(args)} exited {p.returncode}:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return p.stdout


def test():
    build = os.path.dirname(os.path.dirname(TROUPE))  # TROUPE is BUILD/cli/troupe
    with tempfile.TemporaryDirectory(prefix="troupe-cpp-workload-") as tmp:
        prefix = os.path.join(tmp, "prefix")
        run(["cmake", "--install", build, "--prefix", prefix])
        config = os.path.join(prefix, "lib", "cmake", "troupe", "troupe-config.cmake")
        header = os.path.join(prefix, "include", "troupe", "runtime", "workload", "workload.hpp")
        for path in (config, header):
            if not os.path.isfile(path):
                fail(f"cmake --install left no {path}")
        # A copy of the example outside the source tree: its includes can only come from the
        # installed package.
        example = os.path.join(tmp, "example")
        run(["cp", "-r", os.path.join(ROOT, "examples", "cpp_workload"), example])
        out = os.path.join(tmp, "build")
        run(["cmake", "-S", example, "-B", out, f"-DCMAKE_PREFIX_PATH={prefix}"])
        cache = open(os.path.join(out, "CMakeCache.txt")).read()
        found = re.search(r"^troupe_DIR:PATH=(.*)$", cache, re.M)
        if not found or os.path.realpath(found.group(1)) != os.path.realpath(os.path.dirname(config)):
            fail(f"the example found troupe at {found.group(1) if found else 'nowhere'}, not in "
                 f"{prefix}")
        run(["cmake", "--build", out])
        text = run([os.path.join(out, "linear_workload")], timeout=120)
        if "trained linear regression: 4 tensors" not in text:
            fail(f"the example did not train:\n{text}")
        print(f"ok: the example workload built against {prefix} and trained: "
              f"{text.strip().splitlines()[-1]}")
        as_job(os.path.join(prefix, "bin", "troupe"), os.path.join(out, "linear_train"), tmp)


JOB = ["--steps", "60", "--batch", "64", "--micro-batch", "16", "--eval-every", "0",
       "--no-progress", "--metrics-port", "0"]


def job_losses(troupe, program, run_dir, extra):
    """`troupe run --world 2 [extra] -- program`: its committed steps' losses and events."""
    p = subprocess.run([troupe, "run", "--run-dir", run_dir, "--world", "2"] + JOB + extra +
                       ["--", program], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        fail(f"troupe run {' '.join(extra)} -- linear_train exited {p.returncode}:\n"
             f"{p.stdout[-3000:]}{p.stderr[-3000:]}")
    with open(os.path.join(run_dir, "events.jsonl")) as f:
        events = [json.loads(line) for line in f if line.strip()]
    losses = {e["step"]: e["loss"] for e in events if e.get("event") == "step"}
    if sorted(losses) != list(range(1, 61)):
        fail(f"committed steps {sorted(losses)}, not 1..60")
    return losses, events


def as_job(troupe, program, tmp):
    """The C++ program as a job's workers (troupe::run_as_worker), under the installed troupe:
    it trains at world 2, and a
    kill -9 of a worker at step 20 (restarted, state from its peer) changes no committed loss."""
    alone = subprocess.run([program], capture_output=True, text=True, timeout=60)
    if alone.returncode != 2 or "troupe run" not in alone.stderr:
        fail(f"linear_train alone should say how to run it (exit 2): {alone.returncode} "
             f"{alone.stderr}")
    calm, _ = job_losses(troupe, program, os.path.join(tmp, "calm"), [])
    if not calm[60] < calm[1] / 20:
        fail(f"the job did not train: loss {calm[1]} at step 1, {calm[60]} at step 60")
    killed, events = job_losses(troupe, program, os.path.join(tmp, "killed"),
                                ["--fault", "kill:rank=1:step=20", "--max-restarts", "1"])
    if not [e for e in events if e.get("event") == "rank_lost"]:
        fail("the kill was not seen as a lost rank")
    if not [e for e in events if e.get("event") == "restored" and e.get("from") == "peer"]:
        fail("the restarted worker was not restored from its peer")
    worst = max(abs(calm[s] - killed[s]) / abs(calm[s]) for s in calm)
    if worst > 1e-6:
        fail(f"a kill -9 changed a committed loss by {worst:.3g} relative")
    print(f"ok: linear_train as a job's workers: loss {calm[1]:.4f} -> {calm[60]:.6f} at world "
          f"2; through a kill -9 at step 20 every committed loss within {worst:.2g}")
    # The hand-driven example never joins: the job says what a program must call.
    alone_bin = os.path.join(os.path.dirname(program), "linear_workload")
    p = subprocess.run([troupe, "run", "--run-dir", os.path.join(tmp, "never"), "--world", "1"] +
                       JOB + ["--", alone_bin], capture_output=True, text=True, timeout=120)
    if p.returncode != 1 or "troupe::run_as_worker" not in p.stdout + p.stderr:
        fail(f"a program that never joins: exit {p.returncode}, expected 1 naming "
             f"troupe::run_as_worker:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    print("ok: a program that never calls troupe::run_as_worker ends the job with exit 1, "
          "saying so")


if __name__ == "__main__":
    test()
    print("1 passed")
    sys.exit(0)
