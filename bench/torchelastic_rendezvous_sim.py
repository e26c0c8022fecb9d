#!/usr/bin/python3
"""torchelastic's c10d rendezvous at N simulated members: the peer of troupe's control-plane
simulation for issue 41 (PyTorch 1.13, Debian's /usr/bin/python3).

One real c10d TCPStore (the 1.13 poll()-based server) is hosted in a child process, as
torchrun's c10d backend hosts it in one agent; its CPU is that child's CPU. Every simulated
member is one torchelastic agent: its own TCPStore client connection, a real
C10dRendezvousBackend and a real DynamicRendezvousHandler (min_nodes = max_nodes = N, i.e.
`torchrun --nnodes N`; keep-alive every 5 s, 3 misses, the classes' defaults), so the store
sees exactly what the real classes send: compare_set of the whole pickled rendezvous state on
one key for every join, leave and keep-alive, and a get of it for every 1 s poll. Members
are threads, spread over --procs forked processes. Per N, in order:

  form      all members call next_rendezvous() together (it sleeps 0-0.3 s at random in
            round 0, as the real one does), then do what SimpleElasticAgent._rendezvous does
            next: rank 0 sets MASTER_ADDR/PORT, and every member gets them and runs
            _share_and_gather (store_util.synchronize: set its role info, get all N, FIN;
            rank 0 waits for every FIN). rendezvous_s: first next_rendezvous() call -> the
            last member has the round; ready_s: -> the last member has its worker ranks.
  steady    --steady-s of keep-alives only: store ops/s, bytes/s and the store's CPU.
  reform    one member "restarts its workers" (calls next_rendezvous() again, as its agent
            does after a worker failure); every other member runs the agent's monitor loop
            (every --monitor-interval s, torchrun's default 5, at a random phase:
            num_nodes_waiting() > 0 -> next_rendezvous() + the rank assignment above).
            torchelastic re-forms the whole round: every member leaves and rejoins.
  barrier   --barrier-steps rounds of the store-based barrier of init_process_group
            (distributed_c10d._store_based_barrier: add(key, 1), then add(key, 0) every
            10 ms until it reads N); per round, last member in -> last member out.

Stops a size at --cap-s per phase (reporting how far it got) and skips larger sizes then.
Store ops and bytes are counted at each member's client (key + values each way), so they
do not depend on this machine; times and CPU do: all N members' client work (pickling the
whole state, base64) shares this machine's cores, where a real job spreads it over N nodes.

The one change to torchelastic code: dynamic_rendezvous.get_method_name (a log-name helper
that calls inspect.stack(), ~1 ms each, several per store op) is replaced by the same
lookup through sys._getframe unless --inspect-stack is given. It runs only on members.

usage: bench/torchelastic_rendezvous_sim.py --members 100,500,1000 [--json] [--procs 2]
"""
import argparse
import base64
import json
import multiprocessing
import os
import pickle
import random
import statistics
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.agent.server.api import _RoleInstanceInfo
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.utils import store as store_util

RUN_ID = "sim"
STATE_KEY = "torch.rendezvous." + RUN_ID
LOCAL_WORLD_SIZE = 8  # workers per agent, only the size of each role info record


def cheap_method_name(depth=2):
    """What dynamic_rendezvous.get_method_name returns, without inspect.stack()."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:
        return "no_method_name"


class Counts:
    """Store operations seen by one member's client: op -> [calls, bytes out, bytes in]."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ops = {}

    def add(self, op, out_bytes, in_bytes):
        with self.lock:
            entry = self.ops.setdefault(op, [0, 0, 0])
            entry[0] += 1
            entry[1] += out_bytes
            entry[2] += in_bytes


def size(value):
    return len(value) if isinstance(value, (bytes, str)) else 0


class CountingStore:
    """Passes each call to a c10d store and counts it. C10dRendezvousBackend and
    store_util only call these methods, by name."""

    def __init__(self, store, counts):
        self._store, self._counts = store, counts

    def get(self, key):
        value = self._store.get(key)
        self._counts.add("get", len(key), len(value))
        return value

    def set(self, key, value):
        self._store.set(key, value)
        self._counts.add("set", len(key) + size(value), 0)

    def add(self, key, amount):
        value = self._store.add(key, amount)
        self._counts.add("add", len(key) + 8, 8)
        return value

    def compare_set(self, key, expected, desired):
        current = self._store.compare_set(key, expected, desired)
        won = current == (desired.encode() if isinstance(desired, str) else desired)
        self._counts.add("compare_set_won" if won else "compare_set_lost",
                         len(key) + size(expected) + size(desired), len(current))
        return current

    def set_timeout(self, timeout):
        self._store.set_timeout(timeout)


