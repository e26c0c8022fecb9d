"""Recovery in place: a rank killed with kill -9 (or frozen with SIGSTOP, or its whole node lost) mid-run
is replaced while the survivors keep their processes, and the job trains the same model as an
uninterrupted run with the same seed: the loss at every committed step and the final
parameters agree within 1e-4 relative. Covered: data parallel (shrink 4 -> 3, every state
kept in place), a node of two ranks lost at once, a spare taking a lost rank's place, a pipeline stage with a replica (its replica's stages carry on), a pipeline
stage without one and a ZeRO-1 shard (both from the last checkpoint, then an exact replay),
and a hung rank caught by heartbeats (not by the step timeout)."""

import os

from harness import (SMALL_MODEL, checkpoint_param_diff, fail, main, pid_alive, relative_difference, run_ok,
                     step_losses, tempfile)

STEPS = 24
BASE = SMALL_MODEL + ["--steps", str(STEPS), "--checkpoint-every", "5", "--metrics-port", "0",
                      "--step-timeout-ms", "20000"]


def of(events, name):
    return [e for e in events if e.get("event") == name]


def compare(name, reference, recovered, ref_dir, rec_dir):
    ref, rec = step_losses(reference), step_losses(recovered)
    if sorted(rec) != list(range(1, STEPS + 1)):
        fail(f"{name}: committed steps {sorted(rec)}")
    worst = max(relative_difference(ref[s], rec[s]) for s in ref)
    if worst > 1e-4:
        fail(f"{name}: losses differ from the uninterrupted run by {worst:.2e} relative")
    diff = checkpoint_param_diff(ref_dir, rec_dir)
    if diff > 1e-4:
        fail(f"{name}: final parameters differ by {diff:.2e} relative")
    print(f"{name}: exact (loss {worst:.1e}, parameters {diff:.1e})")


def scenario(tmp, name, layout, fault, expect_world, expect_source, extra=(), may_also=()):
    ref_dir = os.path.join(tmp, name + "-ref")
    rec_dir = os.path.join(tmp, name + "-rec")
    reference = run_ok(name + " (uninterrupted)", BASE + layout + list(extra), ref_dir)
    recovered = run_ok(name + " (with a fault)", BASE + layout + list(extra) + ["--fault", fault], rec_dir)
    faults = of(recovered, "fault")
    if not faults:
        fail(f"{name}: no fault event")
    lost = of(recovered, "rank_lost")
    if not lost:
        fail(f"{name}: no rank_lost event")
    generations = of(recovered, "generation")
    last = generations[-1]
    if len(generations) < 2 or last["world"] != expect_world:
        fail(f"{name}: expected a generation of {expect_world} ranks, got {[g['world'] for g in generations]}")
    sources = {e["from"] for e in of(recovered, "restored") if e["generation"] == last["number"]}
    expected = set(expect_source.split("+"))
    if expected == {"checkpoint"} and sources == {"init"}:
        # The writer is asynchronous: on a loaded machine no checkpoint may have committed
        # before the kill, and then a fresh start plus an exact replay is the right answer.
        first_loss = recovered.index(lost[0])
        if any(e.get("event") == "checkpoint" for e in recovered[:first_loss]):
            fail(f"{name}: a checkpoint had committed before the fault, yet state came from init")
        expected = {"init"}
    if not expected <= sources <= expected | set(may_also):
        fail(f"{name}: state came from {sources}, expected {expect_source}")
    # Survivors keep their processes: nobody joined after the start, and every member that was
    # not hit is alive until the job ends (it reported no exit).
    joined = of(recovered, "rank_joined")
    if len(joined) != len({e["member"] for e in joined}):
        fail(f"{name}: a member joined twice (a survivor was restarted)")
    victims = set(faults[0]["pids"])
    # (A member that ends cleanly after the job's last stop is no loss: the agent may see it
    # exit before it hears the stop itself.)
    exited = {e["pid"] for e in of(recovered, "worker_exited") if e["signal"] or e["exit_code"]}
    if not exited <= victims:
        fail(f"{name}: processes {exited - victims} exited besides the victim")
    # At most the step in flight is recomputed when live ranks hold every state.
    commits = [e["step"] for e in of(recovered, "step")]
    if "checkpoint" not in expect_source and len(commits) != len(set(commits)):
        fail(f"{name}: steps committed twice: {sorted(s for s in set(commits) if commits.count(s) > 1)}")
    if expect_source == "checkpoint" and last["start_step"] % 5 != 0:
        fail(f"{name}: replay should start at a checkpoint, started at {last['start_step']}")
    compare(name, reference, recovered, ref_dir, rec_dir)
    return recovered


