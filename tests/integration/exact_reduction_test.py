"""--reduction exact (issue 42): the same job trained on 1, 2, 3 and 4 ranks (shared memory),
on 2 and 3 ranks with ZeRO-1,
on 3 ranks over TCP, on 4 ranks as 2 nodes (the hierarchical data plane, with the default
--reduction auto, which is exact for this job), and on 4 ranks that
lose one at step 10 and get one back from an agent that joins, gives the same loss at every step (==) and the same
final state, bit for bit (`troupe ckpt hash`: params, both AdamW moments and the step
count), with Adam's own eps 1e-8. So do --tp 2 and --pp 2 on 2 and 4 ranks (dp 1 and 2,
ZeRO-1, TCP, a lost rank) against themselves. The fast reduction on 4 ranks does not (so the comparison is not vacuous)."""

import json
import os
import subprocess
import tempfile

from harness import SMALL_MODEL, TROUPE, Job, fail, main, run_to_end, step_losses, wait_until

STEPS = 120
# 12 micro-batches of 2, so that 1, 2, 3 and 4 ranks all start evenly: 4 ranks hold 3 each
# (two pieces of the tree each), 3 ranks 4 (one piece), 2 ranks 6 (two pieces).
MODEL = SMALL_MODEL[:]
MODEL[MODEL.index("--batch") + 1] = "24"
# Validation at steps 60 and 120 over 6 batches (uneven over 4 replicas), compared too.
ARGS = MODEL + ["--d-model", "64", "--steps", str(STEPS), "--checkpoint-every", "0",
                "--metrics-port", "0", "--adam-eps", "1e-8", "--eval-every", "60",
                "--eval-batches", "6"]


def of(events, name):
    return [e for e in events if e.get("event") == name]


def state_hash(run_dir):
    out = subprocess.run([TROUPE, "ckpt", "hash", run_dir], capture_output=True, text=True,
                         timeout=60)
    if out.returncode != 0:
        fail(f"troupe ckpt hash {run_dir} exited {out.returncode}: {out.stderr}")
    line = out.stdout.strip()
    if not line.startswith(f"step {STEPS} adam_t {STEPS} params "):
        fail(f"troupe ckpt hash printed {line!r}")
    return line


def check_run(name, run_dir, events, reduction="exact"):
    """reduction: what was asked for (None: nothing, the default auto, which is exact here)."""
    losses = step_losses(events)
    if sorted(losses) != list(range(1, STEPS + 1)):
        fail(f"{name}: committed steps {sorted(losses)[:5]}... ({len(losses)} of {STEPS})")
    with open(os.path.join(run_dir, "config.json")) as f:
        recorded = json.load(f)["parallel"]["reduction"]
    if recorded != (reduction or "auto"):
        fail(f"{name}: config.json records reduction {recorded!r}, not {reduction or 'auto'!r}")
    in_effect = of(events, "training_started")[0]["layout"].get("reduction")
    if in_effect != ("fast" if reduction == "fast" else "exact"):
        fail(f"{name}: training_started says the reduction in effect is {in_effect!r}")
    # The validation losses, by step, join the step losses (negative keys: no step clashes).
    validation = {-e["step"]: e["val_loss"] for e in of(events, "validation")}
    if sorted(validation) != [-STEPS, -60]:
        fail(f"{name}: expected validation at steps 60 and {STEPS}: {of(events, 'validation')}")
    return {**losses, **validation}, state_hash(run_dir)


def train(tmp, name, world, extra=(), env=None, reduction="exact"):
    run_dir = os.path.join(tmp, name)
    asked = ["--reduction", reduction] if reduction else []
    args = ARGS + ["--world", str(world)] + asked + list(extra)
    code, events, output = run_to_end(args, timeout=300, run_dir=run_dir, env=env)
    if code != 0:
        fail(f"{name} exited {code}:\n{output}")
    return (events,) + check_run(name, run_dir, events, reduction)


