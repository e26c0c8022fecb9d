#!/usr/bin/env python3
"""Issue 35, a newcomer's first hour, as real jobs:

(a) `--run-dir D --resume` alone after a non-default run continues it exactly: the losses of
    the two sessions equal those of an uninterrupted run of the same options;
(b) `--steps` raised on resume keeps the learning rate continuous (no jump back up);
(c) every subcommand takes `--opt=value` (no "unknown option");
(d) a SIGTERM stop (exit 75) logs no `error`;
(e) `troupe status RUN_DIR` from another directory works when --metrics-token was relative;
(f) every flag of the settings table is in `troupe run --help` and in the README's list, which
    is exactly `troupe help options`;
(g) `cmake --install` puts the binary and the default corpus under a prefix, and the installed
    binary runs.
"""

import os
import re
import signal
import subprocess
import tempfile

import harness
from harness import SMALL_MODEL, TROUPE, fail, free_port, wait_until

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
# Not the defaults: a resume that forgot them would build another model and refuse.
OPTIONS = SMALL_MODEL + ["--d-model", "48", "--heads", "3", "--lr", "0.002", "--seed", "7",
                         "--checkpoint-every", "5", "--metrics-port", "0"]


def run(args, cwd=None, timeout=240):
    p = subprocess.run([TROUPE] + args, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    return p.returncode, p.stdout + p.stderr


def steps_of(run_dir):
    return {e["step"]: e for e in harness.read_events(run_dir) if e.get("event") == "step"}


def resume_remembers(tmp):
    whole = os.path.join(tmp, "whole")
    code, out = run(["run", "--run-dir", whole, "--steps", "30"] + OPTIONS)
    if code != 0:
        fail(f"the uninterrupted run exited {code}:\n{out}")
    split = os.path.join(tmp, "split")
    code, out = run(["run", "--run-dir", split, "--steps", "30", "--exit-after-step", "15"] +
                    OPTIONS)
    if code != 0:
        fail(f"the first session exited {code}:\n{out}")
    code, out = run(["run", "--run-dir", split, "--resume"])
    if code != 0:
        fail(f"`troupe run --run-dir D --resume` alone exited {code}:\n{out}")
    if "unchanged" not in out:
        fail(f"the resume did not say that the run's config was unchanged:\n{out}")
    a, b = steps_of(whole), steps_of(split)
    if sorted(a) != list(range(1, 31)) or sorted(b) != list(range(1, 31)):
        fail(f"steps: uninterrupted {sorted(a)}, resumed {sorted(b)}")
    worst = max(harness.relative_difference(a[s]["loss"], b[s]["loss"]) for s in a)
    if worst > 1e-6:
        fail(f"the resumed run's losses differ from the uninterrupted run's by up to {worst:.2e}")
    print(f"ok: --resume alone continues a non-default run exactly (worst loss {worst:.1e})")
    # A setting that shapes the math is refused, naming it.
    code, out = run(["run", "--run-dir", split, "--resume", "--layers", "3"])
    if code != 2 or "model.n_layer (--layers) cannot change" not in out:
        fail(f"--resume --layers 3 exited {code}, wanted 2 naming the setting:\n{out}")
    print("ok: a resume that changes the model is refused (exit 2), naming --layers")


def steps_extended(tmp):
    d = os.path.join(tmp, "extend")
    code, out = run(["run", "--run-dir", d, "--steps", "40", "--exit-after-step", "30"] + OPTIONS)
    if code != 0:
        fail(f"the first session exited {code}:\n{out}")
    code, out = run(["run", "--run-dir", d, "--resume", "--steps", "80"])
    if code != 0:
        fail(f"the resume with --steps 80 exited {code}:\n{out}")
    if "steps 40 -> 80" not in out:
        fail(f"the resume did not say what changed:\n{out}")
    lr = {s: e["lr"] for s, e in steps_of(d).items()}
    # The last two steps of the first session and the first two of the second: one cosine.
    before, at, after = lr[30] - lr[29], lr[31] - lr[30], lr[32] - lr[31]
    if not (lr[31] <= lr[30] and abs(at) <= 2 * abs(before) + 1e-12 and after <= 0):
        fail(f"the learning rate jumped at the resume: {[lr[s] for s in (29, 30, 31, 32)]}")
    if not lr[80] < lr[31]:
        fail(f"the schedule does not decay to step 80: lr[31] {lr[31]}, lr[80] {lr[80]}")
    print(f"ok: --steps raised on resume: lr {lr[30]:.6f} -> {lr[31]:.6f}, decaying to "
          f"{lr[80]:.6f} at step 80")


def equals_everywhere(tmp):
    d = os.path.join(tmp, "extend")  # a run with checkpoints (steps_extended)
    cases = [
        ["run", "--steps=5", "--print-config"],
        ["coordinator", "--port=0", "--print-config"],
        ["agent", "--coordinator=127.0.0.1:1", f"--join-token={tmp}/missing.token"],
        ["worker", "--coordinator=127.0.0.1:1", "--member=0", f"--join-token={tmp}/missing"],
        ["ckpt", "verify", d, "--step=80"],
        ["ckpt", "gc", d, "--keep-last=5"],
        ["report", d, f"--output={tmp}/r.html"],
        ["status", d, "--timeout-ms=500"],
        ["bench", "comm", "--ranks=2", "--ops=all_reduce", "--min-bytes=4K", "--max-bytes=4K",
         "--batches=1", "--batch-seconds=0.01", "--transport=shm"],
    ]
    for args in cases:
        code, out = run(args)
        if "unknown option" in out or "unexpected argument" in out:
            fail(f"`troupe {' '.join(args)}` did not take --opt=value (exit {code}):\n{out}")
        # The ones that can succeed here must.
        if args[0] in ("run", "coordinator", "ckpt", "report", "bench") and code != 0:
            fail(f"`troupe {' '.join(args)}` exited {code}:\n{out}")
    print(f"ok: --opt=value taken by {len(cases)} subcommands")


def sigterm_logs_no_error(tmp):
    d = os.path.join(tmp, "preempted")
    with harness.Job(["--steps", "2000", "--checkpoint-every", "0"] + OPTIONS,
                     run_dir=d) as job:
        wait_until(lambda: len(steps_of(d)) >= 3, 120, "three committed steps")
        job.proc.send_signal(signal.SIGTERM)
        code = job.wait(120)
        out = job.output()
    if code != 75:
        fail(f"SIGTERM: exit {code}, wanted 75:\n{out}")
    errors = [line for line in out.splitlines() if re.search(r"\berror\b", line)]
    if errors:
        fail("a requested stop logged an error:\n" + "\n".join(errors))
    if not re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \[troupe coordinator", out):
        fail(f"the coordinator's log lines carry no UTC timestamp:\n{out}")
    print("ok: SIGTERM stops with exit 75 and logs no error; log lines are timestamped")


def status_from_elsewhere(tmp):
    home = os.path.join(tmp, "home")
    os.makedirs(home)
    token = os.path.join(home, "token")
    with open(token, "w") as f:
        f.write("a-secret-of-this-test\n")
    os.chmod(token, 0o600)
    port = free_port()
    args = [TROUPE, "run", "--run-dir", "run", "--steps", "2000", "--metrics-port", str(port),
            "--metrics-token", "token"] + OPTIONS[:-2]
    log = open(os.path.join(tmp, "status-job.log"), "w")
    proc = subprocess.Popen(args, cwd=home, stdout=log, stderr=subprocess.STDOUT)
    run_dir = os.path.join(home, "run")
    try:
        wait_until(lambda: len(steps_of(run_dir)) >= 2, 120, "two committed steps")
        elsewhere = tempfile.mkdtemp(dir=tmp)
        code, out = run(["status", run_dir, "--json"], cwd=elsewhere)
        if code != 0 or '"step"' not in out:
            fail(f"`troupe status RUN_DIR` from another directory exited {code}:\n{out}")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pid in harness.job_pids(harness.read_events(run_dir)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()
    print("ok: troupe status RUN_DIR works from another directory with a relative token")


def help_and_readme():
    code, listed = run(["help", "options"])
    if code != 0:
        fail(f"troupe help options exited {code}")
    code, run_help = run(["run", "--help"])
    flags = re.findall(r"^  (--[a-z0-9-]+)", listed, re.M)
    if len(flags) < 60:
        fail(f"troupe help options lists only {len(flags)} flags")
    missing = [f for f in flags if f not in run_help]
    if missing:
        fail(f"troupe run --help lacks {missing}")
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    m = re.search(r"<!-- options: begin -->\n```text\n(.*?)```\n<!-- options: end -->", readme,
                  re.S)
    if not m:
        fail("README.md has no options list between <!-- options: begin/end --> markers")
    if m.group(1) != listed:
        fail("README.md's options list is not `troupe help options`; regenerate it with "
             "scripts/readme_options.sh")
    print(f"ok: all {len(flags)} job options are in --help and in the README")


def install_works(tmp):
    build = os.path.dirname(os.path.dirname(TROUPE))  # TROUPE is BUILD/cli/troupe
    prefix = os.path.join(tmp, "prefix")
    p = subprocess.run(["cmake", "--install", build, "--prefix", prefix], capture_output=True,
                       text=True, timeout=120)
    if p.returncode != 0:
        fail(f"cmake --install exited {p.returncode}:\n{p.stdout}{p.stderr}")
    installed = os.path.join(prefix, "bin", "troupe")
    corpus = os.path.join(prefix, "share", "troupe", "kjv.txt")
    if not os.access(installed, os.X_OK) or not os.path.getsize(corpus):
        fail(f"cmake --install left no {installed} or no {corpus}")
    v = subprocess.run([installed, "--version"], capture_output=True, text=True, timeout=30)
    if v.returncode != 0 or not v.stdout.startswith("troupe "):
        fail(f"the installed troupe --version: {v.returncode} {v.stdout}{v.stderr}")
    print(f"ok: cmake --install: {installed} ({v.stdout.strip()}) and the default corpus")


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-first-hour-") as tmp:
        help_and_readme()
        install_works(tmp)
        resume_remembers(tmp)
        steps_extended(tmp)
        equals_everywhere(tmp)
        sigterm_logs_no_error(tmp)
        status_from_elsewhere(tmp)


if __name__ == "__main__":
    harness.main(test)
