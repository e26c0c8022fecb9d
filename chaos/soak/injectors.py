"""One injector per fault kind. Each does the fault to the running job, undoes what is transient,
and returns a record: when it was done (unix ms), to whom, and the events that tell when the job
noticed (detected) and when it trained again (recovered). The soak's loop then asserts the job
is whole again before the next one."""

import json
import os
import signal
import time

from job_view import SoakFailure, leader_pid, now_ms, pid_alive

HEARTBEAT_MS = 1500
COORDINATOR_MS = 4000


def _kill(pid, sig):
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _wait_gone(pids, timeout, what):
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids):
        if time.monotonic() > deadline:
            raise SoakFailure(f"{what}: {[p for p in pids if pid_alive(p)]} still run "
                              f"{timeout:.0f}s after")
        time.sleep(0.01)


class Injectors:
    def __init__(self, stage, view, rng, disk_dir):
        self.stage = stage
        self.view = view
        self.rng = rng
        self.disk_dir = disk_dir
        self.damaged = []   # (step, chunk) of checkpoints the soak damaged

    def _pick_member(self):
        live = self.view.live_members()
        if not live:
            raise SoakFailure("no live member to fault")
        member = self.rng.choice(sorted(live))
        return member, live[member]

    def _members_in(self, node):
        """The live members whose process runs in `node`'s namespace."""
        pids = set(self.stage.pids_in(node))
        return {m for m, v in self.view.live_members().items() if v["pid"] in pids}

    def _lost_after(self, t0, members):
        return self.view.first(t0, "rank_lost", lambda e: e.get("member") in members)

    # ---------------------------------------------------------------- processes

    def kill(self):
        member, m = self._pick_member()
        t0 = now_ms()
        _kill(m["pid"], signal.SIGKILL)
        detected = self.view.wait(lambda: self._lost_after(t0, {member}), 30,
                                  f"rank_lost for member {member} killed (pid {m['pid']})")
        return {"target": f"member {member} pid {m['pid']}", "t0": t0, "detected": detected}

    def hang(self):
        """SIGSTOP past the heartbeat timeout: lost as hung; continued once it is lost."""
        member, m = self._pick_member()
        t0 = now_ms()
        _kill(m["pid"], signal.SIGSTOP)
        try:
            detected = self.view.wait(lambda: self._lost_after(t0, {member}),
                                      HEARTBEAT_MS / 1000 + 20,
                                      f"rank_lost for member {member} stopped (pid {m['pid']})")
        finally:
            _kill(m["pid"], signal.SIGCONT)
        return {"target": f"member {member} pid {m['pid']}", "t0": t0, "detected": detected}

    def pause(self):
        """SIGSTOP for a third of the heartbeat timeout: costs the pause, not the member."""
        member, m = self._pick_member()
        t0 = now_ms()
        _kill(m["pid"], signal.SIGSTOP)
        time.sleep(HEARTBEAT_MS / 3000)
        _kill(m["pid"], signal.SIGCONT)
        return {"target": f"member {member} pid {m['pid']} for {HEARTBEAT_MS // 3} ms",
                "t0": t0, "until": now_ms()}

    def slow(self):
        """A straggler for 2 s: stopped 40 ms of every 80."""
        member, m = self._pick_member()
        t0 = now_ms()
        end = time.monotonic() + 2.0
        while time.monotonic() < end and pid_alive(m["pid"]):
            _kill(m["pid"], signal.SIGSTOP)
            time.sleep(0.04)
            _kill(m["pid"], signal.SIGCONT)
            time.sleep(0.04)
        _kill(m["pid"], signal.SIGCONT)
        return {"target": f"member {member} pid {m['pid']} at half speed for 2 s", "t0": t0,
                "until": now_ms()}

    def node(self):
        """kill -9 of a node's agent and every worker in it; a new agent starts there."""
        node = self.rng.choice(["n1", "n2"])
        members = self._members_in(node)
        pids = self.stage.troupe_pids_in(node)
        t0 = now_ms()
        for pid in pids:
            _kill(pid, signal.SIGKILL)
        _wait_gone(pids, 10, f"node {node} killed")
        detected = self.view.wait(lambda: self._lost_after(t0, members), 30,
                                  f"rank_lost for node {node}'s members {sorted(members)}") \
            if members else None
        self.stage.restart_agent(node)
        return {"target": f"node {node} ({len(pids)} processes)", "t0": t0, "detected": detected}

    def coordinator(self):
        """kill -9 of the leading coordinator (3 in 4) or of the standby; the soak revokes a dead
        leader's lease, as the launcher does, and starts a standby at the dead one's address."""
        leader = leader_pid(self.view.leader) if self.view.leader else 0
        nodes = {self.stage.coordinator_node(leader)} if leader else set()
        kill_leader = self.rng.random() < 0.75 and None not in nodes
        if kill_leader:
            node = self.stage.coordinator_node(leader)
        else:
            node = next(n for n in self.stage.coordinators if n not in nodes)
        p = self.stage.coordinators[node]
        epoch = self.view.leader["epoch"] if self.view.leader else 0
        t0 = now_ms()
        p.kill()
        p.wait(timeout=10)
        detected = None
        if kill_leader:
            lease, value = self.stage.leader_key()
            if lease and value and f":{p.pid}" in value:
                self.stage.etcdctl(["lease", "revoke", format(lease, "x")], check=False)
            detected = self.view.wait(
                lambda: self.view.first(t0, "leader", lambda e: e["epoch"] > epoch), 60,
                f"a new leader after the leader (pid {p.pid}) was killed")
        self.stage.start_standby(node)
        role = "leader" if kill_leader else "standby"
        return {"target": f"{role} pid {p.pid} in {node}", "t0": t0, "detected": detected,
                "leader": kill_leader}

    # ---------------------------------------------------------------- network

    def cut(self):
        """A node's link down past the heartbeat timeout, then up again."""
        node = self.rng.choice(["n1", "n2"])
        members = self._members_in(node)
        t0 = now_ms()
        fault = self.stage.cluster.cut(node)
        try:
            detected = self.view.wait(lambda: self._lost_after(t0, members),
                                      HEARTBEAT_MS / 1000 + 20,
                                      f"rank_lost for node {node} cut off") if members else None
        finally:
            fault.revert()
        return {"target": f"node {node}", "t0": t0, "detected": detected, "until": now_ms(),
                "node": node}

    def delay(self):
        """50 ms +- 20 ms each way on a node's link for 2 s, over its standing delay."""
        node = self.rng.choice(["n1", "n2"])
        t0 = now_ms()
        fault = self.stage.cluster.delay(node, ms=50, jitter_ms=20,
                                         seed=self.rng.randrange(1 << 30))
        time.sleep(2.0)
        fault.revert()
        return {"target": f"node {node}: 50 ms +- 20 ms each way for 2 s", "t0": t0,
                "until": now_ms()}

    def loss(self):
        """2 % of the frames on a node's link lost for 2 s (seeded, in its forwarder)."""
        node = self.rng.choice(["n1", "n2"])
        t0 = now_ms()
        fault = self.stage.cluster.loss(node, 0.02, seed=self.rng.randrange(1 << 30))
        time.sleep(2.0)
        fault.revert()
        return {"target": f"node {node}: 2 % loss for 2 s", "t0": t0, "until": now_ms()}

    # ---------------------------------------------------------------- storage

    def disk_full(self):
        """The run directory's filesystem filled to the last byte for 1.5 s."""
        filler = os.path.join(self.disk_dir, f"soak-filler-{os.getpid()}")
        t0 = now_ms()
        written = 0
        with open(filler, "wb", buffering=0) as f:
            block = b"\0" * (1 << 20)
            while True:
                try:
                    written += f.write(block)
                except OSError:
                    break
            for size in (65536, 4096, 512, 1):
                try:
                    while True:
                        written += f.write(block[:size])
                except OSError:
                    pass
        time.sleep(1.5)
        failed = self.view.first(t0, "checkpoint_failed")
        os.unlink(filler)
        return {"target": f"run directory full ({written >> 20} MiB filler) for 1.5 s",
                "t0": t0, "until": now_ms(), "detected": failed}

    def damage(self):
        """One byte flipped in a chunk of the newest committed checkpoint that no older
        checkpoint on disk shares. Bit rot in a shared chunk damages every checkpoint holding
        it, and a rollback then may find none intact and end the job (exit 1, as
        tests/integration/checkpoint_fallback_test.py expects); the soak damages one
        checkpoint at a time so that the job has an intact one to fall back to."""
        step = self.view.latest_checkpoint_on_disk()
        if step is None:
            return {"target": "no checkpoint to damage", "t0": now_ms()}
        ckpt = os.path.join(self.view.run_dir, "checkpoints")

        def chunks_of(name):
            with open(os.path.join(ckpt, name, "manifest.json")) as f:
                return {c for p in json.load(f)["pieces"] for c in p["chunks"]}

        try:
            chunks = chunks_of(f"step-{step:08d}")
        except (OSError, ValueError, KeyError):
            return {"target": f"step {step}'s manifest went meanwhile", "t0": now_ms()}
        for name in os.listdir(ckpt):
            if name.startswith("step-") and name != f"step-{step:08d}":
                try:
                    chunks -= chunks_of(name)
                except (OSError, ValueError, KeyError):
                    pass  # collected meanwhile: it holds nothing the damage could reach
        if not chunks:
            return {"target": f"step {step} has no chunk of its own", "t0": now_ms()}
        chunk = self.rng.choice(sorted(chunks))
        path = os.path.join(ckpt, "chunks", chunk[:2], chunk)
        t0 = now_ms()
        try:
            with open(path, "r+b") as f:
                size = f.seek(0, os.SEEK_END)
                at = self.rng.randrange(max(size, 1))
                f.seek(at)
                byte = f.read(1)
                f.seek(at)
                f.write(bytes([(byte[0] if byte else 0) ^ 0x5A]))
        except OSError as e:
            return {"target": f"chunk {chunk} of step {step} went meanwhile ({e})", "t0": t0}
        self.damaged.append((step, chunk))
        return {"target": f"chunk {chunk[:12]} of step {step}, byte {at}", "t0": t0}