class Member:
    """One torchelastic agent: a store client, the real backend and handler."""

    def __init__(self, gid, port, n, join_timeout_s):
        self.gid = gid
        self.counts = Counts()
        self.client = dist.TCPStore("127.0.0.1", port, is_master=False,
                                    timeout=timedelta(seconds=60))  # torchrun's read_timeout
        backend = C10dRendezvousBackend(CountingStore(self.client, self.counts), RUN_ID)
        settings = dr.RendezvousSettings(
            RUN_ID, n, n, dr.RendezvousTimeout(join=timedelta(seconds=join_timeout_s)),
            keep_alive_interval=timedelta(seconds=5), keep_alive_max_attempt=3)
        # from_backend() would name every node after this host; distinct hosts keep the
        # state's size realistic (one fqdn per node).
        node = dr._NodeDesc(f"node{gid:05d}.sim.cluster", os.getpid(), gid)
        self.handler = dr.DynamicRendezvousHandler(
            node, settings, backend.name, self.client,
            dr._BackendRendezvousStateHolder(backend, settings))
        self.records = {}

    def rendezvous(self):
        """SimpleElasticAgent._rendezvous: next_rendezvous, then worker rank assignment."""
        store, rank, world = self.handler.next_rendezvous()
        t_rdzv = time.monotonic()
        store = CountingStore(store, self.counts)
        if rank == 0:
            store.set("MASTER_ADDR", "node00000.sim.cluster")
            store.set("MASTER_PORT", "29500")
        store.get("MASTER_ADDR")
        store.get("MASTER_PORT")
        info = _RoleInstanceInfo("default", rank, LOCAL_WORLD_SIZE)
        gathered = store_util.synchronize(store, info.serialize(), rank, world,
                                          "torchelastic/role_info")
        infos = [_RoleInstanceInfo.deserialize(b) for b in gathered]
        assert len(infos) == world and infos[rank].rank == rank
        return {"t_rdzv": t_rdzv, "t_ready": time.monotonic(), "rank": rank, "world": world,
                "round": self.handler._state_holder.state.round}

    def form(self, t_go):
        time.sleep(max(0.0, t_go - time.monotonic()))
        t_start = time.monotonic()
        return dict(self.rendezvous(), t_start=t_start)

    def reform(self, t_fail, victim_gid, interval, deadline):
        if self.gid == victim_gid:
            time.sleep(max(0.0, t_fail - time.monotonic()))
        else:
            # The agent's monitor loop has been ticking since before the failure.
            tick = t_fail - interval + random.uniform(0, interval)
            while True:
                tick += interval
                time.sleep(max(0.0, tick - time.monotonic()))
                if self.handler.num_nodes_waiting() > 0:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("no waiting node seen")
        t_detect = time.monotonic()
        return dict(self.rendezvous(), t_detect=t_detect)

    def barrier(self, t_go, steps, n):
        time.sleep(max(0.0, t_go - time.monotonic()))
        store = CountingStore(self.client, self.counts)
        t_in, t_out = [], []
        for step in range(steps):
            key = f"store_based_barrier_key:{step}"
            store.add(key, 1)
            t_in.append(time.monotonic())
            while store.add(key, 0) != n:
                time.sleep(0.01)
            t_out.append(time.monotonic())
        return {"t_in": t_in, "t_out": t_out}


def member_process(gids, port, n, join_timeout_s, conn):
    """Runs the members `gids`; answers the parent's commands on `conn`."""
    threading.stack_size(512 * 1024)
    members = [Member(gid, port, n, join_timeout_s) for gid in gids]
    conn.send("ready")
    phase = None
    while True:
        cmd, *args = conn.recv()
        if cmd == "poll":
            done = [m for m in members if phase in m.records]
            ops = {}
            for m in members:
                with m.counts.lock:
                    for op, entry in m.counts.ops.items():
                        ops[op] = [a + b for a, b in zip(ops.get(op, [0, 0, 0]), entry)]
            records = [m.records[phase] for m in members] if len(done) == len(members) else None
            conn.send({"done": len(done), "ops": ops, "records": records})
        elif cmd == "stop":
            for m in members:
                m.handler._stop_heartbeats()
            conn.send("stopped")
            return
        else:
            phase = cmd

            def run(member, cmd=cmd, args=args):
                try:
                    member.records[cmd] = getattr(member, cmd)(*args)
                except Exception as exc:  # reported to the parent, which stops the size
                    member.records[cmd] = {"error": f"{type(exc).__name__}: {exc}"}

            for m in members:
                threading.Thread(target=run, args=(m,), daemon=True).start()


