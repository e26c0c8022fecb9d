"""Divergence is never committed, through real jobs:

- stop (the default): `--lr 1e6` makes the loss non-finite within a few steps; the job ends
  with exit 3, the console and the `diverged` event name the step and the value, no step
  after the last good one is committed, and the last committed checkpoint verifies;
- rollback: a poisoned batch (`--fault diverge:step=8`) is refused, the job restores the last
  committed checkpoint, skips that batch and trains on to the end (exit 0); the rollback is in
  events.jsonl, in RUN_DIR/skipped_batches.json and in troupe_divergences_total;
- the skip is part of the run: a job stopped after the rollback and resumed trains exactly
  the steps of one that was not stopped;
- spent rollbacks: `--max-rollbacks 0` stops at the first divergence with exit 3."""

import json
import os
import subprocess
import urllib.request

from harness import (SMALL_MODEL, TROUPE, Job, fail, free_port, last_job, main, run_to_end,
                     step_losses, tempfile, wait_until)

BASE = SMALL_MODEL + ["--world", "2", "--metrics-port", "0"]


def of(events, name):
    return [e for e in events if e.get("event") == name]


def latest_step(run_dir):
    with open(os.path.join(run_dir, "checkpoints", "LATEST")) as f:
        text = f.read().strip()
    digits = "".join(c for c in text if c.isdigit())
    return int(digits) if digits else None


