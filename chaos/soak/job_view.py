"""What the soak knows of the job: events.jsonl read as it grows, folded into the state a fault
needs (the members alive and their pids, the generation and its world, the leader, the steps and
checkpoints committed). Nothing here changes the job."""

import json
import os
import time


class SoakFailure(RuntimeError):
    """An assertion of the soak did not hold: the message says which and what was seen."""


def now_ms():
    return int(time.time() * 1000)


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def leader_pid(event):
    """The pid of the coordinator a `leader` event names (its id is host:pid)."""
    return int(str(event.get("id", "")).rsplit(":", 1)[-1] or 0)


class JobView:
    def __init__(self, run_dir):
        self.path = os.path.join(run_dir, "events.jsonl")
        self.run_dir = run_dir
        self._offset = 0
        self._partial = b""
        self.events = []
        self.members = {}          # member -> {"pid", "node", "alive"}
        self.generation = 0
        self.world = 0
        self.state = ""
        self.leader = None         # the last leader event
        self.max_step = 0          # the highest step committed
        self.steps = []            # every step event, in order
        self.redone = 0            # step events for a step committed before
        self.checkpoints = []      # committed checkpoint steps, in order
        self.ended = None          # job_done / job_failed event
        self.torn = 0

    def poll(self):
        """Reads what was appended since the last call; returns the new events."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        new = []
        for line in lines:
            if not line.strip():
                continue
            try:
                e = json.loads(line)
            except ValueError:
                self.torn += 1          # a line a full disk cut short (taken back by the writer)
                continue
            if isinstance(e, dict):
                new.append(e)
                self._fold(e)
        self.events.extend(new)
        return new

    def _fold(self, e):
        kind = e.get("event")
        if kind == "rank_joined":
            self.members[e["member"]] = {"pid": e.get("pid"), "node": e.get("node"),
                                         "alive": True}
        elif kind == "rank_lost":
            m = self.members.get(e.get("member"))
            if m is not None:
                m["alive"] = False
        elif kind == "generation":
            self.generation = e.get("number", self.generation)
            self.world = e.get("world", self.world)
        elif kind == "state":
            self.state = e.get("to", self.state)
        elif kind == "leader":
            self.leader = e
        elif kind == "step":
            if e["step"] <= self.max_step:
                self.redone += 1
            self.max_step = max(self.max_step, e["step"])
            self.steps.append(e)
        elif kind == "checkpoint":
            self.checkpoints.append(e["step"])
        elif kind in ("job_done", "job_failed"):
            self.ended = e

    def live_members(self, node=None):
        """Members alive in the job's eyes whose process still runs (on `node` if given)."""
        return {m: v for m, v in self.members.items()
                if v["alive"] and v["pid"] and pid_alive(v["pid"]) and
                (node is None or v["node"] == node)}

    def since(self, unix_ms, kind=None):
        return [e for e in self.events if e.get("unix_ms", 0) >= unix_ms and
                (kind is None or e.get("event") == kind)]

    def first(self, unix_ms, kind, where=lambda e: True):
        for e in self.events:
            if e.get("unix_ms", 0) >= unix_ms and e.get("event") == kind and where(e):
                return e
        return None

    def latest_checkpoint_on_disk(self):
        """The step LATEST names, or None (missing, being replaced, or not a step)."""
        try:
            with open(os.path.join(self.run_dir, "checkpoints", "LATEST")) as f:
                name = f.read().strip()
            return int(name.split("-")[-1])
        except (OSError, ValueError):
            return None

    def wait(self, predicate, timeout, what, check=None):
        """Polls the events until predicate() holds; SoakFailure naming `what` after `timeout`
        seconds. `check`, called each round, raises on what must never happen meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            if check:
                check()
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise SoakFailure(f"{what}: not within {timeout:.0f}s (generation {self.generation},"
                                  f" world {self.world}, state {self.state}, last step "
                                  f"{self.max_step})")
            time.sleep(0.02)