def host_store(conn):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    conn.send(store.port)
    conn.recv()  # serve until the parent is done


def cpu_s(pid):
    """User + system CPU of a process, all its threads (exited ones included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sum_ops(polls):
    ops = {}
    for poll in polls:
        for op, entry in poll["ops"].items():
            ops[op] = [a + b for a, b in zip(ops.get(op, [0, 0, 0]), entry)]
    return ops


def ops_delta(after, before):
    return {op: [a - b for a, b in zip(entry, before.get(op, [0, 0, 0]))]
            for op, entry in after.items() if entry[0] != before.get(op, [0])[0]}


def ops_summary(ops):
    return {"calls": {op: e[0] for op, e in sorted(ops.items())},
            "total_calls": sum(e[0] for e in ops.values()),
            "mb_to_store": round(sum(e[1] for e in ops.values()) / 1e6, 2),
            "mb_from_store": round(sum(e[2] for e in ops.values()) / 1e6, 2)}


def quantile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Simulation:
    def __init__(self, n, args):
        self.n, self.args = n, args
        ctx = multiprocessing.get_context("fork")  # before any thread: torch imported once
        parent_end, child_end = ctx.Pipe()
        self.store_proc = ctx.Process(target=host_store, args=(child_end,), daemon=True)
        self.store_proc.start()
        self.store_conn = parent_end
        self.port = parent_end.recv()
        procs = min(args.procs, n)
        self.procs, self.conns = [], []
        t0 = time.monotonic()
        for p in range(procs):
            parent_end, child_end = ctx.Pipe()
            gids = list(range(p, n, procs))
            proc = ctx.Process(target=member_process, daemon=True,
                               args=(gids, self.port, n, args.cap_s * 10, child_end))
            proc.start()
            self.procs.append(proc)
            self.conns.append(parent_end)
        for conn in self.conns:
            assert conn.recv() == "ready"
        self.setup_s = time.monotonic() - t0
        self.reader = dist.TCPStore("127.0.0.1", self.port, is_master=False,
                                    timeout=timedelta(seconds=60))

    def poll(self):
        for conn in self.conns:
            conn.send(("poll",))
        return [conn.recv() for conn in self.conns]

    def cpu(self):
        return cpu_s(self.store_proc.pid), sum(cpu_s(p.pid) for p in self.procs)

    def state(self):
        raw = base64.b64decode(self.reader.get(STATE_KEY))
        return pickle.loads(raw), len(raw)

    def phase(self, name, *args):
        """Starts `name` on every member; waits for all of them or --cap-s."""
        before_ops, before_cpu = sum_ops(self.poll()), self.cpu()
        t0 = time.monotonic()
        for conn in self.conns:
            conn.send((name, *args))
        while True:
            time.sleep(0.25)
            polls = self.poll()
            done = sum(p["done"] for p in polls)
            if done == self.n or time.monotonic() - t0 > self.args.cap_s:
                break
        after_cpu = self.cpu()
        out = {"wall_s": round(time.monotonic() - t0, 2),
               "store_cpu_s": round(after_cpu[0] - before_cpu[0], 2),
               "sim_cpu_s": round(after_cpu[1] - before_cpu[1], 2),
               "ops": ops_summary(ops_delta(sum_ops(polls), before_ops))}
        if done < self.n:
            out.update(timed_out=True, members_done=done)
            return out, None
        records = [r for p in polls for r in p["records"]]
        errors = [r["error"] for r in records if "error" in r]
        if errors:
            out.update(errors=len(errors), first_error=errors[0])
            return out, None
        return out, records

    def close(self):
        for proc, conn in zip(self.procs, self.conns):
            if proc.is_alive():
                try:
                    conn.send(("stop",))
                    if conn.poll(10):
                        conn.recv()
                except (BrokenPipeError, EOFError):
                    pass
            proc.kill()  # members' keep-alive threads are daemons: nothing left to flush
            proc.join()
        self.reader = None  # the store's host goes next
        self.store_conn.send("stop")
        self.store_proc.join(5)
        if self.store_proc.is_alive():
            self.store_proc.kill()


def check_round(records, n):
    ranks = sorted(r["rank"] for r in records)
    return (ranks == list(range(n)) and all(r["world"] == n for r in records)
            and len({r["round"] for r in records}) == 1)


def run_size(n, args):
    sim = Simulation(n, args)
    result = {"members": n, "procs": len(sim.procs), "torch": torch.__version__,
              "cpus": os.cpu_count(), "setup_s": round(sim.setup_s, 2)}
    try:
        form, records = sim.phase("form", time.monotonic() + 0.5)
        if records is None:
            state, raw_bytes = sim.state()
            form.update(participants_in_state=len(state.participants),
                        round_complete=state.complete, state_bytes=raw_bytes)
            result["form"] = form
            return result
        start = min(r["t_start"] for r in records)
        join = [r["t_rdzv"] - r["t_start"] for r in records]
        form.update(rendezvous_s=round(max(r["t_rdzv"] for r in records) - start, 3),
                    ready_s=round(max(r["t_ready"] for r in records) - start, 3),
                    join_p50_s=round(statistics.median(join), 3),
                    round_ok=check_round(records, n), state_bytes=sim.state()[1])
        result["form"] = form
        old_round = records[0]["round"]

        before_ops, before_cpu = sum_ops(sim.poll()), sim.cpu()
        time.sleep(args.steady_s)
        after_ops, after_cpu = sum_ops(sim.poll()), sim.cpu()
        steady = ops_summary(ops_delta(after_ops, before_ops))
        result["steady"] = {"window_s": args.steady_s,
                            "ops_per_s": round(steady["total_calls"] / args.steady_s, 1),
                            "mb_per_s": round((steady["mb_to_store"] + steady["mb_from_store"])
                                              / args.steady_s, 2),
                            "store_cpu_pct": round(100 * (after_cpu[0] - before_cpu[0])
                                                   / args.steady_s, 1),
                            "calls": steady["calls"]}

        t_fail = time.monotonic() + 0.5
        reform, records = sim.phase("reform", t_fail, n - 1, args.monitor_interval,
                                    t_fail + args.cap_s)
        if records is not None:
            reform.update(
                detect_s=round(max(r["t_detect"] for r in records) - t_fail, 3),
                rendezvous_s=round(max(r["t_rdzv"] for r in records) - t_fail, 3),
                ready_s=round(max(r["t_ready"] for r in records) - t_fail, 3),
                last_detect_to_round_s=round(max(r["t_rdzv"] for r in records)
                                             - max(r["t_detect"] for r in records), 3),
                round_ok=check_round(records, n) and records[0]["round"] == old_round + 1)
        result["reform"] = reform
        if records is None:
            return result

        barrier, records = sim.phase("barrier", time.monotonic() + 0.5, args.barrier_steps, n)
        if records is not None:
            lat = [max(r["t_out"][s] for r in records) - max(r["t_in"][s] for r in records)
                   for s in range(args.barrier_steps)]
            barrier.update(steps=args.barrier_steps,
                           last_in_to_last_out_p50_ms=round(1e3 * statistics.median(lat), 1),
                           last_in_to_last_out_p99_ms=round(1e3 * quantile(lat, 0.99), 1),
                           adds_per_step=round(barrier["ops"]["calls"].get("add", 0)
                                               / args.barrier_steps))
        result["barrier"] = barrier
        return result
    finally:
        sim.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", action="append", required=True,
                    help="member counts, repeatable or comma-separated (100,500,1000)")
    ap.add_argument("--procs", type=int, default=2, help="member processes (threads in each)")
    ap.add_argument("--cap-s", type=float, default=60,
                    help="give up a phase after this long; larger sizes are then skipped")
    ap.add_argument("--steady-s", type=float, default=10)
    ap.add_argument("--monitor-interval", type=float, default=5, help="torchrun's default")
    ap.add_argument("--barrier-steps", type=int, default=20)
    ap.add_argument("--inspect-stack", action="store_true",
                    help="keep torchelastic's inspect.stack() log-name helper")
    ap.add_argument("--json", action="store_true", help="one JSON object per size")
    args = ap.parse_args()
    sizes = [int(s) for arg in args.members for s in arg.split(",") if s]
    if not args.inspect_stack:
        dr.get_method_name = cheap_method_name

    for n in sizes:
        result = run_size(n, args)
        stuck = [k for k in ("form", "reform", "barrier")
                 if k in result and (result[k].get("timed_out") or result[k].get("errors"))]
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            print(json.dumps(result, indent=1), flush=True)
        if stuck:
            print(f"torchelastic_rendezvous_sim: {n} members did not finish {stuck[0]} within "
                  f"{args.cap_s:g} s; larger sizes skipped", file=sys.stderr)
            break


if __name__ == "__main__":
    main()
