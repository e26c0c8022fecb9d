#!/usr/bin/env python3
"""troupe's soak: one bounded job across network namespaces under a seeded random schedule of
faults of every kind the project can inject, one after another, with an assertion after each;
at the end the final parameters and every committed step's loss against an undisturbed run of
the same steps, and a table of what it cost.

    chaos/soak/soak.py --faults 1000 --seed 1 [--out DIR]        # as root

Kinds: kill (kill -9 of a worker), hang (SIGSTOP past the heartbeat timeout), pause (SIGSTOP
under it), slow (a worker stopped half the time for 2 s), node (kill -9 of an agent and its
workers; a new agent starts), coordinator (kill -9 of the leading or the standby coordinator;
a new standby starts at its address), cut (a node's link down until its ranks are lost), delay
and loss (on a node's link for 2 s), disk_full (the run directory's filesystem filled for
1.5 s), damage (a byte flipped in a chunk of the newest checkpoint that no older one shares)
and diverge (poisoned batches: `--fault diverge:step=S` at seeded data positions; the job rolls back and skips them).

After each fault: the job has not failed, LATEST names no older step than before (unless a
damaged checkpoint was passed over), the job commits a step past every step committed before
the fault, and it comes back to 4 ranks and two coordinators before the next fault. At the end
(SIGTERM to the leader: the job commits a checkpoint and ends with exit 75) a run of the same
job on one host without faults (but the same poisoned batches) stops at the same step: every
step the soak committed has that run's loss, and the final parameters are the same.

Writes OUT/soak.md (the table), OUT/soak.json (every fault) and OUT/events.jsonl. Exit 0: every
assertion held; 1: one did not (the message names it, the logs are in OUT/logs); 2: a bad
option; 77: it cannot run here (not root, no network namespaces, no etcd)."""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from injectors import COORDINATOR_MS, HEARTBEAT_MS, Injectors  # noqa: E402
from job_view import JobView, SoakFailure, leader_pid, now_ms, pid_alive  # noqa: E402
import stage as stage_mod  # noqa: E402
import table  # noqa: E402

REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
KINDS = ("kill", "hang", "pause", "slow", "node", "coordinator", "cut", "delay", "loss",
         "disk_full", "damage")
MEMBERSHIP = ("kill", "hang", "node", "cut")
WORLD = 4
SMALL_MODEL = ["--layers", "2", "--heads", "2", "--d-model", "32", "--context", "32",
               "--batch", "8", "--micro-batch", "2", "--eval-every", "0", "--no-progress"]


def training_args(diverge_steps):
    # --reduction exact, with Adam's own eps 1e-8: the soak's job trains on 2, 3 and 4 ranks in
    # turn, and the exact reduction sums every step in one order whatever the world, so the
    # soak and the undisturbed run must agree bit for bit. (With the fast reduction two runs
    # that only differ in their world part by 9 % in 400 steps: docs/benchmarks/soak.md.)
    args = SMALL_MODEL + ["--world", str(WORLD), "--nodes", "2", "--steps", "1000000",
                          "--checkpoint-every", "20", "--on-divergence", "rollback",
                          "--max-rollbacks", "1000", "--reduction", "exact"]
    for s in diverge_steps:
        args += ["--fault", f"diverge:step={s}"]
    return args


def job_args(diverge_steps):
    return training_args(diverge_steps) + [
        "--max-ranks", str(WORLD), "--min-ranks", "1", "--max-restarts", "1000000",
        "--heartbeat-timeout-ms", str(HEARTBEAT_MS), "--coordinator-timeout-ms",
        str(COORDINATOR_MS), "--step-timeout-ms", "30000", "--etcd-timeout-ms", "10000",
        "--metrics-port", "0"]


def can_run():
    if os.geteuid() != 0:
        return "the soak needs root (network namespaces, a tmpfs)"
    sys.path.insert(0, os.path.join(REPO, "chaos", "netns"))
    import cluster as netns
    ok, why = netns.can_run()
    if not ok:
        return why
    if not os.access(stage_mod.ETCD, os.X_OK):
        return "etcd is not installed (apt-get install etcd-server)"
    return None


