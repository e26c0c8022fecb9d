"""Resume on a different world, layout and node count: a checkpoint written by one layout
(each rank writing only its own boxes) is resumed by another (each rank reading only the
chunks of its new boxes), and the next 10 steps match an uninterrupted run within 1e-4
relative, losses at every step and the final parameters. Five saving layouts, five others
resuming them; the resumed job names the step and layout it restored from."""

import os

from harness import (SMALL_MODEL, checkpoint_param_diff, fail, last_job, main, relative_difference,
                     run_ok, step_losses, tempfile)

COMMON = SMALL_MODEL + ["--steps", "20", "--checkpoint-every", "10", "--metrics-port", "0"]

# (name, saving layout, resuming layout). A resume keeps the run's own layout settings
# (config.json) unless they are given: the resuming layouts say every size they change.
PAIRS = [
    ("dp2 -> tp2", ["--world", "2"], ["--world", "2", "--tp", "2"]),
    ("dp2+zero1 -> dp4 on 2 nodes", ["--world", "2", "--zero", "1"],
     ["--world", "4", "--nodes", "2", "--zero", "0"]),
    ("tp2 -> dp2xpp2", ["--world", "2", "--tp", "2"], ["--world", "4", "--tp", "1", "--pp", "2"]),
    ("pp2 -> dp1", ["--world", "2", "--pp", "2"], ["--world", "1", "--pp", "1"]),
    ("dp4 on 2 nodes -> tp2xpp2+zero1", ["--world", "4", "--nodes", "2"],
     ["--world", "4", "--tp", "2", "--pp", "2", "--zero", "1"]),
]


def of(events, name):
    return [e for e in events if e.get("event") == name]


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-reshard-") as tmp:
        ref_dir = os.path.join(tmp, "reference")
        reference = step_losses(run_ok("uninterrupted", COMMON + ["--world", "2"], ref_dir))
        for name, save, resume in PAIRS:
            run_dir = os.path.join(tmp, name.replace(" ", "_").replace(">", ""))
            first = run_ok(name + " (save)", COMMON + save + ["--exit-after-step", "10"], run_dir)
            if not any(e.get("event") == "checkpoint" and e["step"] == 10 for e in first):
                fail(f"{name}: no checkpoint at step 10")
            events = last_job(run_ok(name + " (resume)", COMMON + resume + ["--resume"], run_dir))
            resumed = of(events, "resume")
            if not resumed or resumed[0]["step"] != 10:
                fail(f"{name}: the resumed job does not say it restored step 10: {resumed}")
            restored = [e for e in of(events, "restored") if e["from"] == "checkpoint"]
            if not restored or any(e["bytes"] <= 0 for e in restored):
                fail(f"{name}: ranks report no bytes read from the checkpoint: {restored}")
            losses = step_losses(events)
            if sorted(losses) != list(range(11, 21)):
                fail(f"{name}: resumed steps {sorted(losses)}")
            worst = max(relative_difference(reference[s], losses[s]) for s in losses)
            diff = checkpoint_param_diff(ref_dir, run_dir)
            print(f"{name}: written by {resumed[0]['written_by']}; loss {worst:.1e}, "
                  f"parameters {diff:.1e} from the uninterrupted run")
            if worst > 1e-4 or diff > 1e-4:
                fail(f"{name}: differs from the uninterrupted run (loss {worst:.2e}, "
                     f"parameters {diff:.2e})")


if __name__ == "__main__":
    main(test)
