"""Network faults by name, applied to a Cluster (cluster.py): FaultInjector holds the methods
that make them, and each application is a Fault that `revert()` undoes.

Which mechanism each fault uses (each application is logged with it; see README.md):

    cut, isolate_coordinator, flap   the root-namespace end of the link set down (veth/TAP)
    split                            cls_bpf (classic BPF) on each bridge port's egress that
                                     matches the other side's source MACs -> mirred to a
                                     downed ifb (no gact here to drop with)
    drop (one direction)             cls_bpf matching every frame but ARP on the bridge port's
                                     egress (toward the node, "in") or ingress (from it, "out")
                                     -> mirred to a downed ifb
    loss                             a forwarder link: seeded loss in the forwarder; else netem
                                     where the kernel has it; else cls_bpf with a classic-BPF
                                     random match (prandom: NOT seeded, not replayable)
    rate                             tbf at the root of both ends' egress
    delay (+ jitter)                 a forwarder link: the forwarder (seeded, FIFO per
                                     direction); else netem where the kernel has it; else an
                                     error that says to give the node a forwarder link

The classic-BPF programs are in bpf.py. Faults can also be applied by name and time from a
scenario (scenario.py): `c.play(scenario)`.
"""

import os
import threading
import time
import zlib

from bpf import bpf_all_but_arp, bpf_random_ipv4, bpf_source_mac_in, _bytecode
from host import COORDINATOR, NetnsError, _cmd, _link_exists, netem_available


def stable_seed(*parts):
    """A 32-bit seed from strings and numbers, the same in every run and Python version."""
    return zlib.crc32("/".join(str(p) for p in parts).encode())


# ---------------------------------------------------------------- faults

class Fault:
    """One applied fault. `revert()` undoes it (idempotent); `method` names the mechanism that
    made it (link-down, cls_bpf-mirred, cls_bpf-random, tbf, forwarder, netem) and `mechanism`
    says it in words, with the devices."""

    def __init__(self, cluster, kind, target, params, method, mechanism, undo):
        self.cluster = cluster
        self.kind = kind
        self.target = target
        self.params = dict(params)
        self.method = method          # short and the same in every cluster: "link-down", "tbf", ...
        self.mechanism = mechanism    # the words for a person, with this cluster's devices
        self._undo = undo
        self.active = True
        self.applied_at = cluster.elapsed()

    def revert(self):
        with self.cluster._lock:
            if not self.active:
                return
            self.active = False
            if self.cluster._closed and self.kind != "flap":
                return      # its devices are gone with the cluster (a flap still has a thread)
            try:
                self._undo()
            finally:
                if self in self.cluster.faults:
                    self.cluster.faults.remove(self)
                self.cluster._log("revert", self.kind, self.target, self.params, self.method,
                                  self.mechanism)

    def __repr__(self):
        return f"Fault({self.kind} {self.target} {self.params} via {self.mechanism})"


PARTITION_KINDS = ("cut", "isolate_coordinator", "split", "drop", "flap")


