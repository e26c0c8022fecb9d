"""A checkpoint damaged on disk under a running job, then needed by a rollback (found by the
soak, issue 28): the ranks cannot read it, and the job does not give up. The committed
checkpoint of step 30 gets one byte flipped while rank 1 is stopped at step 35; step 36 diverges
and the rollback's restore meets the damage. The coordinator verifies step 30, moves it to
checkpoints/damaged/, finds step 20 intact, points LATEST at it (`checkpoint_fallback` event,
resumed_step 20), and every rank restores step 20 and replays: the job ends with exit 0, every
committed step has the loss of a run without the damage, and the final parameters are that
run's. With step 20 damaged as well, nothing earlier reads back and the job ends with exit 1
naming step 30, instead of retrying until it gives up."""

import json
import os
import tempfile

from harness import (SMALL_MODEL, Job, checkpoint_param_diff, fail, main, relative_difference,
                     run_ok, step_losses, wait_until)

ARGS = SMALL_MODEL + ["--world", "2", "--steps", "40", "--checkpoint-every", "10",
                      "--keep-last", "0", "--on-divergence", "rollback", "--metrics-port", "0",
                      "--fault", "diverge:step=36", "--heartbeat-timeout-ms", "6000",
                      "--set", "checkpoint_async=false"]
# Rank 1 is held at step 35 for 3 s: step 30's checkpoint (written inside its step) is committed
# by then, and the rollback that reads it comes only after.
HOLD = ["--fault", "stop:rank=1:step=35:for=3s"]


def flip_a_byte(run_dir, step):
    """One byte in the middle of every chunk the checkpoint of `step` names."""
    ckpt = os.path.join(run_dir, "checkpoints")
    with open(os.path.join(ckpt, f"step-{step:08d}", "manifest.json")) as f:
        chunks = sorted({c for p in json.load(f)["pieces"] for c in p["chunks"]})
    for c in chunks:
        path = os.path.join(ckpt, "chunks", c[:2], c)
        with open(path, "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(size // 2)
            b = f.read(1)
            f.seek(size // 2)
            f.write(bytes([b[0] ^ 0x5A]))
    return len(chunks)


def latest(run_dir):
    try:
        with open(os.path.join(run_dir, "checkpoints", "LATEST")) as f:
            return f.read().strip()
    except OSError:
        return ""


def damaged_run(run_dir, steps_to_damage):
    with Job(ARGS + HOLD, run_dir=run_dir) as job:
        wait_until(lambda: latest(run_dir) == "step-00000030" or job.proc.poll() is not None,
                   60, "the checkpoint of step 30")
        if job.proc.poll() is not None:
            fail(f"the job ended before step 30's checkpoint:\n{job.output()}")
        # Rank 1 is stopped at step 35 now or soon; the rollback is at step 36.
        wait_until(lambda: [e for e in job.events() if e.get("event") == "fault" and
                            e.get("what") == "stop"] or job.proc.poll() is not None,
                   60, "the stop at step 35")
        if job.proc.poll() is not None or \
                [e for e in job.events() if e.get("event") == "diverged"]:
            fail(f"the rollback came before the damage; the test's timing is off:\n"
                 f"{job.output()}")
        flipped = sum(flip_a_byte(run_dir, s) for s in steps_to_damage)
        print(f"flipped a byte in {flipped} chunks of steps {steps_to_damage}", flush=True)
        code = job.wait(120)
        events = job.events()
        output = job.output()
        # What the test damaged is moved aside by the job; Job.close verifies what is left.
    return code, events, output


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-fallback-") as tmp:
        ref_dir = os.path.join(tmp, "reference")
        reference = run_ok("the run without damage", ARGS, ref_dir, timeout=300)

        run_dir = os.path.join(tmp, "damaged")
        code, events, output = damaged_run(run_dir, [30])
        fallbacks = [e for e in events if e.get("event") == "checkpoint_fallback"]
        if code != 0:
            fail(f"the job exited {code} instead of falling back:\n{output}")
        if len(fallbacks) != 1 or fallbacks[0]["step"] != 30 or \
                fallbacks[0]["resumed_step"] != 20 or not fallbacks[0]["quarantined"]:
            fail(f"expected one checkpoint_fallback from step 30 to 20, moved aside, got "
                 f"{fallbacks}:\n{output}")
        if not os.path.isdir(fallbacks[0]["quarantined"]):
            fail(f"{fallbacks[0]['quarantined']} does not exist")
        restored = [e for e in events if e.get("event") == "restored" and
                    e.get("from") == "checkpoint"]
        if not any(e.get("checkpoint_step") == 20 for e in restored):
            fail(f"no rank restored step 20: {restored}")
        ref = step_losses(reference)
        for e in events:
            if e.get("event") == "step" and relative_difference(e["loss"], ref[e["step"]]) > 1e-6:
                fail(f"step {e['step']} has loss {e['loss']}, the run without damage "
                     f"{ref[e['step']]}")
        if sorted(step_losses(events)) != list(range(1, 41)):
            fail(f"committed steps {sorted(step_losses(events))}")
        diff = checkpoint_param_diff(ref_dir, run_dir)
        if diff > 1e-6:
            fail(f"the final parameters differ from the run without damage by {diff:.2e}")
        print(f"step 30 damaged: moved to {fallbacks[0]['quarantined']}, restored step 20, "
              f"replayed; exit 0, every step's loss and the parameters ({diff:.1e}) as without "
              "damage", flush=True)

        run_dir = os.path.join(tmp, "nothing-intact")
        code, events, output = damaged_run(run_dir, [30, 20, 10])
        fallbacks = [e for e in events if e.get("event") == "checkpoint_fallback"]
        if code != 1 or "step 30 does not read back" not in output or \
                "troupe ckpt verify" not in output:
            fail(f"with no intact checkpoint, expected exit 1 naming step 30, got {code}:\n"
                 f"{output}")
        if len(fallbacks) != 1 or fallbacks[0]["resumed_step"] != -1:
            fail(f"expected one checkpoint_fallback with nothing to resume, got {fallbacks}")
        if "gave up after" in output:
            fail(f"the job retried a checkpoint known damaged:\n{output}")
        print("steps 10, 20 and 30 damaged: exit 1 naming step 30 at once", flush=True)


if __name__ == "__main__":
    main(test)