class Soak:
    def __init__(self, opts, out, troupe):
        self.opts = opts
        self.out = out
        self.troupe = troupe
        self.rng = random.Random(opts.seed)
        self.disk = os.path.join(out, "disk")
        self.run_dir = os.path.join(self.disk, "soak")
        self.records = []
        self.latest = 0
        self.fallbacks_seen = 0

    # ---------------------------------------------------------------- the checks

    def invariants(self):
        v = self.view
        if v.ended is not None:
            raise SoakFailure(f"the job ended during the soak: {json.dumps(v.ended)}")
        if not any(p.poll() is None for p in self.stage.coordinators.values()):
            raise SoakFailure("no coordinator runs")
        latest = v.latest_checkpoint_on_disk()
        fallbacks = len([e for e in v.events if e.get("event") == "checkpoint_fallback"])
        if latest is not None:
            # The fallback's event may be lost to a full disk (the disk-full fault can meet a
            # scheduled divergence's rollback); the quarantined checkpoint is the evidence then.
            if latest < self.latest and fallbacks == self.fallbacks_seen and \
                    not self.quarantined(self.latest):
                raise SoakFailure(f"LATEST went back from step {self.latest} to {latest} with no "
                                  "damaged checkpoint passed over")
            self.latest, self.fallbacks_seen = latest, fallbacks

    def quarantined(self, step):
        """Whether checkpoint `step` was moved aside as damaged (checkpoints/damaged/)."""
        damaged = os.path.join(self.run_dir, "checkpoints", "damaged")
        try:
            return any(name.startswith("step-%08d" % step) for name in os.listdir(damaged))
        except OSError:
            return False

    def healthy(self):
        v = self.view
        if v.world != WORLD or v.state != "training" or v.leader is None:
            return False
        if len(v.live_members()) != WORLD:
            return False
        if not all(p.poll() is None for p in self.stage.coordinators.values()):
            return False
        if not pid_alive(leader_pid(v.leader)):
            return False
        gen = [e for e in v.events if e.get("event") == "generation"]
        return bool(v.steps) and bool(gen) and v.steps[-1]["unix_ms"] >= gen[-1]["unix_ms"] \
            and v.steps[-1]["generation"] == v.generation

    def restore_agents(self):
        """A node fenced after a cut ends its agent: a new one starts there (the scheduler's
        part). A node whose agent still runs is left to its agent."""
        for node in stage_mod.AGENT_NODES:
            agent = self.stage.job.agent_procs.get(node)
            if agent is not None and agent.poll() is not None and \
                    not self.stage.troupe_pids_in(node):
                self.stage.restart_agent(node)

    def wait_whole(self, timeout=120):
        def whole():
            self.restore_agents()
            return self.healthy()
        self.view.wait(whole, timeout, "back to 4 ranks and 2 coordinators, training",
                       self.invariants)
        return now_ms()

    # ---------------------------------------------------------------- the run

    def run(self):
        diverge = self.diverge_steps()
        os.makedirs(self.disk, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.opts.disk_mib}m", "tmpfs",
                        self.disk], check=True)
        try:
            with stage_mod.Stage(self.troupe, self.out, self.run_dir, job_args(diverge),
                                 self.opts.link_delay_ms) as st:
                self.stage = st
                self.view = JobView(self.run_dir)
                self.inject = Injectors(st, self.view, self.rng, self.disk)
                try:
                    self.loop()
                    end_step = self.finish()
                except SoakFailure as e:
                    raise SoakFailure(f"{e}\n{st.logs_tail()}") from None
            self.compare(diverge, end_step)
        finally:
            try:
                shutil.copy(os.path.join(self.run_dir, "events.jsonl"), self.out)
            except OSError:
                pass
            subprocess.run(["umount", "-l", self.disk], check=False)

    def diverge_steps(self):
        steps, s = [], 0
        while s < 900_000 and len(steps) < 1000:
            s += self.rng.randint(self.opts.diverge_every // 2, self.opts.diverge_every * 3 // 2)
            steps.append(s)
        return steps

    def loop(self):
        v, opts = self.view, self.opts
        kinds = opts.kinds.split(",")
        self.wait_whole(180)
        started = time.monotonic()
        print(f"soak: the job trains on 4 ranks (generation {v.generation}); {opts.faults} "
              f"faults, seed {opts.seed}", flush=True)
        order = []
        while self.count() < opts.faults:
            if not order:  # every kind once per round, in a seeded order
                order = list(kinds)
                self.rng.shuffle(order)
            kind = order.pop()
            before = {"max_step": v.max_step, "generation": v.generation, "redone": v.redone,
                      "diverged": len(self.diverged())}
            record = getattr(self.inject, kind)()
            record["kind"] = kind
            end = record.get("until", record["t0"])
            # The job trains past every step it had committed before the fault.
            v.wait(lambda: v.first(end, "step", lambda e: e["step"] > before["max_step"]), 120,
                   f"{kind} ({record['target']}): a step past {before['max_step']} committed",
                   self.invariants)
            record["full"] = self.wait_whole()
            self.measure(record, before)
            self.records.append(record)
            for e in self.diverged()[before["diverged"]:]:
                print(f"[{self.count()}/{opts.faults}] diverge     step {e['step']} "
                      f"(generation {e['generation']}): rolled back, its batch skipped",
                      flush=True)
            self.report(record, started)

    def diverged(self):
        return [e for e in self.view.events if e.get("event") == "diverged"]

    def count(self):
        return len(self.records) + len(self.diverged())

    def measure(self, r, before):
        v = self.view
        t0 = r["t0"]
        if r.get("detected"):
            r["detect_ms"] = r["detected"]["unix_ms"] - t0
        if r["kind"] in MEMBERSHIP:
            first = v.first(t0, "step", lambda e: e["generation"] > before["generation"])
        elif r["kind"] == "coordinator" and r.get("leader") and r.get("detected"):
            first = v.first(r["detected"]["unix_ms"], "step")
        else:
            first = v.first(r.get("until", t0), "step")
        if first:
            r["recover_ms"] = first["unix_ms"] - t0
        r["full_ms"] = r["full"] - t0
        r["redone"] = v.redone - before["redone"]
        r.pop("detected", None)

    def report(self, r, started):
        parts = [f"[{self.count()}/{self.opts.faults}] {r['kind']:<11} {r['target']}"]
        for key, word in (("detect_ms", "detected"), ("recover_ms", "trained again"),
                          ("full_ms", "whole")):
            if key in r:
                parts.append(f"{word} {r[key] / 1000:.2f}s")
        parts.append(f"step {self.view.max_step}, {time.monotonic() - started:.0f}s in")
        print(", ".join(parts), flush=True)

    def finish(self):
        """SIGTERM to the leader: it commits the next step with a checkpoint and ends (75)."""
        v = self.view
        leader = leader_pid(v.leader)
        node = self.stage.coordinator_node(leader)
        p = self.stage.coordinators[node]
        p.send_signal(signal.SIGTERM)
        try:
            code = p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise SoakFailure("the leader did not end within 120 s of SIGTERM")
        v.poll()
        if code != 75 or v.ended is None or v.ended.get("exit_code") != 75:
            raise SoakFailure(f"SIGTERM: the leader exited {code}, last event "
                              f"{json.dumps(v.ended)} (expected exit 75, the scheduler's stop)")
        for other in self.stage.coordinators.values():
            if other.poll() is None:
                other.send_signal(signal.SIGTERM)
        for proc in list(self.stage.coordinators.values()) + \
                list(self.stage.job.agent_procs.values()):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                raise SoakFailure(f"process {proc.pid} still runs 30 s after the job ended")
        end = v.latest_checkpoint_on_disk()
        print(f"soak: the job ended with exit 75 at step {end} after {self.count()} faults",
              flush=True)
        return end

    # ---------------------------------------------------------------- against the reference

    def compare(self, diverge, end_step):
        ref_dir = os.path.join(self.out, "reference")
        argv = [self.troupe, "run"] + training_args(diverge) + [
            "--exit-after-step", str(end_step), "--run-dir", ref_dir, "--metrics-port", "0"]
        print(f"soak: the undisturbed run of steps 1..{end_step} (same poisoned batches)",
              flush=True)
        with open(os.path.join(self.out, "logs", "reference.log"), "w") as log:
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
            try:
                code = p.wait(timeout=600 + end_step * 0.05)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                raise SoakFailure("the undisturbed run did not end in time")
        if code != 0:
            raise SoakFailure(f"the undisturbed run exited {code}; see {self.out}/logs")
        ref = JobView(ref_dir)
        ref.poll()
        ref_loss = {e["step"]: e["loss"] for e in ref.steps}
        worst, worst_step, unequal = 0.0, 0, []
        # Steps past the step the job stopped at were committed before a rollback that came
        # after them (a poisoned batch): what the job leaves is the checkpoint of end_step.
        after = sorted({e["step"] for e in self.view.steps if e["step"] > end_step})
        if after:
            print(f"soak: steps {after} were committed and then rolled back before the stop at "
                  f"step {end_step}; not compared", flush=True)
        for e in self.view.steps:
            if e["step"] > end_step:
                continue
            if e["step"] not in ref_loss:
                raise SoakFailure(f"step {e['step']} was committed by the soak, not by the "
                                  "undisturbed run")
            if e["loss"] != ref_loss[e["step"]]:
                unequal.append(e["step"])
            d = abs(e["loss"] - ref_loss[e["step"]]) / max(abs(ref_loss[e["step"]]), 1e-30)
            if d > worst:
                worst, worst_step = d, e["step"]
        missing = sorted(set(ref_loss) - {e["step"] for e in self.view.steps})
        r = subprocess.run([self.opts.checkpoint_diff, self.run_dir, ref_dir],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SoakFailure(f"checkpoint_diff failed: {r.stderr.strip()}")
        params = float(r.stdout.split()[1])
        hashes = [self.state_hash(d) for d in (self.run_dir, ref_dir)]
        self.result = {"end_step": end_step, "worst_loss_difference": worst,
                       "worst_loss_step": worst_step, "parameter_difference": params,
                       "unequal_loss_steps": len(unequal), "same_state_bits": hashes[0] == hashes[1],
                       "steps_without_event": len(missing)}
        if unequal:
            raise SoakFailure(f"{len(unequal)} committed steps' losses differ from the undisturbed "
                              f"run's (--reduction exact: they must be equal), first step "
                              f"{unequal[0]}; the worst by {worst:.2e} (relative, step "
                              f"{worst_step})")
        if hashes[0] != hashes[1]:
            raise SoakFailure(f"the final state differs from the undisturbed run's (parameters by "
                              f"{params:.2e}, relative L2):\n  soak       {hashes[0]}\n  "
                              f"undisturbed {hashes[1]}")
        print(f"soak: every committed step's loss is the undisturbed run's, bit for bit, and so is "
              f"the final state ({hashes[0]})", flush=True)

    def state_hash(self, run_dir):
        r = subprocess.run([self.troupe, "ckpt", "hash", run_dir], capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            raise SoakFailure(f"troupe ckpt hash {run_dir} failed: {r.stderr.strip()}")
        return r.stdout.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--faults", type=int, default=50, help="how many (default 50)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="", help="where to write (default: a new temporary dir)")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help="comma-separated external kinds (diverge comes from --diverge-every)")
    ap.add_argument("--diverge-every", type=int, default=120,
                    help="mean data positions between poisoned batches (default 120)")
    ap.add_argument("--link-delay-ms", type=int, default=10,
                    help="the nodes' standing link delay each way (default 10)")
    ap.add_argument("--disk-mib", type=int, default=256, help="the run directory's tmpfs size")
    ap.add_argument("--troupe", default=os.environ.get("TROUPE_BIN",
                                                       os.path.join(REPO, "build/cli/troupe")))
    ap.add_argument("--checkpoint-diff", default=os.environ.get(
        "CHECKPOINT_DIFF", os.path.join(REPO, "build/tests/tools/checkpoint_diff")))
    try:
        opts = ap.parse_args()
    except SystemExit as e:
        return 2 if e.code else 0
    bad = [k for k in opts.kinds.split(",") if k not in KINDS]
    if bad or opts.faults < 1 or opts.diverge_every < 10 or opts.disk_mib < 64:
        print(f"soak: --kinds takes {','.join(KINDS)} (got {bad}); --faults >= 1, "
              "--diverge-every >= 10, --disk-mib >= 64", file=sys.stderr)
        return 2
    why = can_run()
    if why:
        print(f"SKIP: {why}", flush=True)
        return 77
    out = opts.out or tempfile.mkdtemp(prefix="troupe-soak-")
    os.makedirs(out, exist_ok=True)
    soak = Soak(opts, out, os.path.abspath(opts.troupe))
    try:
        soak.run()
    except SoakFailure as e:
        print(f"FAIL: {e}", flush=True)
        table.write(out, soak, failed=str(e).split("\n")[0])
        print(f"soak: the table, the events and every process's log are in {out}", flush=True)
        return 1
    table.write(out, soak)
    with open(os.path.join(out, "soak.md")) as f:
        print(f.read(), flush=True)
    if opts.out:
        print(f"soak: written to {out}/soak.md, soak.json, events.jsonl and logs/", flush=True)
    else:
        shutil.rmtree(out, ignore_errors=True)   # a passing run of a temporary directory
    return 0


if __name__ == "__main__":
    sys.exit(main())
