#!/usr/bin/env python3
"""The PyTorch frontend end to end (issue 39), with real torch and real processes: the example
scripts (examples/python: an MLP and a small GPT written with torch.nn, models troupe did not
write) trained plainly and under `troupe run -- /usr/bin/python3 SCRIPT`.

- world 1 under troupe equals the plain script bit for bit (same sampler, seeds and weights);
- world 2 equals the plain script within float32 noise (only the order of the sum differs);
- world 4 with a rank killed (kill -9) at step 10, with a rank stopped (SIGSTOP) past the
  heartbeat timeout, and with its coordinator killed and a standby taking over, each equals the
  undisturbed world-4 run: every committed step's loss and the final state_dict within 1e-5
  relative, no committed step lost; the killed member's replacement is restored from a peer's
  memory, not from disk;
- `--exit-after-step 12` then `--resume` continues bit for bit (the program's state through
  troupe's checkpoint store: a format 3 manifest, verified chunks); SIGTERM at the launcher
  takes a checkpoint and exits 75;
- a script that raises in step 7 ends the job with exit 1 and its traceback in the error;
- a model troupe cannot train (a float64 parameter) and a misused API are refused by name;
  a script that never calls the API, or never makes its Trainer, ends the job by a deadline.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import TROUPE, Job, fail, main, pid_alive, wait_until  # noqa: E402
from torch_state import PYTHON, have_torch, max_relative, state_of  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MLP = os.path.join(ROOT, "examples", "python", "mlp.py")
GPT = os.path.join(ROOT, "examples", "python", "gpt.py")
BUILD_PYTHON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(TROUPE))), "python")
JOB = ["--no-progress", "--eval-every", "0", "--metrics-port", "0", "--seed", "7"]


def plain(script, args, tmp, timeout=300):
    env = dict(os.environ, PYTHONPATH=BUILD_PYTHON)
    for k in [k for k in env if k.startswith("TROUPE_")]:
        del env[k]
    p = subprocess.run([PYTHON, script] + args, capture_output=True, text=True, timeout=timeout,
                       env=env, cwd=tmp)
    if p.returncode != 0:
        fail(f"{os.path.basename(script)} alone exited {p.returncode}:\n{p.stdout}{p.stderr}")
    return p.stdout


def under_troupe(script, args, job_args, timeout=300, expect=0):
    with Job(JOB + job_args + ["--", PYTHON, script] + args) as job:
        code = job.wait(timeout)
        out = job.output()
        events = job.events()
        if code != expect:
            fail(f"troupe run -- {os.path.basename(script)} {' '.join(job_args)} exited {code}, "
                 f"expected {expect}:\n{out[-6000:]}")
        job.assert_no_process_left()
        return out, events


def losses(path):
    with open(path) as f:
        return {r["step"]: r for r in map(json.loads, f)}


def test_world1_and_world2(tmp):
    args = ["--steps", "30", "--batch", "32", "--micro-batch", "8"]
    alone = os.path.join(tmp, "alone.pt")
    plain(MLP, args + ["--out", alone], tmp)
    one = os.path.join(tmp, "one.pt")
    under_troupe(MLP, args + ["--out", one],
                 ["--world", "1", "--steps", "30", "--batch", "32", "--micro-batch", "8"])
    a, b = state_of(alone), state_of(one)
    if a != b:
        fail(f"world 1 under troupe differs from the plain script: {max_relative(a, b):.3g}")
    print("ok: world 1 under troupe equals the plain script bit for bit")
    two = os.path.join(tmp, "two.pt")
    under_troupe(MLP, args + ["--out", two],
                 ["--world", "2", "--steps", "30", "--batch", "32", "--micro-batch", "8"])
    diff = max_relative(a, state_of(two))
    if diff > 1e-4:
        fail(f"world 2 differs from the plain script by {diff:.3g} (more than float32 noise)")
    print(f"ok: world 2 equals the plain script within {diff:.2g}")


GPT_ARGS = ["--steps", "24", "--batch", "16", "--micro-batch", "4", "--d-model", "32"]
GPT_JOB = ["--steps", "24", "--batch", "16", "--micro-batch", "4"]


def gpt_run(tmp, name, job):
    out, log = os.path.join(tmp, f"{name}.pt"), os.path.join(tmp, f"{name}.jsonl")
    _, events = under_troupe(GPT, GPT_ARGS + ["--out", out, "--log-losses", log], GPT_JOB + job)
    steps = {e["step"]: e["loss"] for e in events if e.get("event") == "step"}
    if sorted(steps) != list(range(1, 25)):
        fail(f"{name}: committed steps {sorted(steps)}, not 1..24")
    return steps, state_of(out), events


def same_as(name, calm, run):
    (calm_steps, calm_state, _), (steps, state, _) = calm, run
    worst = max(abs(calm_steps[s] - steps[s]) / abs(calm_steps[s]) for s in calm_steps)
    if worst > 1e-5:
        fail(f"{name}: a committed step's loss differs by {worst:.3g} relative")
    diff = max_relative(calm_state, state)
    if diff > 1e-5:
        fail(f"{name}: the final state_dict differs by {diff:.3g} relative")
    return worst, diff


def test_faults(tmp):
    """(a), (c), (e): faults of a world-4 job; each run equals the undisturbed one."""
    calm = gpt_run(tmp, "calm", ["--world", "4"])
    killed = gpt_run(tmp, "killed", ["--world", "4", "--fault", "kill:rank=1:step=10",
                                     "--max-restarts", "1"])
    worst, diff = same_as("kill -9 of rank 1 at step 10", calm, killed)
    events = killed[2]
    if not [e for e in events if e.get("event") == "rank_lost"]:
        fail("the kill was not seen as a lost rank")
    peer = [e for e in events if e.get("event") == "restored" and e.get("from") == "peer"]
    if not peer or not all(e.get("bytes", 0) > 0 for e in peer):
        fail(f"the restarted member was not restored from a peer's memory: {peer}")
    print(f"ok: kill -9 at step 10: losses within {worst:.2g}, state within {diff:.2g}; the "
          f"restarted member got {peer[0]['bytes']} bytes from rank {peer[0].get('peer_rank')}")
    stopped = gpt_run(tmp, "stopped", ["--world", "4", "--fault", "stop:rank=2:step=5",
                                       "--heartbeat-timeout-ms", "2000"])
    worst, diff = same_as("SIGSTOP of rank 2 at step 5", calm, stopped)
    hung = [e for e in stopped[2] if e.get("event") == "rank_lost" and e.get("cause") == "hang"]
    if not hung:
        fail("the stopped rank was not declared hung")
    print(f"ok: SIGSTOP past the heartbeat: declared hung, finished at world 3; losses within "
          f"{worst:.2g}, state within {diff:.2g}")
    if not os.path.exists("/usr/bin/etcd"):
        print("SKIP: kill:coordinator with a standby needs /usr/bin/etcd (etcd-server)")
        return
    taken = gpt_run(tmp, "takeover", ["--world", "4", "--coordinators", "2", "--etcd", "local",
                                      "--fault", "kill:coordinator:step=10"])
    worst, diff = same_as("the coordinator killed at step 10", calm, taken)
    leaders = [e for e in taken[2] if e.get("event") == "leader"]
    if len(leaders) < 2:
        fail(f"no standby took over: leader events {leaders}")
    print(f"ok: kill:coordinator at step 10, the standby led on: losses within {worst:.2g}, "
          f"state within {diff:.2g}")


def test_resume(tmp):
    """(d): --exit-after-step, then --resume, continues exactly: the program's state (model,
    AdamW's moments and step counts, the schedule) went through troupe's checkpoint store."""
    calm = gpt_run(tmp, "calm2", ["--world", "2"])
    run_dir = os.path.join(tmp, "resumed-run")
    out, log = os.path.join(tmp, "resumed.pt"), os.path.join(tmp, "resumed.jsonl")
    args = GPT_ARGS + ["--out", out, "--log-losses", log]
    with Job(JOB + GPT_JOB + ["--world", "2", "--exit-after-step", "12", "--",
                             PYTHON, GPT] + args, run_dir=run_dir) as first:
        code = first.wait(300)
        if code != 0:
            fail(f"the run to step 12 exited {code}:\n{first.output()[-4000:]}")
        first.assert_no_process_left()
        saved = [e for e in first.events() if e.get("event") == "checkpoint" and e.get("step") == 12]
        if not saved:
            fail(f"no checkpoint of step 12 was committed:\n{first.output()[-3000:]}")
    with Job(["--resume", "--no-progress", "--metrics-port", "0", "--", PYTHON, GPT] + args,
             run_dir=run_dir) as second:
        code = second.wait(300)
        if code != 0:
            fail(f"the resumed run exited {code}:\n{second.output()[-4000:]}")
        second.assert_no_process_left()
        events = second.events()
    restored = [e for e in events if e.get("event") == "restored" and e.get("from") == "checkpoint"]
    if not restored:
        fail("the resumed run did not restore from the checkpoint")
    steps = {e["step"]: e["loss"] for e in events if e.get("event") == "step"}
    if sorted(steps) != list(range(1, 25)):
        fail(f"steps after the resume: {sorted(steps)}")
    for s in range(13, 25):
        if steps[s] != calm[0][s]:
            fail(f"step {s} after the resume has loss {steps[s]!r}, the uninterrupted run "
                 f"{calm[0][s]!r}")
    if state_of(out) != calm[1]:
        fail(f"the resumed run's final state_dict differs by {max_relative(calm[1], state_of(out)):.3g}")
    print(f"ok: --exit-after-step 12 then --resume: steps 13-24 and the final state_dict equal "
          f"the uninterrupted run bit for bit ({restored[0].get('bytes')} bytes from the "
          f"checkpoint)")


def test_sigterm(tmp):
    """SIGTERM at the launcher (a scheduler's preemption): a checkpoint, then exit 75."""
    with Job(JOB + ["--world", "2", "--steps", "5000", "--batch", "16", "--micro-batch", "4",
                    "--", PYTHON, GPT, "--d-model", "32"]) as job:
        wait_until(lambda: any(e.get("event") == "step" and e["step"] >= 20
                               for e in job.events()), 120, "step 20")
        job.proc.send_signal(signal.SIGTERM)
        code = job.wait(120)
        if code != 75:
            fail(f"SIGTERM: exit {code}, not 75:\n{job.output()[-3000:]}")
        job.assert_no_process_left()
        events = job.events()
        last = max(e["step"] for e in events if e.get("event") == "step")
        saved = [e for e in events if e.get("event") == "checkpoint" and e.get("step") == last]
        if not saved:
            fail(f"SIGTERM: no checkpoint of the last committed step {last}")
    print(f"ok: SIGTERM at the launcher: checkpoint of step {last}, exit 75, nothing left running")


def test_script_raises(tmp):
    args = ["--steps", "12", "--batch", "8", "--micro-batch", "4", "--d-model", "32",
            "--fail-at-step", "7"]
    out, _ = under_troupe(GPT, args, ["--world", "2", "--steps", "12", "--batch", "8",
                                      "--micro-batch", "4"], expect=1)
    for words in ("raised in step 7", "Traceback", "injected failure at step 7"):
        if words not in out:
            fail(f"the job's error does not say {words!r}:\n{out[-4000:]}")
    print("ok: a script that raises in step 7 ends the job with exit 1 and its traceback")


NEVER_JOINS = {
    # name: (script, job options, words the error must say)
    "exits": ("print('this script never calls troupe')\n", [], "calls troupe.init()"),
    "sleeps": ("import time\ntime.sleep(600)\n", ["--join-timeout-ms", "3000"],
               "calls troupe.init()"),
    "no_trainer": ("import time, troupe\njob = troupe.init()\ntime.sleep(600)\n",
                   ["--step-timeout-ms", "3000", "--heartbeat-timeout-ms", "1000"],
                   "has made its troupe.Trainer"),
}


def test_never_joins(tmp):
    """(f) A script that never calls the API, or stops after troupe.init(), ends the job with
    exit 1 and words that say what to call, within its deadline, and nothing left running."""
    for name, (text, job_args, words) in NEVER_JOINS.items():
        script = os.path.join(tmp, f"never_{name}.py")
        with open(script, "w") as f:
            f.write(text)
        started = time.monotonic()
        out, _ = under_troupe(script, [], ["--world", "2", "--steps", "3", "--batch", "4",
                                           "--micro-batch", "2"] + job_args, timeout=120,
                              expect=1)
        took = time.monotonic() - started
        if words not in out:
            fail(f"never_{name}: the error does not say {words!r}:\n{out[-3000:]}")
        # Workers that never took their place hear no stop: their agent ends them at once,
        # not after the 10 s a worker gets to finish its step.
        if name == "sleeps" and took > 3 + 7:
            fail(f"never_{name}: the job took {took:.1f} s to end after a 3 s join timeout")
        print(f"ok: never_{name}: exit 1 in {took:.1f} s, saying {words!r}")


MISUSE = {
    "float64": ("model = torch.nn.Linear(2, 1).double()", "is torch.float64"),
    "backward_outside": ("BACKWARD_OUTSIDE = True", "step.backward() outside"),
    "other_thread": ("OTHER_THREAD = True", "must come from the thread that made the Trainer"),
}


def test_refusals(tmp):
    for name, (line, words) in MISUSE.items():
        script = os.path.join(tmp, f"{name}.py")
        with open(script, "w") as f:
            f.write(f"""
import threading, torch, troupe
BACKWARD_OUTSIDE = False
OTHER_THREAD = False
job = troupe.init(steps=3, batch=4, micro_batch=2, seed=1)
model = torch.nn.Linear(2, 1)
{line}
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.ones(2, dtype=next(model.parameters()).dtype), torch.zeros(1, dtype=next(model.parameters()).dtype))] * 8
with troupe.Trainer(job, model, opt, data) as t:
    for step in t.steps():
        if BACKWARD_OUTSIDE:
            step.backward(model(torch.ones(2)).sum())
        for mb in step.micro_batches():
            x, y = mb.batch()
            step.backward(((model(x) - y) ** 2).mean())
        if OTHER_THREAD:
            failed = []
            def commit_elsewhere():
                try:
                    step.commit()
                except troupe.UsageError as e:
                    failed.append(e)
            helper = threading.Thread(target=commit_elsewhere)
            helper.start()
            helper.join()
            raise failed[0]
        if step.commit():
            opt.step()
""")
        out, _ = under_troupe(script, [], ["--world", "2", "--steps", "3", "--batch", "4",
                                           "--micro-batch", "2"], timeout=120, expect=1)
        if words not in out:
            fail(f"{name}: the error does not say {words!r}:\n{out[-3000:]}")
        print(f"ok: {name} refused: {words!r}")


GIL_SCRIPT = """
import os, sys, threading, time, torch, troupe
job = troupe.init(steps=4, batch=4, micro_batch=2, seed=1)
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.ones(2), torch.zeros(1))] * 8
ticks = [0]
def tick():
    while ticks[0] >= 0:
        ticks[0] += 1
        time.sleep(0.001)
threading.Thread(target=tick, daemon=True).start()
if os.environ.get("TROUPE_MEMBER") == "1":
    time.sleep(1.0)  # the job forms only once this member has its Trainer: the other waits
with troupe.Trainer(job, model, opt, data) as t:
    before, started = ticks[0], time.monotonic()
    for step in t.steps():  # the first one waits while the job forms: the GIL is released
        if step.number == 1:
            waited = time.monotonic() - started
            # One write of the whole line: under PYTHONUNBUFFERED print() writes the text and
            # its newline apart, and two workers' lines on the shared pipe can interleave.
            sys.stdout.write(f"gil: {ticks[0] - before} ticks in {waited * 1000:.0f} ms\\n")
            sys.stdout.flush()
        for mb in step.micro_batches():
            x, y = mb.batch()
            step.backward(((model(x) - y) ** 2).mean())
        if step.commit():
            opt.step()
ticks[0] = -1
"""


def test_gil_released(tmp):
    """While troupe waits (the job forming, a vote), the script's other threads run."""
    script = os.path.join(tmp, "gil.py")
    with open(script, "w") as f:
        f.write(GIL_SCRIPT)
    out, _ = under_troupe(script, [], ["--world", "2", "--steps", "4", "--batch", "4",
                                       "--micro-batch", "2"], timeout=120)
    lines = [l.split() for l in out.splitlines() if l.startswith("gil: ")]
    if len(lines) != 2:
        fail(f"expected a gil line from each of 2 workers:\n{out[-2000:]}")
    waited = max(float(l[4]) for l in lines)
    ticks = next(int(l[1]) for l in lines if float(l[4]) == waited)
    if waited < 300:
        fail(f"no worker waited for the other's 1 s delay (waits {[l[4] for l in lines]} ms)")
    if ticks < waited / 10:
        fail(f"a Python thread ran {ticks} times in {waited:.0f} ms while troupe waited: the GIL "
             "was held")
    print(f"ok: another Python thread ticked {ticks} times in the {waited:.0f} ms a worker's "
          "first step waited for the job to form")


PRELOAD_SCRIPT = """
import os, subprocess, sys, torch, troupe
from troupe import _native
job = troupe.init(steps=2, batch=4, micro_batch=2, seed=1)
child = subprocess.run(["/bin/true"]).returncode
# One write of the whole line (see GIL_SCRIPT).
sys.stdout.write(f"preload: interposed={_native.interposed()} "
                 f"inherited={'LD_PRELOAD' in os.environ} child={child}\\n")
sys.stdout.flush()
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with troupe.Trainer(job, model, opt, [(torch.ones(2), torch.zeros(1))] * 8) as t:
    for step in t.steps():
        for mb in step.micro_batches():
            x, y = mb.batch()
            step.backward(((model(x) - y) ** 2).mean())
        if step.commit():
            opt.step()
"""


def test_preload(tmp):
    """The agent preloads the extension into a Python worker, so its bind()/connect() come
    before the C library's (gloo's pairs signed and abortable, as in the troupe binary); the
    script's own children do not inherit it."""
    script = os.path.join(tmp, "preload.py")
    with open(script, "w") as f:
        f.write(PRELOAD_SCRIPT)
    out, _ = under_troupe(script, [], ["--world", "2", "--steps", "2", "--batch", "4",
                                       "--micro-batch", "2"], timeout=120)
    lines = [l for l in out.splitlines() if l.startswith("preload: ")]
    want = "preload: interposed=True inherited=False child=0"
    if len(lines) != 2 or any(l != want for l in lines):
        fail(f"expected two workers saying {want!r}, got {lines}:\n{out[-2000:]}")
    if "cannot be signed" in out:
        fail(f"a worker warned that its pairs cannot be signed:\n{out[-2000:]}")
    print("ok: the extension is preloaded into each Python worker (bind/connect interposed), "
          "and not inherited by the script's children")


def test():
    if not have_torch():
        print(f"SKIP: {PYTHON} cannot import torch (apt install python3-torch)")
        sys.exit(77)
    if not os.path.isfile(os.path.join(BUILD_PYTHON, "troupe", "__init__.py")):
        fail(f"the troupe module is not built in {BUILD_PYTHON}")
    with tempfile.TemporaryDirectory(prefix="troupe-python-") as tmp:
        test_world1_and_world2(tmp)
        test_faults(tmp)
        test_resume(tmp)
        test_sigterm(tmp)
        test_script_raises(tmp)
        test_refusals(tmp)
        test_never_joins(tmp)
        test_gil_released(tmp)
        test_preload(tmp)


if __name__ == "__main__":
    main(test)
