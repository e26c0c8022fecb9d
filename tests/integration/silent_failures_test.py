"""Failures that are never silent, and a record that is never torn, through real jobs:

- disk full (a 24 MiB tmpfs in a private mount namespace): each failed checkpoint is a line on
  the console, a checkpoint_failed event and troupe_checkpoint_failures_total; training goes
  on; the job exits 4 because no later checkpoint committed, and the summary names the
  checkpoint LATEST holds;
- an unwritable checkpoint store (a read-only bind mount) under `--exit-after-step`: exit 4,
  and neither the message nor the summary claims the checkpoint that failed; --resume starts
  from the one LATEST names; a run directory that is read-only from the start is refused
  with the reason;
- SIGINT while a checkpoint is being committed: the job waits for it, exits 130, and the
  summary names exactly what LATEST holds; a second SIGINT stops everything at once;
- temporary files of an interrupted write are removed at the next start;
- a torn last line of events.jsonl is skipped, with a warning, by the tests' reader, and a
  resumed job's first line does not stick to it."""

import contextlib
import io
import os
import re
import signal
import subprocess

from harness import (SMALL_MODEL, TROUPE, Job, fail, free_port, last_job, main, read_events,
                     read_events_file, run_ok, run_to_end, step_losses, tempfile, wait_until)

BIG = ["--world", "2", "--eval-every", "0", "--layers", "4", "--d-model", "128", "--heads", "4",
       "--no-progress"]


def of(events, name):
    return [e for e in events if e.get("event") == name]


def latest_step(run_dir):
    path = os.path.join(run_dir, "checkpoints", "LATEST")
    if not os.path.exists(path):
        return None
    digits = "".join(c for c in open(path).read() if c.isdigit())
    return int(digits) if digits else None


def summary_checkpoint(output):
    m = re.search(r"^  checkpoint +(.*)$", output, re.M)
    return m.group(1) if m else None


def in_namespace(script, timeout):
    """Runs `script` with sh in a private mount namespace (root); exit 90 means no mount."""
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=timeout)
    if p.returncode == 90:
        fail(f"could not mount in a private mount namespace (run as root):\n{p.stderr}")
    return p


def disk_full(tmp):
    d = os.path.join(tmp, "tiny-disk")
    os.makedirs(d)
    port = free_port()
    # Each checkpoint of this model is ~10 MB: two fit in 24 MiB, the third does not, and with
    # --keep-last 0 nothing is freed, so every later one fails too. Enough steps that the job
    # outlives the scrape of its metrics.
    STEPS = 160
    script = f"""
set -u
mount -t tmpfs -o size=24m tmpfs {d} || exit 90
{TROUPE} run --run-dir {d}/run --steps {STEPS} --checkpoint-every 8 --keep-last 0 \
  --metrics-port {port} {' '.join(BIG)} > {tmp}/disk.log 2>&1 &
job=$!
# Scrape until the failure is counted (the job runs on for many more steps).
python3 -c "
import time, urllib.request
deadline = time.monotonic() + 120
answered = time.monotonic()
while time.monotonic() < deadline:
    try:
        text = urllib.request.urlopen('http://127.0.0.1:{port}/metrics', timeout=10).read().decode()
    except OSError:  # not listening yet, or the job is over
        if time.monotonic() - answered > 15:
            break
        time.sleep(0.05)
        continue
    answered = time.monotonic()
    open('{tmp}/metrics.txt', 'w').write(text)
    if any(l.startswith('troupe_checkpoint_failures_total ') and float(l.split()[-1]) >= 1
           for l in text.splitlines()):
        break
    time.sleep(0.05)"
wait $job
echo "exit=$?" >> {tmp}/disk.log
cp {d}/run/events.jsonl {tmp}/disk-events.jsonl
cat {d}/run/checkpoints/LATEST > {tmp}/disk-latest 2>/dev/null
"""
    in_namespace(script, 400)
    log = open(os.path.join(tmp, "disk.log")).read()
    events = read_events_file(os.path.join(tmp, "disk-events.jsonl"))
    failed = of(events, "checkpoint_failed")
    committed = [c["step"] for c in of(events, "checkpoint")]
    if "exit=4" not in log:
        fail(f"disk full: expected exit 4 (a checkpoint failed, none later), got:\n{log[-3000:]}")
    if not failed or "space" not in failed[0]["error"].lower():
        fail(f"disk full: expected checkpoint_failed naming the full disk, got {failed}")
    if not re.search(rf"checkpoint of step {failed[0]['step']} failed: .*space", log, re.I):
        fail(f"disk full: the failure is not on the console:\n{log[-3000:]}")
    if max(step_losses(events)) != STEPS:
        fail(f"disk full: training did not go on to step {STEPS}")
    metrics = open(os.path.join(tmp, "metrics.txt")).read()
    line = [m for m in metrics.splitlines() if m.startswith("troupe_checkpoint_failures_total")]
    if not line or float(line[0].split()[-1]) < 1:
        fail(f"disk full: troupe_checkpoint_failures_total does not count it: {line}")
    latest = "".join(c for c in open(os.path.join(tmp, "disk-latest")).read() if c.isdigit())
    if not committed or int(latest) != committed[-1]:
        fail(f"disk full: LATEST says {latest}, the events {committed}")
    if summary_checkpoint(log) != f"step {committed[-1]} (LATEST in {d}/run/checkpoints)":
        fail(f"disk full: the summary does not name LATEST's step {committed[-1]}:\n{log[-2000:]}")
    print(f"disk full: committed {committed}, then {len(failed)} failures on the console, in "
          f"events and metrics; exit 4; the summary names step {committed[-1]}")