def hang(tmp):
    """A SIGSTOPped rank is caught by its missing heartbeats within the heartbeat timeout,
    long before the step timeout; woken 6 s later it learns it was evicted and exits."""
    name = "hang"
    ref_dir, rec_dir = os.path.join(tmp, "hang-ref"), os.path.join(tmp, "hang-rec")
    args = BASE + ["--world", "2", "--heartbeat-timeout-ms", "1000", "--steps", str(STEPS)]
    reference = run_ok(name + " (uninterrupted)", args, ref_dir)
    recovered = run_ok(name + " (SIGSTOP)", args + ["--fault", "stop:rank=1:step=10:for=6s"], rec_dir)
    stop = of(recovered, "fault")[0]
    lost = of(recovered, "rank_lost")
    if not lost or lost[0]["cause"] != "hang":
        fail(f"hang: expected a rank lost to a hang, got {lost}")
    detect_s = (lost[0]["unix_ms"] - stop["unix_ms"]) / 1000
    if not 0.5 <= detect_s <= 3.0:
        fail(f"hang: detected after {detect_s:.2f}s, expected within the 1 s heartbeat timeout (+ slack)")
    print(f"hang: detected {detect_s:.2f}s after SIGSTOP")
    compare(name, reference, recovered, ref_dir, rec_dir)
    return stop["pids"][0]


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-elastic-") as tmp:
        scenario(tmp, "dp4-kill", ["--world", "4"], "kill:rank=2:step=10", 3, "self")
        # Node loss: two agents with two ranks each; one agent and its workers die together.
        scenario(tmp, "node-loss", ["--world", "4", "--nodes", "2"], "kill:node=1:step=10", 2, "self")
        # A spare takes the lost rank's place: same layout, its state sent by a peer.
        scenario(tmp, "spare", ["--world", "2", "--spares", "1"], "kill:rank=1:step=10", 2, "self+peer")
        scenario(tmp, "dp2xpp2-kill", ["--world", "4", "--pp", "2", "--micro-batches", "4"], "kill:rank=3:step=10",
                 2, "self")
        # dp4xpp2 loses a rank: dp3xpp2 with replicas running 3, 3 and 2 micro-batches, a spare.
        # Survivors keep their own state; one that the abort caught in the middle of its
        # update of step 9 (a loaded machine; seen once in CI) takes it from a replica instead.
        rec = scenario(tmp, "dp4xpp2-uneven", ["--world", "8", "--pp", "2", "--micro-batches", "8"],
                       "kill:rank=5:step=10", 6, "self", may_also=("peer",))
        final = of(rec, "generation")[-1]["plan"]["replica_micro_batches"]
        if sorted(final) != [2, 3, 3]:
            fail(f"dp4xpp2-uneven: expected replicas of 3, 3 and 2 micro-batches, got {final}")
        scenario(tmp, "pp2-kill", ["--world", "2", "--pp", "2", "--micro-batches", "4"], "kill:rank=1:step=12", 1,
                 "checkpoint")
        scenario(tmp, "dp2-zero1-kill", ["--world", "2", "--zero", "1"], "kill:rank=1:step=12", 1, "checkpoint")
        woken = hang(tmp)
        if pid_alive(woken):
            fail(f"the evicted process {woken} is still running after the job ended")


if __name__ == "__main__":
    main(test)
