"""Network-fault scenarios as data: timed faults in a JSON file, a seeded random schedule that
is the same for the same seed, and a runner that applies them to a Cluster on time.

A scenario file (examples in chaos/scenarios/):

    {
      "name": "partition-and-heal",
      "description": "node 2 cut off for 10 s",
      "nodes": 3,                       # nodes the cluster needs (n1..nN)
      "forwarder": ["n1"],              # links that need the user-space forwarder (delay)
      "seed": 7,
      "faults": [
        {"at": 5.0, "duration": 10.0, "fault": "cut", "target": "n2"},
        {"at": 0.0, "duration": null, "fault": "delay", "target": "n1",
         "params": {"ms": 50, "jitter_ms": 20, "seed": 11}}
      ]
    }

`at` is seconds from the start of the run, `duration` seconds until the fault is reverted
(null: it stays until the cluster closes or clear()). Fault names and params are those of
Cluster.fault(): cut, isolate_coordinator, split (target: side A as a list; params.side_b),
drop (direction), loss (probability, direction, seed), rate (mbit, direction),
delay (ms, jitter_ms, direction, seed), flap (period, down_for).

    s = scenario.random_schedule(seed=5, nodes=3, duration=60)   # same seed, same schedule
    s.save("my.json"); s2 = scenario.Scenario.load("my.json")    # s2 == s
    run = cluster.play(s2); run.wait(); run.log                   # what was applied, when
"""

import json
import random
import threading
import time

KINDS = ("cut", "isolate_coordinator", "split", "drop", "loss", "rate", "delay", "flap")
_PARAMS = {  # what each fault takes (required, optional)
    "cut": ((), ()),
    "isolate_coordinator": ((), ()),
    "split": ((), ("side_b",)),
    "drop": ((), ("direction",)),
    "loss": (("probability",), ("direction", "seed", "mechanism")),
    "rate": (("mbit",), ("direction",)),
    "delay": (("ms",), ("jitter_ms", "direction", "seed")),
    "flap": ((), ("period", "down_for")),
}


class ScenarioError(ValueError):
    pass


class TimedFault:
    """One fault of a scenario: what, to whom, when and for how long."""

    __slots__ = ("at", "duration", "fault", "target", "params")

    def __init__(self, at, fault, target=None, duration=None, params=None):
        self.at = float(at)
        self.duration = None if duration is None else float(duration)
        self.fault = fault
        self.target = target
        self.params = dict(params or {})

    def to_dict(self):
        d = {"at": self.at, "duration": self.duration, "fault": self.fault}
        if self.target is not None:
            d["target"] = self.target
        if self.params:
            d["params"] = self.params
        return d

    @classmethod
    def from_dict(cls, d, where="fault"):
        unknown = set(d) - {"at", "duration", "fault", "target", "params"}
        if unknown:
            raise ScenarioError(f"{where}: unknown keys {sorted(unknown)}")
        for key in ("at", "fault"):
            if key not in d:
                raise ScenarioError(f"{where}: '{key}' is required")
        return cls(d["at"], d["fault"], d.get("target"), d.get("duration"), d.get("params"))

    def validate(self, where="fault", names=None):
        if self.fault not in KINDS:
            raise ScenarioError(f"{where}: unknown fault '{self.fault}' ({', '.join(KINDS)})")
        if self.at < 0:
            raise ScenarioError(f"{where}: 'at' must be >= 0, got {self.at}")
        if self.duration is not None and self.duration <= 0:
            raise ScenarioError(f"{where}: 'duration' must be > 0 or null, got {self.duration}")
        required, optional = _PARAMS[self.fault]
        missing = [k for k in required if k not in self.params]
        if missing:
            raise ScenarioError(f"{where}: {self.fault} needs params {missing}")
        extra = set(self.params) - set(required) - set(optional)
        if extra:
            raise ScenarioError(f"{where}: {self.fault} does not take params {sorted(extra)}")
        if self.fault not in ("isolate_coordinator",) and self.target is None:
            raise ScenarioError(f"{where}: {self.fault} needs a target")
        if names is not None and self.target is not None:
            targets = self.target if isinstance(self.target, list) else [self.target]
            for t in targets + list(self.params.get("side_b", [])):
                if t not in names:
                    raise ScenarioError(f"{where}: no node '{t}' (nodes: {', '.join(names)})")

    def __eq__(self, other):
        return isinstance(other, TimedFault) and self.to_dict() == other.to_dict()

    def __repr__(self):
        return f"TimedFault({self.to_dict()})"