def unwritable(tmp):
    d = os.path.join(tmp, "read-only")
    small = SMALL_MODEL + ["--world", "2", "--metrics-port", "0"]
    run_ok("read-only base", small + ["--steps", "40", "--checkpoint-every", "5",
                                      "--exit-after-step", "5"], d)
    if latest_step(d) != 5:
        fail(f"read-only: the base run's LATEST is {latest_step(d)}")
    chunks = os.path.join(d, "checkpoints", "chunks")
    script = f"""
set -u
mount --bind {chunks} {chunks} && mount -o remount,bind,ro {chunks} || exit 90
{TROUPE} run --run-dir {d} --steps 40 --checkpoint-every 5 --exit-after-step 20 --resume \
  {' '.join(small)} > {tmp}/ro.log 2>&1
echo "exit=$?" >> {tmp}/ro.log
umount {chunks}
mount --bind {d} {d} && mount -o remount,bind,ro {d} || exit 90
{TROUPE} run --run-dir {d} --steps 40 --resume {' '.join(small)} > {tmp}/ro-dir.log 2>&1
echo "exit=$?" >> {tmp}/ro-dir.log
"""
    in_namespace(script, 300)
    log = open(os.path.join(tmp, "ro.log")).read()
    job = last_job(read_events(d))
    failed = of(job, "checkpoint_failed")
    if "exit=4" not in log:
        fail(f"read-only store: expected exit 4, got:\n{log[-3000:]}")
    if [f["step"] for f in failed] != [10, 15, 20] or "read-only" not in failed[-1]["error"].lower():
        fail(f"read-only store: expected checkpoints 10, 15, 20 to fail as read-only: {failed}")
    for step in (10, 15, 20):
        if f"checkpoint of step {step} failed" not in log:
            fail(f"read-only store: the failure of step {step} is not on the console:\n{log}")
    message = of(job, "job_failed")[-1]["message"] if of(job, "job_failed") else ""
    if "checkpoint of step 20 failed" not in message or "step 5" not in message:
        fail(f"read-only store: the end message does not say what is saved: {message!r}")
    if "--resume continues\n" in log or latest_step(d) != 5:
        fail(f"read-only store: LATEST is {latest_step(d)}; output:\n{log}")
    if summary_checkpoint(log) != f"step 5 (LATEST in {d}/checkpoints)":
        fail(f"read-only store: the summary claims another checkpoint:\n{log}")
    ro_dir = open(os.path.join(tmp, "ro-dir.log")).read()
    if "exit=0" in ro_dir or "read-only" not in ro_dir.lower():
        fail(f"read-only run directory: expected a refusal naming it:\n{ro_dir}")
    code, events, output = run_to_end(small + ["--steps", "40", "--exit-after-step", "8",
                                               "--resume"], timeout=120, run_dir=d)
    if code != 0 or "resuming from checkpoint step 5" not in output:
        fail(f"read-only store: --resume did not start from LATEST's step 5:\n{output}")
    print("read-only store: checkpoints 10, 15, 20 failed on the console and in events; exit 4; "
          "the summary and --resume use step 5; a read-only run directory is refused")
    return d