def verify(run_dir):
    p = subprocess.run([TROUPE, "ckpt", "verify", run_dir], capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout + p.stderr


def stop_policy(tmp):
    d = os.path.join(tmp, "huge-lr")
    code, events, output = run_to_end(BASE + ["--steps", "40", "--checkpoint-every", "1",
                                              "--lr", "1e6"], timeout=300, run_dir=d)
    if code != 3:
        fail(f"--lr 1e6: expected exit 3, got {code}:\n{output}")
    diverged = of(events, "diverged")
    if len(diverged) != 1 or diverged[0]["action"] != "stop":
        fail(f"--lr 1e6: expected one diverged event with action stop, got {diverged}")
    step, what = diverged[0]["step"], diverged[0]["what"]
    if f"step {step} diverged" not in output or what.split(" (")[0] not in output:
        fail(f"--lr 1e6: the console does not name step {step} and '{what}':\n{output}")
    committed = sorted(step_losses(events))
    if committed != list(range(1, step)):
        fail(f"--lr 1e6: committed steps {committed}, expected 1..{step - 1} and not {step}")
    failed = of(events, "job_failed")
    if not failed or failed[-1]["exit_code"] != 3:
        fail(f"--lr 1e6: the job_failed event does not say exit 3: {failed}")
    if step > 1:
        if latest_step(d) != step - 1:
            fail(f"--lr 1e6: LATEST names {latest_step(d)}, expected the last good step {step - 1}")
        vcode, vout = verify(d)
        if vcode != 0:
            fail(f"--lr 1e6: the last committed checkpoint does not verify:\n{vout}")
        if f"checkpoint        step {step - 1} (LATEST" not in output:
            fail(f"--lr 1e6: the summary does not name checkpoint step {step - 1}:\n{output}")
    print(f"stop: step {step} diverged ({what}); exit 3; steps 1..{step - 1} committed, "
          f"checkpoint {step - 1} verifies")


def rollback_policy(tmp):
    d = os.path.join(tmp, "rollback")
    port = free_port()
    # A model big enough that the job outlives a scrape of its metrics after the rollback.
    args = ["--world", "2", "--metrics-port", str(port), "--no-progress", "--eval-every", "0",
            "--steps", "200", "--checkpoint-every", "5", "--on-divergence", "rollback",
            "--fault", "diverge:step=8", "--layers", "4", "--d-model", "128", "--heads", "4"]
    scraped = None
    with Job(args, run_dir=d) as job:
        wait_until(lambda: of(job.events(), "diverged") or job.proc.poll() is not None, 120,
                   "the diverged event")

        def scrape():
            nonlocal scraped
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            except OSError:
                return job.proc.poll() is not None
            lines = [l for l in text.decode().splitlines()
                     if l.startswith("troupe_divergences_total")]
            if lines and float(lines[0].split()[-1]) >= 1:
                scraped = lines[0]
                return True
            return job.proc.poll() is not None
        wait_until(scrape, 60, "troupe_divergences_total")
        code = job.wait(300)
        events, output = job.events(), job.output()
    if code != 0:
        fail(f"rollback: expected exit 0, got {code}:\n{output}")
    if scraped is None:
        fail("rollback: troupe_divergences_total never counted the divergence")
    diverged = of(events, "diverged")
    if len(diverged) != 1 or diverged[0]["step"] != 8 or diverged[0]["action"] != "rollback":
        fail(f"rollback: expected one rollback at step 8, got {diverged}")
    if diverged[0]["skipped_steps"] != [8]:
        fail(f"rollback: the event does not record the skipped batch: {diverged[0]}")
    generations = [g for g in of(events, "generation") if g["number"] > 1]
    if not generations or generations[0]["cause"] != "divergence" or generations[0]["start_step"] != 5:
        fail(f"rollback: expected a generation from checkpoint step 5, got {generations}")
    restored = [r for r in of(events, "restored") if r["generation"] == generations[0]["number"]]
    if not restored or any(r["from"] != "checkpoint" for r in restored):
        fail(f"rollback: the ranks did not restore the checkpoint: {restored}")
    steps = [e["step"] for e in of(events, "step")]
    after = steps[steps.index(7) + 1:] if 7 in steps else []
    if 8 in steps[:steps.index(7) + 1] or max(steps) != 200 or 8 not in after:
        fail(f"rollback: steps went {steps}; expected 1..7, a replay from 6, past 8, to 200")
    with open(os.path.join(d, "skipped_batches.json")) as f:
        recorded = json.load(f)["skipped_steps"]
    if recorded != [8]:
        fail(f"rollback: skipped_batches.json holds {recorded}")
    if "step 8 diverged" not in output or "rolling back" not in output:
        fail(f"rollback: the console does not report the divergence:\n{output}")
    print(f"rollback: step 8 refused, restored step 5, skipped its batch, trained to 200; {scraped}")


def rollback_resumes_exactly(tmp):
    args = BASE + ["--steps", "20", "--checkpoint-every", "5", "--on-divergence", "rollback",
                   "--fault", "diverge:step=8"]
    whole = os.path.join(tmp, "whole")
    code, full, output = run_to_end(args, timeout=300, run_dir=whole)
    if code != 0:
        fail(f"rollback to 20: exit {code}:\n{output}")
    parts = os.path.join(tmp, "parts")
    code, _, output = run_to_end(args + ["--exit-after-step", "12"], timeout=300, run_dir=parts)
    if code != 0:
        fail(f"rollback, stopped at 12: exit {code}:\n{output}")
    code, events, output = run_to_end(args + ["--resume"], timeout=300, run_dir=parts)
    if code != 0:
        fail(f"rollback, resumed: exit {code}:\n{output}")
    resumed = step_losses(last_job(events))
    expected = {s: l for s, l in step_losses(full).items() if s > 12}
    if sorted(resumed) != sorted(expected):
        fail(f"resumed steps {sorted(resumed)}, expected {sorted(expected)}")
    worst = max(abs(resumed[s] - expected[s]) / abs(expected[s]) for s in expected)
    if worst > 1e-6:
        fail(f"a resumed run skips other batches than an uninterrupted one (worst {worst:.2e})")
    print(f"the skipped batch is part of the run: resumed steps 13..20 match (worst {worst:.1e})")


def rollbacks_spent(tmp):
    d = os.path.join(tmp, "no-rollbacks")
    code, events, output = run_to_end(BASE + ["--steps", "12", "--on-divergence", "rollback",
                                              "--max-rollbacks", "0", "--fault", "diverge:step=3"],
                                      timeout=300, run_dir=d)
    if code != 3 or "step 3 diverged" not in output or "--max-rollbacks 0" not in output:
        fail(f"--max-rollbacks 0: expected exit 3 naming step 3, got {code}:\n{output}")
    if sorted(step_losses(events)) != [1, 2]:
        fail(f"--max-rollbacks 0: committed {sorted(step_losses(events))}")
    print("--max-rollbacks 0: stops at the first divergence with exit 3")


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-divergence-") as tmp:
        stop_policy(tmp)
        rollback_policy(tmp)
        rollback_resumes_exactly(tmp)
        rollbacks_spent(tmp)


if __name__ == "__main__":
    main(test)