class Scenario:
    """A named list of timed faults, with the cluster it needs."""

    def __init__(self, faults, name="scenario", nodes=3, forwarder=(), seed=None, description=""):
        self.name = name
        self.description = description
        self.nodes = int(nodes)
        self.forwarder = list(forwarder)
        self.seed = seed
        self.faults = sorted(faults, key=lambda f: f.at)   # stable: equal times keep file order

    def names(self):
        return ["coord"] + [f"n{i}" for i in range(1, self.nodes + 1)]

    def validate(self):
        names = self.names()
        for i, f in enumerate(self.faults):
            f.validate(f"{self.name}: faults[{i}]", names)
            if f.fault == "delay" and f.target not in self.forwarder:
                # Not an error where the kernel has netem; Cluster.delay says so if it is not.
                pass
        return self

    def to_dict(self):
        d = {"name": self.name}
        if self.description:
            d["description"] = self.description
        d.update({"nodes": self.nodes, "forwarder": self.forwarder, "seed": self.seed,
                  "faults": [f.to_dict() for f in self.faults]})
        return d

    def to_json(self):
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def save(self, path):
        with open(path, "w") as f:
            f.write(self.to_json())

    @classmethod
    def from_dict(cls, d, where="scenario"):
        if not isinstance(d, dict) or not isinstance(d.get("faults"), list):
            raise ScenarioError(f"{where}: a scenario is an object with a 'faults' list")
        unknown = set(d) - {"name", "description", "nodes", "forwarder", "seed", "faults"}
        if unknown:
            raise ScenarioError(f"{where}: unknown keys {sorted(unknown)}")
        faults = [TimedFault.from_dict(f, f"{where}: faults[{i}]")
                  for i, f in enumerate(d["faults"])]
        return cls(faults, d.get("name", "scenario"), d.get("nodes", 3), d.get("forwarder", []),
                   d.get("seed"), d.get("description", "")).validate()

    @classmethod
    def loads(cls, text, where="scenario"):
        try:
            return cls.from_dict(json.loads(text), where)
        except json.JSONDecodeError as e:
            raise ScenarioError(f"{where}: not JSON: {e}")

    @classmethod
    def load(cls, path):
        with open(path) as f:
            return cls.loads(f.read(), path)

    def cluster_options(self):
        """Keyword arguments for Cluster() that this scenario needs."""
        return {"nodes": self.nodes, "forwarder": self.forwarder,
                "seed": self.seed if self.seed is not None else 0}

    def plan(self):
        """The timeline: (time, "apply" | "revert", index of the fault), in the order the
        runner follows. A pure function of the scenario."""
        events = []
        for i, f in enumerate(self.faults):
            events.append((f.at, 0, i, "apply"))
            if f.duration is not None:
                events.append((round(f.at + f.duration, 6), 1, i, "revert"))
        # At equal times reverts go before applies (a heal then a new cut), then file order.
        events.sort(key=lambda e: (e[0], -e[1], e[2]))
        return [(t, action, i) for t, _, i, action in events]

    def end(self):
        """When the last planned event happens."""
        p = self.plan()
        return p[-1][0] if p else 0.0

    def __eq__(self, other):
        return isinstance(other, Scenario) and self.to_dict() == other.to_dict()

    def __repr__(self):
        return f"Scenario({self.name}: {len(self.faults)} faults)"