class FaultInjector:
    """The fault-injecting half of Cluster, a mixin. It works on what Cluster builds and keeps:
    links, names, mtu, seed, ifb, faults, log and the private state behind them (_lock, _pref,
    _clsact, _ifb_made, _runs), with Cluster's elapsed(), _note(), _canon(), _link() and
    _forwarder_command()."""

    # ------------------------------------------------------------ the fault log

    def _log(self, action, kind, target, params, method, mechanism):
        entry = {"t": round(self.elapsed(), 4), "action": action, "fault": kind, "target": target,
                 "params": params, "method": method, "mechanism": mechanism}
        self.log.append(entry)
        shown = " ".join(f"{k}={v}" for k, v in params.items())
        self._note(f"{action} {kind} {target} {shown} via {mechanism}".replace("  ", " "))

    # ------------------------------------------------------------ building blocks

    def _set_link(self, link, reason, down):
        """Adds or removes a reason for the link to be down; the link is down while any remains."""
        was_down = bool(link.down_reasons)
        if down:
            link.down_reasons.add(reason)
        else:
            link.down_reasons.discard(reason)
        now_down = bool(link.down_reasons)
        if now_down != was_down:
            _cmd(["ip", "link", "set", link.host_dev, "down" if now_down else "up"])

    def _ensure_ifb(self):
        if not self._ifb_made:
            # Left down on purpose: mirred into a device that is down drops the frame (there
            # is no gact action in this kernel to drop with).
            _cmd(["ip", "link", "add", self.ifb, "type", "ifb"])
            self._ifb_made = True

    def _drop_filter(self, dev, hook, prog):
        """Frames matching `prog` at `hook` (ingress/egress) of root-namespace `dev` are
        redirected to the downed ifb, i.e. dropped. Returns the undo."""
        self._ensure_ifb()
        if dev not in self._clsact:
            _cmd(["tc", "qdisc", "add", "dev", dev, "clsact"])
            self._clsact.add(dev)
        pref = str(next(self._pref))
        _cmd(["tc", "filter", "add", "dev", dev, hook, "pref", pref, "protocol", "all", "bpf",
              "bytecode", _bytecode(prog), "action", "mirred", "egress", "redirect", "dev",
              self.ifb])

        def undo():
            if _link_exists(dev):
                _cmd(["tc", "filter", "del", "dev", dev, hook, "pref", pref, "protocol", "all"])
        return undo

    def _egress_end(self, link, direction):
        """(namespace or None, device) whose egress carries `direction` ("in": toward the node)."""
        return (None, link.host_dev) if direction == "in" else (link.netns, link.inner_dev)

    def _render_egress(self, link, direction):
        """Puts the wanted tbf / netem at the root of one end's egress. Faults of one kind that
        overlap stack: the latest wins until it is reverted."""
        netns, dev = self._egress_end(link, direction)
        tc = ["tc"] + (["-n", netns] if netns else [])
        want = {}
        for _, key, value in link.egress[direction]:
            want[key] = value
        _cmd(tc + ["qdisc", "del", "dev", dev, "root"], check=False)
        tbf = None
        if "rate" in want:
            mbit = want["rate"]
            rate_bytes = mbit * 1e6 / 8
            burst = max(int(rate_bytes * 0.004), 4 * (self.mtu + 14), 32 * 1024)
            tbf = ["tbf", "rate", f"{mbit}mbit", "burst", str(burst), "latency", "200ms"]
        netem = want.get("netem_delay", []) + want.get("netem_loss", [])
        if tbf and netem:
            _cmd(tc + ["qdisc", "add", "dev", dev, "root", "handle", "1:"] + tbf)
            _cmd(tc + ["qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "netem"]
                 + netem)
        elif tbf:
            _cmd(tc + ["qdisc", "add", "dev", dev, "root"] + tbf)
        elif netem:
            _cmd(tc + ["qdisc", "add", "dev", dev, "root", "netem"] + netem)

    def _egress_fault(self, link, directions, key, value):
        token = object()
        for d in directions:
            link.egress[d].append((token, key, value))
            self._render_egress(link, d)

        def undo():
            for d in directions:
                link.egress[d] = [e for e in link.egress[d] if e[0] is not token]
                if self._ns_alive(link):
                    self._render_egress(link, d)
        return undo

    def _shaping_fault(self, link, kind, directions, args):
        """Sets the forwarder's `kind` (delay or loss) for each direction; overlapping faults
        stack, and a revert restores the one below (or none)."""
        token = object()

        def send(d):
            stack = link.shaping.get((kind, d), [])
            top = stack[-1][1] if stack else ("0 0 0" if kind == "delay" else "0 0")
            if link.forwarder is not None and link.forwarder.poll() is None:
                self._forwarder_command(link, f"{kind} {d} {top}")

        for d in directions:
            link.shaping.setdefault((kind, d), []).append((token, args))
            send(d)

        def undo():
            for d in directions:
                link.shaping[(kind, d)] = [e for e in link.shaping[(kind, d)] if e[0] is not token]
                send(d)
        return undo

    def _ns_alive(self, link):
        return os.path.exists(f"/run/netns/{link.netns}")

    def _add(self, kind, target, params, method, mechanism, undo):
        f = Fault(self, kind, target, params, method, mechanism, undo)
        self.faults.append(f)
        self._log("apply", kind, target, params, method, mechanism)
        return f

    @staticmethod
    def _directions(direction):
        if direction not in ("in", "out", "both"):
            raise NetnsError(f"direction must be in, out or both, got '{direction}'")
        return ["in", "out"] if direction == "both" else [direction]

    # ------------------------------------------------------------ faults

    def cut(self, node):
        """Partition: the node's link goes down (its bridge port, veth or TAP)."""
        with self._lock:
            link = self._link(node)
            reason = object()
            self._set_link(link, reason, True)
            return self._add("cut", link.name, {}, "link-down",
                             f"{link.kind} down (ip link set {link.host_dev} down)",
                             lambda: self._set_link(link, reason, False))

    def isolate_coordinator(self):
        """The coordinator's namespace loses its link: no node reaches it, it reaches none."""
        with self._lock:
            link = self._link(COORDINATOR)
            reason = object()
            self._set_link(link, reason, True)
            return self._add("isolate_coordinator", COORDINATOR, {}, "link-down",
                             f"{link.kind} down (ip link set {link.host_dev} down)",
                             lambda: self._set_link(link, reason, False))

    def split(self, side_a, side_b=None):
        """Two halves that keep their links but cannot reach each other. side_b defaults to
        every other namespace (the coordinator included)."""
        with self._lock:
            a = [self._canon(x) for x in side_a]
            b = [self._canon(x) for x in side_b] if side_b is not None else \
                [x for x in self.names if x not in a]
            if not a or not b or set(a) & set(b):
                raise NetnsError(f"split needs two disjoint, non-empty sides, got {a} and {b}")
            undos = []
            try:
                for mine, theirs in ((a, b), (b, a)):
                    macs = [self.links[x].mac for x in theirs]
                    for x in mine:
                        undos.append(self._drop_filter(self.links[x].host_dev, "egress",
                                                       bpf_source_mac_in(macs)))
            except Exception:
                for u in undos:
                    u()
                raise

            def undo():
                for u in undos:
                    u()
            return self._add("split", a, {"side_b": b}, "cls_bpf-mirred",
                             "cls_bpf source-MAC match on each bridge port's egress -> mirred to "
                             f"downed ifb {self.ifb}", undo)

    def drop(self, node, direction="in"):
        """One direction only: "in" drops every frame toward the node, "out" every frame from
        it (ARP passes; neighbours are permanent anyway)."""
        with self._lock:
            link = self._link(node)
            if direction not in ("in", "out"):
                raise NetnsError(f"drop: direction must be in or out, got '{direction}'")
            hook = "egress" if direction == "in" else "ingress"
            undo = self._drop_filter(link.host_dev, hook, bpf_all_but_arp())
            return self._add("drop", link.name, {"direction": direction}, "cls_bpf-mirred",
                             f"cls_bpf match-all-but-ARP on {link.host_dev} {hook} -> mirred to "
                             f"downed ifb {self.ifb}", undo)

    def loss(self, node, probability, direction="both", seed=None, mechanism=None):
        """Drops IPv4 frames on the node's link with `probability`. A forwarder link draws from
        `seed` (replayable); netem where the kernel has it; else a classic-BPF random match
        (not seeded). mechanism= "forwarder" | "netem" | "bpf" forces one."""
        if not 0 <= probability <= 1:
            raise NetnsError(f"loss probability must be in [0, 1], got {probability}")
        with self._lock:
            link = self._link(node)
            dirs = self._directions(direction)
            mech = mechanism or ("forwarder" if link.kind == "tap" else
                                 "netem" if netem_available() else "bpf")
            params = {"probability": probability, "direction": direction}
            if mech == "forwarder":
                if link.kind != "tap":
                    raise NetnsError(f"loss via forwarder: {link.name} has no forwarder link "
                                     "(Cluster(forwarder=[...]))")
                seed = stable_seed(self.seed, link.name, "loss") if seed is None else int(seed)
                params["seed"] = seed
                undo = self._shaping_fault(link, "loss", dirs, f"{probability} {seed}")
                return self._add("loss", link.name, params, "forwarder",
                                 f"tap_forwarder seeded loss of IPv4 frames (seed {seed}, "
                                 "replayable)",
                                 undo)
            if mech == "netem":
                undo = self._egress_fault(link, dirs, "netem_loss",
                                          ["loss", f"{probability * 100}%"])
                return self._add("loss", link.name, params, "netem",
                                 "netem loss on the link's egress", undo)
            if mech != "bpf":
                raise NetnsError(f"loss: unknown mechanism '{mech}' (forwarder, netem, bpf)")
            undos = [self._drop_filter(link.host_dev, "egress" if d == "in" else "ingress",
                                       bpf_random_ipv4(probability)) for d in dirs]

            def undo():
                for u in undos:
                    u()
            return self._add("loss", link.name, params, "cls_bpf-random",
                             f"cls_bpf classic-BPF random match (kernel prandom, not seeded) on "
                             f"{link.host_dev} -> mirred to downed ifb {self.ifb}", undo)

    def rate(self, node, mbit, direction="both"):
        """A bandwidth cap of `mbit` Mbit/s: tbf at the egress of both ends of the link."""
        if mbit <= 0:
            raise NetnsError(f"rate must be positive, got {mbit} mbit")
        with self._lock:
            link = self._link(node)
            undo = self._egress_fault(link, self._directions(direction), "rate", mbit)
            return self._add("rate", link.name, {"mbit": mbit, "direction": direction}, "tbf",
                             f"tbf on {link.host_dev} (toward the node) and {link.inner_dev} in "
                             f"{link.netns} (from it)" if direction == "both" else "tbf", undo)

    def delay(self, node, ms, jitter_ms=0, direction="both", seed=None):
        """Holds each frame ms ± jitter_ms (uniform) on the node's link, in FIFO order per
        direction (so TCP sees no reordering): the forwarder on a forwarder link, netem where
        the kernel has it. A round trip over one delayed link takes about 2 × ms."""
        if ms < 0 or jitter_ms < 0 or jitter_ms > ms:
            raise NetnsError(f"delay needs 0 <= jitter_ms <= ms, got {ms} ± {jitter_ms}")
        with self._lock:
            link = self._link(node)
            dirs = self._directions(direction)
            params = {"ms": ms, "jitter_ms": jitter_ms, "direction": direction}
            if link.kind == "tap":
                seed = stable_seed(self.seed, link.name, "delay") if seed is None else int(seed)
                params["seed"] = seed
                undo = self._shaping_fault(link, "delay", dirs,
                                           f"{int(ms * 1000)} {int(jitter_ms * 1000)} {seed}")
                return self._add("delay", link.name, params, "forwarder",
                                 f"tap_forwarder (user space, seed {seed}, FIFO per direction)",
                                 undo)
            if netem_available():
                netem = ["delay", f"{ms}ms"] + ([f"{jitter_ms}ms"] if jitter_ms else [])
                undo = self._egress_fault(link, dirs, "netem_delay", netem)
                return self._add("delay", link.name, params, "netem",
                                 "netem delay on the link's egress", undo)
            raise NetnsError(f"delay on {link.name}: this kernel has no netem; give the node a "
                             f"forwarder link (Cluster(..., forwarder=['{link.name}']))")

    def flap(self, node, period=2.0, down_for=None):
        """The link goes down for `down_for` (default half the period) at the start of every
        period, until reverted."""
        if period <= 0:
            raise NetnsError(f"flap period must be positive, got {period}")
        down_for = period / 2 if down_for is None else down_for
        with self._lock:
            link = self._link(node)
            stop = threading.Event()
            reason = object()

            def toggle(down):
                # The lock is taken in short tries: undo() holds it while it waits for this
                # thread to end.
                while not stop.is_set():
                    if self._lock.acquire(timeout=0.05):
                        try:
                            if not stop.is_set():
                                self._set_link(link, reason, down)
                                word = "down" if down else "up"
                                self._note(f"flap {link.name}: {word} "
                                           f"(ip link set {link.host_dev} {word})")
                        finally:
                            self._lock.release()
                        return

            def loop():
                start = time.monotonic()
                k = 0
                while not stop.is_set():
                    t = start + k * period
                    if stop.wait(max(0.0, t - time.monotonic())):
                        break
                    toggle(True)
                    if stop.wait(max(0.0, t + down_for - time.monotonic())):
                        break
                    toggle(False)
                    k += 1

            thread = threading.Thread(target=loop, name=f"flap-{link.name}", daemon=True)

            def undo():
                stop.set()
                if thread is not threading.current_thread():
                    thread.join(timeout=5)
                if self._ns_alive(link):
                    self._set_link(link, reason, False)
            f = self._add("flap", link.name, {"period": period, "down_for": down_for}, "link-down",
                          f"{link.kind} down/up every {period}s (ip link set {link.host_dev})",
                          undo)
            thread.start()
            return f

    def heal(self, node=None):
        """Ends partitions (cut, isolation, split, one-way drop, flap) that involve `node`, or
        all of them; delay, loss and rate stay."""
        with self._lock:
            name = self._canon(node) if node is not None else None
            for f in list(self.faults):
                sides = (f.target if isinstance(f.target, list) else []) + \
                    list(f.params.get("side_b", []))
                involved = name is None or f.target == name or name in sides
                if f.kind in PARTITION_KINDS and involved:
                    f.revert()

    def clear(self):
        """Reverts every active fault."""
        with self._lock:
            for f in list(reversed(self.faults)):
                f.revert()

    def fault(self, kind, target=None, **params):
        """Applies a fault by name (as scenarios name them); returns its Fault."""
        if kind == "cut":
            return self.cut(target)
        if kind == "isolate_coordinator":
            return self.isolate_coordinator()
        if kind == "split":
            side_a = target if isinstance(target, list) else [target]
            return self.split(side_a, params.get("side_b"))
        if kind == "drop":
            return self.drop(target, params.get("direction", "in"))
        if kind == "loss":
            return self.loss(target, params["probability"], params.get("direction", "both"),
                             params.get("seed"), params.get("mechanism"))
        if kind == "rate":
            return self.rate(target, params["mbit"], params.get("direction", "both"))
        if kind == "delay":
            return self.delay(target, params["ms"], params.get("jitter_ms", 0),
                              params.get("direction", "both"), params.get("seed"))
        if kind == "flap":
            return self.flap(target, params.get("period", 2.0), params.get("down_for"))
        raise NetnsError(f"unknown fault '{kind}' (cut, isolate_coordinator, split, drop, loss, "
                         "rate, delay, flap)")

    def play(self, scenario, start=True):
        """Runs a scenario's timed faults in a background thread (scenario.ScenarioRun)."""
        import scenario as scenario_mod
        run = scenario_mod.ScenarioRun(self, scenario)
        self._runs.append(run)
        if start:
            run.start()
        return run