def loss_and_rejoin(tmp):
    """4 ranks; rank 3 is killed at step 10 and the job goes on with 3; then an agent joins
    with one rank and the job grows back to 4 (state from its peers). Rank 0's compute is
    slowed 3x (CPU burnt after the math: the sums are untouched) so that the rejoin comes
    long before the last step."""
    name = "world4-loss-and-rejoin"
    run_dir = os.path.join(tmp, name)
    args = ARGS + ["--world", "4", "--reduction", "exact", "--max-ranks", "4",
                   "--fault", "kill:rank=3:step=10", "--fault", "slow:rank=0:factor=3:from=1"]
    with Job(args, run_dir=run_dir) as job:
        wait_until(lambda: any(g["world"] == 3 for g in of(job.events(), "generation"))
                   or job.proc.poll() is not None, 120, "the job to go on with 3 ranks")
        if job.proc.poll() is not None:
            fail(f"{name}: the job ended ({job.proc.returncode}) before it went on with 3 ranks:"
                 f"\n{job.output()}")
        with open(os.path.join(run_dir, "coordinator.addr")) as f:
            addr = f.read().strip()
        agent = subprocess.Popen([TROUPE, "agent", "--coordinator", addr, "--ranks", "1",
                                  "--join-token", os.path.join(run_dir, "join.token")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        job.extra_pids.append(agent.pid)
        code = job.wait(300)
        if code != 0:
            fail(f"{name}: exited {code}:\n{job.output()}")
        agent.wait(timeout=30)
        events = job.events()
    worlds = [g["world"] for g in of(events, "generation")]
    if worlds[:2] != [4, 3] or worlds[-1] != 4:
        fail(f"{name}: expected generations of 4, then 3, then 4 ranks: {worlds}")
    return worlds, check_run(name, run_dir, events)


def model_parallel(tmp, axis):
    """tp 2 or pp 2 at a fixed degree: 2 ranks (dp 1) and 4 ranks (dp 2, shared memory; over
    TCP with the default auto; with ZeRO-1; and losing a rank at step 10, going on as dp 1)
    give the same losses and state. Not world 1's: tp's sums split the model's products, and
    pp's stages sum the tied embedding's two halves apart."""
    base = f"{axis}2"
    flag = [f"--{axis}", "2"]
    _, want_losses, want_hash = train(tmp, f"{base}-dp1", 2, flag)
    for name, extra, env, reduction in (
            (f"{base}-dp2", [], None, "exact"),
            (f"{base}-dp2-tcp", [], dict(os.environ, TROUPE_TRANSPORT="tcp"), None),
            (f"{base}-dp2-zero1", ["--zero", "1"], None, "exact"),
            # a rank killed at step 10: the job goes on as dp 1
            (f"{base}-dp2-loses-a-rank", ["--fault", "kill:rank=3:step=10"], None, "exact")):
        events, losses, got_hash = train(tmp, name, 4, flag + extra, env=env,
                                         reduction=reduction)
        shape = of(events, "training_started")[0]["layout"]["layout"]
        if (shape.get(axis), shape.get("dp")) != (2, 2):
            fail(f"{name}: expected {axis} 2 x dp 2, training_started says {shape}")
        worlds = [g["world"] for g in of(events, "generation")]
        if "loses" in name and worlds != [4, 2]:
            fail(f"{name}: expected generations of 4 and then 2 ranks: {worlds}")
        differing = [s for s in want_losses if losses[s] != want_losses[s]]
        if differing or got_hash != want_hash:
            fail(f"{name}: {len(differing)} step losses and the final state "
                 f"({got_hash} against {want_hash}) should equal {axis} 2 x dp 1's")
        print(f"{name}: every step's loss and the final state equal {axis} 2 x dp 1's")


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-exact-") as tmp:
        _, want_losses, want_hash = train(tmp, "world1", 1)
        if want_losses[STEPS] >= want_losses[1]:
            fail("the loss did not fall; the comparison would say little")
        print(f"world 1: {want_hash}")

        def expect_world1(name, losses, got_hash):
            differing = [s for s in want_losses if losses[s] != want_losses[s]]
            if differing:
                s = differing[0]
                what = f"step {s}" if s > 0 else f"the validation at step {-s}"
                fail(f"{name}: the loss of {len(differing)} steps differs from world 1's, first "
                     f"{what}: {losses[s]!r} against {want_losses[s]!r}")
            if got_hash != want_hash:
                fail(f"{name}: the final state differs from world 1's:\n  {got_hash}\n  {want_hash}")
            print(f"{name}: every step's loss and the final state equal world 1's")

        for world in (2, 3, 4):
            events, losses, got_hash = train(tmp, f"world{world}", world)
            plan = of(events, "training_started")[0]["layout"]["replica_micro_batches"]
            if plan != [12 // world] * world:
                fail(f"world {world} should split 12 micro-batches evenly: {plan}")
            expect_world1(f"world{world}", losses, got_hash)
        for world in (2, 3):  # ZeRO-1: shards of whole norm blocks, clipped as dp clips
            expect_world1(f"world{world}-zero1",
                          *train(tmp, f"world{world}-zero1", world, ["--zero", "1"])[1:])
        expect_world1("world3-tcp", *train(tmp, "world3-tcp", 3,
                                           env=dict(os.environ, TROUPE_TRANSPORT="tcp"))[1:])
        # The default (auto) is exact for this job.
        expect_world1("world4-two-nodes", *train(tmp, "world4-two-nodes", 4, ["--nodes", "2"],
                                                 reduction=None)[1:])

        model_parallel(tmp, "tp")
        model_parallel(tmp, "pp")

        worlds, (losses, got_hash) = loss_and_rejoin(tmp)
        expect_world1("world4-loss-and-rejoin", losses, got_hash)
        print(f"loss and rejoin: generations of {worlds} ranks")

        _, _, fast_hash = train(tmp, "world4-fast", 4, reduction="fast")
        if fast_hash == want_hash:
            fail("the fast reduction on 4 ranks gave world 1's bits too: this test would not "
                 "see an exact reduction that is not")
        print(f"fast on 4 ranks differs from world 1, as expected: {fast_hash}")


if __name__ == "__main__":
    main(test)