def random_schedule(seed, nodes=3, duration=60.0, kinds=("cut", "split", "drop", "loss", "rate",
                                                          "flap", "isolate_coordinator"),
                    mean_gap=5.0, min_fault=1.0, max_fault=10.0, forwarder=(), name=None):
    """A random schedule of faults over `duration` seconds: gaps between starts are
    exponential with mean `mean_gap`, each fault lasts min_fault..max_fault seconds, kinds and
    targets are drawn uniformly. Everything is drawn from random.Random(seed) and rounded to
    milliseconds, so the same arguments give the same schedule (and the saved file replays it
    on any Python). "delay" is drawn only for links in `forwarder` (no netem here); loss and
    delay carry seeds of their own, drawn too."""
    rng = random.Random(seed)
    names = [f"n{i}" for i in range(1, nodes + 1)]
    kinds = list(kinds)
    if "delay" in kinds and not forwarder:
        raise ScenarioError("random_schedule: 'delay' needs forwarder links (forwarder=[...])")
    faults = []
    t = 0.0
    while True:
        t += rng.expovariate(1.0 / mean_gap)
        if t >= duration:
            break
        kind = kinds[rng.randrange(len(kinds))]
        length = round(min_fault + rng.random() * (max_fault - min_fault), 3)
        length = min(length, max(round(duration - t, 3), 0.001))
        at = round(t, 3)
        target, params = None, {}
        if kind == "isolate_coordinator":
            pass
        elif kind == "split":
            shuffled = names + ["coord"]
            rng.shuffle(shuffled)
            cut = 1 + rng.randrange(len(shuffled) - 1)
            target, params = sorted(shuffled[:cut]), {"side_b": sorted(shuffled[cut:])}
        elif kind == "delay":
            target = list(forwarder)[rng.randrange(len(forwarder))]
            ms = rng.choice([1, 5, 10, 20, 50, 100])
            params = {"ms": ms, "jitter_ms": round(ms * rng.random() * 0.5, 1),
                      "seed": rng.randrange(2 ** 31)}
        else:
            target = names[rng.randrange(len(names))]
            if kind == "drop":
                params = {"direction": rng.choice(["in", "out"])}
            elif kind == "loss":
                params = {"probability": rng.choice([0.01, 0.02, 0.05, 0.1, 0.2, 0.5]),
                          "seed": rng.randrange(2 ** 31)}
            elif kind == "rate":
                params = {"mbit": rng.choice([1, 10, 50, 100, 1000])}
            elif kind == "flap":
                period = rng.choice([0.5, 1.0, 2.0, 4.0])
                down_for = round(period * (0.2 + 0.6 * rng.random()), 3)
                params = {"period": period, "down_for": down_for}
        faults.append(TimedFault(at, kind, target, length, params))
    return Scenario(faults, name or f"random-{seed}", nodes, list(forwarder), seed,
                    f"random_schedule(seed={seed}, nodes={nodes}, duration={duration}, "
                    f"mean_gap={mean_gap})").validate()


class ScenarioRun:
    """Applies a scenario's faults to a cluster at their times, in a background thread.
    `log` records each event: planned time, actual time, action, fault, target, params and
    the mechanism used (method, and in words), or the error."""

    def __init__(self, cluster, scenario):
        self.cluster = cluster
        self.scenario = scenario
        self.log = []
        self.errors = []
        self._handles = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"scenario-{scenario.name}")
        self.t0 = None

    def start(self):
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def _run(self):
        for t, action, i in self.scenario.plan():
            if self._stop.wait(max(0.0, self.t0 + t - time.monotonic())):
                return
            f = self.scenario.faults[i]
            entry = {"planned": t, "t": round(time.monotonic() - self.t0, 4), "action": action,
                     "fault": f.fault, "target": f.target, "params": f.params}
            try:
                if action == "apply":
                    h = self.cluster.fault(f.fault, f.target, **f.params)
                    self._handles[i] = h
                    entry["method"], entry["mechanism"] = h.method, h.mechanism
                else:
                    h = self._handles.pop(i, None)
                    if h is not None:
                        h.revert()
                        entry["method"], entry["mechanism"] = h.method, h.mechanism
            except Exception as e:  # recorded; the schedule goes on
                entry["error"] = str(e)
                self.errors.append(f"{action} {f.fault} {f.target} at {t}s: {e}")
            self.log.append(entry)

    def wait(self, timeout=None):
        """Waits for the last event; True if the run finished."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, revert=True):
        """Stops the schedule; with revert, undoes what it applied and has not reverted yet."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5)
        if revert:
            for h in list(self._handles.values()):
                h.revert()
            self._handles.clear()

    def replay_key(self):
        """What must be identical between two runs of the same scenario: the planned events in
        order, with their faults, targets, params and methods (not the actual times, nor the
        device names, which differ from cluster to cluster)."""
        return [(e["planned"], e["action"], e["fault"], json.dumps(e["target"]),
                 json.dumps(e["params"], sort_keys=True), e.get("method"), e.get("error"))
                for e in self.log]