def stale_temp_files(d):
    planted = [os.path.join(d, "checkpoints", "chunks", "00", "00ff" * 8 + ".tmp.4242.0"),
               os.path.join(d, "checkpoints", "LATEST.tmp.4242.1"),
               os.path.join(d, "skipped_batches.json.tmp.4242.2")]
    for p in planted:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write("half a write")
    code, _, output = run_to_end(SMALL_MODEL + ["--world", "2", "--metrics-port", "0", "--steps",
                                                "40", "--exit-after-step", "9", "--resume"],
                                 timeout=120, run_dir=d)
    left = [p for p in planted if os.path.exists(p)]
    if code != 0 or left:
        fail(f"stale temporary files: exit {code}, still there: {left}\n{output}")
    if any(f"removed {p}, left by an interrupted write" not in output for p in planted):
        fail(f"stale temporary files: the removals are not reported:\n{output}")
    print(f"stale temporary files: {len(planted)} removed at the next start")


def sigint_mid_checkpoint(tmp):
    d = os.path.join(tmp, "sigint")
    env = os.environ.copy()
    # Commits take half a second: the signal lands while one is under way.
    env["TROUPE_CHAOS_COMMIT_PAUSE_MS"] = "500"
    with Job(BIG + ["--metrics-port", "0", "--steps", "400", "--checkpoint-every", "10"],
             run_dir=d, env=env) as job:
        def asked():
            events = job.events()
            done = {c["step"] for c in of(events, "checkpoint")}
            steps = [s["step"] for s in of(events, "step")]
            due = [s for s in steps if s % 10 == 0 and s >= 20 and s not in done]
            return due[0] if due else None
        in_flight = wait_until(asked, 120, "a checkpoint being committed")
        job.proc.send_signal(signal.SIGINT)
        code = job.wait(120)
        output = job.output()
        events = job.events()
        job.assert_no_process_left()
    if code != 130:
        fail(f"SIGINT: expected exit 130, got {code}:\n{output}")
    latest = latest_step(d)
    if latest is None or latest < in_flight:
        fail(f"SIGINT: the checkpoint of step {in_flight} being committed was dropped "
             f"(LATEST {latest})")
    if summary_checkpoint(output) != f"step {latest} (LATEST in {d}/checkpoints)":
        fail(f"SIGINT: LATEST holds step {latest}, the summary says:\n{output}")
    if not of(events, "interrupted"):
        fail("SIGINT: no interrupted event")
    print(f"SIGINT while step {in_flight}'s checkpoint was committed: exit 130, LATEST {latest}, "
          "and the summary says the same")

    with Job(BIG + ["--metrics-port", "0", "--steps", "400", "--checkpoint-every", "10"],
             run_dir=d + "-twice", env=env) as job:
        wait_until(asked, 120, "a checkpoint being committed")
        job.proc.send_signal(signal.SIGINT)
        # Two signals sent at once may arrive as one: the second follows the first's answer.
        wait_until(lambda: "stopping the job" in job.output(), 30, "the first SIGINT's answer")
        job.proc.send_signal(signal.SIGINT)
        code = job.wait(30)
        output = job.output()
        job.assert_no_process_left()
    if code != 130 or "killed; the committed checkpoint is" not in output:
        fail(f"a second SIGINT: expected exit 130 at once, got {code}:\n{output}")
    print("a second SIGINT stops every process at once, naming the committed checkpoint")


def torn_last_line(d):
    path = os.path.join(d, "events.jsonl")
    before = read_events(d)
    with open(path, "a") as f:
        f.write('{"ts":"2026-01-01T00:00:00.000Z","unix_ms":17672256000')
    warnings = io.StringIO()
    with contextlib.redirect_stderr(warnings):
        after = read_events(d)
    if after != before or "torn line" not in warnings.getvalue():
        fail(f"a torn last line: read {len(after)} events (expected {len(before)}), "
             f"warning {warnings.getvalue()!r}")
    code, _, output = run_to_end(SMALL_MODEL + ["--world", "2", "--metrics-port", "0", "--steps",
                                                "40", "--exit-after-step", "10", "--resume"],
                                 timeout=120, run_dir=d)
    with contextlib.redirect_stderr(io.StringIO()):
        events = read_events(d)
    starts = len(of(events, "job_start"))
    if code != 0 or starts != len(of(before, "job_start")) + 1 or not of(last_job(events), "step"):
        fail(f"after a torn line, the resumed job's events are not whole (exit {code}):\n{output}")
    print("a torn last line is skipped with a warning; the next job's lines stay whole")


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-silent-") as tmp:
        disk_full(tmp)
        d = unwritable(tmp)
        stale_temp_files(d)
        torn_last_line(d)
        sigint_mid_checkpoint(tmp)


if __name__ == "__main__":
    main(test)
