"""Resume exactness: 20 steps uninterrupted, against 10 steps (checkpoint, stop) then
--resume to 20; steps 11-20 must match within 1e-6 relative. The same checkpoint resumed
on 4 ranks instead of 2 (the flat state re-sliced) must match within 1e-5 (the DP bound)."""

import os
import shutil
import tempfile

from harness import SMALL_MODEL, fail, last_job, main, relative_difference, run_to_end, step_losses

COMMON = SMALL_MODEL + ["--world", "2", "--steps", "20", "--checkpoint-every", "10", "--metrics-port", "0"]


def test():
    code, events, output = run_to_end(COMMON, timeout=300)
    if code != 0:
        fail(f"uninterrupted run exited {code}:\n{output}")
    reference = step_losses(events)

    with tempfile.TemporaryDirectory(prefix="troupe-resume-") as tmp:
        run_dir = os.path.join(tmp, "run")
        code, events, output = run_to_end(COMMON + ["--exit-after-step", "10"], timeout=300, run_dir=run_dir)
        if code != 0:
            fail(f"first half exited {code}:\n{output}")
        first = step_losses(events)
        if max(first) != 10:
            fail(f"first half should stop at step 10, stopped at {max(first)}")
        if not any(e.get("event") == "checkpoint" and e.get("step") == 10 for e in events):
            fail("no committed checkpoint at step 10")
        shutil.copytree(run_dir, run_dir + "-w4")
        code, events4, output = run_to_end(COMMON + ["--resume", "--world", "4"], timeout=300,
                                           run_dir=run_dir + "-w4")
        if code != 0:
            fail(f"resume on 4 ranks exited {code}:\n{output}")
        resumed4 = step_losses(last_job(events4))
        code, events, output = run_to_end(COMMON + ["--resume"], timeout=300, run_dir=run_dir)
        if code != 0:
            fail(f"resumed run exited {code}:\n{output}")
        resumed = step_losses(last_job(events))
    if sorted(resumed) != list(range(11, 21)):
        fail(f"resumed run should train steps 11..20, trained {sorted(resumed)}")
    for s in range(1, 11):
        if relative_difference(reference[s], first[s]) > 1e-6:
            fail(f"step {s} before the stop differs: {reference[s]} vs {first[s]}")
    worst = max(relative_difference(reference[s], resumed[s]) for s in resumed)
    print(f"worst relative difference over resumed steps 11-20: {worst:.2e}")
    if worst > 1e-6:
        for s in sorted(resumed):
            print(f"  step {s}: uninterrupted {reference[s]:.9f} resumed {resumed[s]:.9f}")
        fail(f"resumed steps differ by {worst:.2e} (> 1e-6)")
    if sorted(resumed4) != list(range(11, 21)):
        fail(f"resume on 4 ranks should train steps 11..20, trained {sorted(resumed4)}")
    worst4 = max(relative_difference(reference[s], resumed4[s]) for s in resumed4)
    print(f"worst relative difference resuming a 2-rank checkpoint on 4 ranks: {worst4:.2e}")
    if worst4 > 1e-5:
        fail(f"resume on 4 ranks differs by {worst4:.2e} (> 1e-5)")


if __name__ == "__main__":
    main(test)
