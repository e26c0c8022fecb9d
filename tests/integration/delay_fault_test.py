"""The `delay` fault of the data plane (chaos/faulty_communicator.hpp, TROUPE_CHAOS_RANK<r>)
really delays a real job: once rank 1's collectives sleep DELAY_MS each, every step takes at
least that long (the step cannot commit before rank 1's all-reduce), the time shows as
communication, not compute, and the job still finishes (a delay is not a failure)."""

import os
import statistics

from harness import SMALL_MODEL, Job, fail, main

DELAY_MS = 200
FROM_CALL = 8  # rank 1's 8th collective: a few steps into training (one all-reduce a step)
STEPS = 20
# --reduction fast: one collective a step (the exact sum makes two).
ARGS = SMALL_MODEL + ["--world", "2", "--steps", str(STEPS), "--checkpoint-every", "0",
                      "--metrics-port", "0", "--reduction", "fast"]


def test():
    env = dict(os.environ, TROUPE_CHAOS_RANK1=f"delay@{FROM_CALL},every,delay:{DELAY_MS}")
    with Job(ARGS, env=env) as job:
        code = job.wait(120)
        if code != 0:
            fail(f"a delayed job should still finish, exited {code}:\n{job.output()}")
        steps = sorted((e for e in job.events() if e.get("event") == "step"), key=lambda e: e["step"])
    if [e["step"] for e in steps] != list(range(1, STEPS + 1)):
        fail(f"steps committed: {[e['step'] for e in steps]}")
    delay = DELAY_MS / 1000
    slow = [e["step"] for e in steps if e["step_s"] >= delay]
    if not slow:
        fail(f"no step took the {DELAY_MS} ms delay: {[round(e['step_s'], 3) for e in steps]}")
    # From the first delayed step on, every step waits for rank 1's delayed collectives.
    first = slow[0]
    delayed = [e for e in steps if e["step"] >= first]
    healthy = [e for e in steps if e["step"] < first]
    if len(healthy) < 3 or len(delayed) < 10:
        fail(f"the delay began at step {first}: expected it a few steps into the run")
    short = [e["step"] for e in delayed if e["step_s"] < delay]
    if short:
        fail(f"steps {short} after the delay began took less than {DELAY_MS} ms")
    before = statistics.median(e["step_s"] for e in healthy)
    after = statistics.median(e["step_s"] for e in delayed)
    comm = statistics.median(e["comm_s"] for e in delayed)
    compute = statistics.median(e["compute_s"] for e in delayed)
    if comm < delay / 2 or compute > comm:
        fail(f"the delay should show as communication: comm {comm:.3f} s, compute {compute:.3f} s")
    print(f"steps 1..{first - 1}: median {before * 1e3:.1f} ms; steps {first}..{STEPS}: every one "
          f">= {DELAY_MS} ms, median {after * 1e3:.0f} ms (comm {comm * 1e3:.0f} ms, compute "
          f"{compute * 1e3:.1f} ms)")


if __name__ == "__main__":
    main(test)
