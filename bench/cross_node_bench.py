#!/usr/bin/python3
"""Across nodes over a shaped link (issue 25, item 2): troupe's all-reduce bus bandwidth beside
a plain TCP stream on the same link, and training throughput beside PyTorch DDP (gloo), on
two network namespaces of chaos/netns with a 1 Gbit/s cap and 0, 1 or 10 ms of delay.

    sudo /usr/bin/python3 bench/cross_node_bench.py [--build build] [--rounds 5]
        [--conditions 0,1,10] [--parts link,comm,train] [--sizes 256K,1M,4M,16M,64M]
        [--steps 50] [--skip 10] [--out results.json]

One cluster for everything (chaos/netns/cluster.py): nodes n1 and n2 and the coordinator's
namespace on a bridge; n2's link goes through tap_forwarder (delay needs it on this kernel,
which has no netem), MTU 9000 on every link (at 1500 the user-space forwarder itself tops out
below 1 Gbit/s); `tbf` at 1 Gbit/s on both ends of both nodes' links; the forwarder holds each
frame `delay` ms in each direction on n2's link, so n1 <-> n2 round trips gain 2 x delay.

Per condition (delay), `--rounds` rounds, each in this order so that drift hits all alike:
  link   a TCP stream n1 -> n2 (measure.tcp_stream, 3 s) and UDP round trips n1 <-> n2
  comm   comm_bench across the namespaces (`--node K`, one process per node forking its 2
         ranks, store served by node 0, pairs bound to each node's address): hier (shm
         inside each node, TCP across), then tcp (a flat 4-rank gloo ring), all-reduce at
         --sizes; the bytes n1's eth0 sent and received are counted around each run
  train  2 nodes x 2 ranks of the default model (4 layers, d_model 128, context 64, batch
         16, micro-batch 4): a troupe job (troupe coordinator + an agent per node, the
         hierarchical data plane it picks), the same with TROUPE_TRANSPORT=tcp (flat), and
         PyTorch DDP (gloo, bench/torch_ddp.py, one process per rank in its node's namespace,
         GLOO_SOCKET_IFNAME=eth0, store on n1)

Bus bandwidth across nodes ("link busbw"): the bytes each node sends over its link per
all-reduce divided by the time: algbw x 1 for hier on 2 nodes (each node's share crosses
once each way: 2(N-1)/N of the buffer with N nodes), algbw x 1.5 for the flat 4-rank ring (one
ring edge leaves each node and carries 2(P-1)/P of the buffer). The counted bytes check the
factors. Its share of the TCP stream of the same round is the figure issue 25 asks >= 90 % of.

Needs root, `cmake --build build --target comm_bench troupe tap_forwarder`, and Debian's
python3-torch (scripts/setup.sh --bench). The binaries are copied first, so a rebuild during the
run does not change what is measured. Before each round it waits while a compiler or ctest runs
on the machine (up to --quiet-wait seconds) and records the load average.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(REPO, "chaos", "netns"))
import cluster as netns  # noqa: E402
import measure  # noqa: E402
from troupe_job import TroupeJob  # noqa: E402

PYTHON = "/usr/bin/python3"  # Debian's python3-torch
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def parse_size(s):
    m = re.fullmatch(r"(\d+)([KMG]?)", s)
    if not m:
        raise argparse.ArgumentTypeError(s)
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def size_label(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def others_busy(mine):
    """Compilers, test runs and troupe processes of other people on this machine (what would
    skew a figure); `mine`: pids of this benchmark's cluster, not counted."""
    out = []
    for name in ("cc1plus", "ctest", "ld", "ninja"):
        r = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True)
        if r.stdout.strip():
            out.append(name)
    r = subprocess.run(["pgrep", "-x", "troupe"], capture_output=True, text=True)
    if any(not zombie(int(p)) for p in set(int(p) for p in r.stdout.split()) - set(mine)):
        out.append("another troupe job")
    return out


def zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def wait_quiet(c, limit_s, max_load, load_wait_s=90):
    """Waits while others' compilers, tests or jobs run (up to limit_s), and while the 1-minute
    load is above max_load (up to load_wait_s: this benchmark's own last round weighs in it)."""
    start = time.monotonic()
    while True:
        busy = others_busy(c.pids_in_namespaces())
        load = float(open("/proc/loadavg").read().split()[0])
        waited = time.monotonic() - start
        if (not busy and (load <= max_load or waited > load_wait_s)) or waited > limit_s:
            return {"load1": load, "busy": busy, "waited_s": round(waited, 1)}
        log(f"  waiting: {', '.join(busy) or 'load'} (load {load})")
        time.sleep(10)


def link_bytes(c, node):
    """(tx, rx) bytes of eth0 in the node's namespace."""
    r = c.run(node, ["ip", "-s", "-j", "link", "show", "eth0"])
    st = json.loads(r.stdout)[0]["stats64"]
    return st["tx"]["bytes"], st["rx"]["bytes"]


def cpu_seconds(pid):
    """utime + stime of a live process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def forwarder_cpu(c):
    link = c._link("n2")
    return cpu_seconds(link.forwarder.pid) if link.forwarder else 0.0


def wait_rusage(p, timeout):
    """Waits for a Popen and returns (returncode, CPU seconds of it and its reaped children)."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid == p.pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            return p.returncode, ru.ru_utime + ru.ru_stime
        if time.monotonic() > deadline:
            p.kill()
            _, status, ru = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            return None, ru.ru_utime + ru.ru_stime
        time.sleep(0.05)


# ---------------------------------------------------------------------------- link

def measure_link(c, seconds):
    r = measure.rtt(c, "n1", "n2", count=50, interval=0.01)
    cpu0 = forwarder_cpu(c)
    s = measure.tcp_stream(c, "n1", "n2", seconds=seconds)
    fwd = (forwarder_cpu(c) - cpu0) / s["seconds"]
    return {"stream_bps": s["bits_per_second"], "rtt_ms": r.get("median_ms"),
            "rtt_min_ms": r.get("min_ms"), "forwarder_cpu": fwd}


def measure_duplex(c, seconds):
    """Two TCP streams at once, n1 -> n2 and n2 -> n1: what an all-reduce asks of the link."""
    out = {}

    def one(a, b):
        out[(a, b)] = measure.tcp_stream(c, a, b, seconds=seconds)["bits_per_second"]

    ts = [threading.Thread(target=one, args=ab) for ab in (("n1", "n2"), ("n2", "n1"))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return {"n1_to_n2_bps": out[("n1", "n2")], "n2_to_n1_bps": out[("n2", "n1")]}


# ---------------------------------------------------------------------------- comm

ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s*$")


def run_comm(c, bench, transport, sizes, port, tmp, batches, batch_seconds):
    a1, a2 = c.address("n1"), c.address("n2")
    common = [bench, "--ranks", "4", "--ops", "all_reduce", "--nodes", "2", "--transport",
              transport, "--min-bytes", str(min(sizes)), "--max-bytes", str(max(sizes)),
              "--batches", str(batches), "--batch-seconds", str(batch_seconds)]
    outs = [open(os.path.join(tmp, f"comm-{transport}-n{k}.txt"), "w+") for k in (1, 2)]
    env = dict(os.environ, **ONE_THREAD)
    before = link_bytes(c, "n1")
    cpu0 = forwarder_cpu(c)
    t0 = time.monotonic()
    p1 = c.popen("n1", common + ["--node", "0", "--serve-store", f"{a1}:{port}", "--bind", a1],
                 stdout=outs[0], stderr=subprocess.STDOUT, env=env)
    p2 = c.popen("n2", common + ["--node", "1", "--store", f"{a1}:{port}", "--bind", a2],
                 stdout=outs[1], stderr=subprocess.STDOUT, env=env)
    rc1, cpu1 = wait_rusage(p1, 900)
    rc2, cpu2 = wait_rusage(p2, 60)
    wall = time.monotonic() - t0
    after = link_bytes(c, "n1")
    fwd = forwarder_cpu(c) - cpu0
    texts = []
    for f in outs:
        f.seek(0)
        texts.append(f.read())
        f.close()
    if rc1 != 0 or rc2 != 0:
        raise RuntimeError(f"comm_bench {transport} failed ({rc1}, {rc2}):\n{texts[0]}\n{texts[1]}")
    rows = {}
    for line in texts[0].splitlines():
        m = ROW.match(line)
        if m:
            b = int(m.group(1))
            rows[b] = {"time_us": float(m.group(3)), "algbw": float(m.group(4)),
                       "busbw": float(m.group(5)), "calls": int(m.group(7))}
    factor = 1.0 if transport == "hier" else 1.5
    predicted = sum(r["calls"] * b * factor for b, r in rows.items())
    return {"rows": rows, "tx": after[0] - before[0], "rx": after[1] - before[1],
            "predicted_bytes": predicted, "wall_s": wall, "cpu_s": cpu1 + cpu2,
            "forwarder_cpu_s": fwd}


# ---------------------------------------------------------------------------- train

def model_args(a):
    return ["--layers", "4", "--heads", "4", "--d-model", "128", "--context", "64",
            "--batch", "16", "--micro-batch", "4"]


def run_troupe(c, troupe, data, a, tmp, name, flat):
    run_dir = os.path.join(tmp, name)
    env = dict(os.environ, **ONE_THREAD)
    if flat:
        env["TROUPE_TRANSPORT"] = "tcp"
    args = ["--world", "4", "--steps", str(a.steps), "--data", data, "--checkpoint-every", "0",
            "--eval-every", "0", "--metrics-port", "0"] + model_args(a)
    before = link_bytes(c, "n1")
    t0 = time.monotonic()
    job = TroupeJob(c, troupe, run_dir, args, agents={"n1": 2, "n2": 2}, env=env)
    job.start()
    rc = job.wait(600)
    wall = time.monotonic() - t0
    for agent in job.agent_procs.values():  # they leave with the coordinator; reap them
        try:
            agent.wait(timeout=30)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
    after = link_bytes(c, "n1")
    if rc != 0:
        raise RuntimeError(f"troupe job {name} exited {rc}:\n{job.log('coord')[-4000:]}")
    steps = [e for e in job.events() if e.get("event") == "step"]
    steady = [e for e in steps if e["step"] > a.skip]
    step_s = statistics.median(e["step_s"] for e in steady)
    comm_s = statistics.median(e["comm_s"] for e in steady)
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"step_s": step_s, "comm_s": comm_s, "tokens_per_s": 16 * 64 / step_s,
            "comm_share": comm_s / step_s, "link_tx_per_step": (after[0] - before[0]) / a.steps,
            "wall_s": wall}


def run_torch(c, data, a, tmp, name, port):
    a1 = c.address("n1")
    env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", **ONE_THREAD)
    procs, outs = [], []
    before = link_bytes(c, "n1")
    t0 = time.monotonic()
    for rank, node in enumerate(("n1", "n1", "n2", "n2")):
        out = os.path.join(tmp, f"{name}-rank{rank}.json")
        outs.append(out)
        argv = [PYTHON, os.path.join(REPO, "bench", "torch_ddp.py"), "--rank", str(rank),
                "--world", "4", "--master", f"{a1}:{port}", "--data", data, "--steps",
                str(a.steps), "--out", out] + model_args(a)
        with open(out + ".err", "w") as err:
            procs.append(c.popen(node, argv, env=env, stdout=subprocess.DEVNULL, stderr=err))
    # A rank that wrote its timings is done; torch 1.13 sometimes leaves rank 0 (the store's
    # host) hanging in destroy_process_group after the others left, so once every rank has
    # written, a rank still running after 15 s is ended (counted in "teardown_kills"; no
    # figure changes).
    deadline = time.monotonic() + 600
    written_at = None
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if written_at is None and all(os.path.exists(o) for o in outs):
            written_at = time.monotonic()
        if written_at is not None and time.monotonic() - written_at > 15:
            break
        time.sleep(0.1)
    wall = time.monotonic() - t0
    failed = [p.returncode for p in procs if p.poll() is not None and p.returncode != 0]
    kills = 0
    for p in procs:
        if p.poll() is None:
            kills += 1
            p.kill()
            p.wait()
    after = link_bytes(c, "n1")
    if failed or not all(os.path.exists(o) for o in outs):
        errs = "".join(open(o + ".err").read()[-2000:] for o in outs)
        raise RuntimeError(f"torch DDP {name} failed (exit codes {failed}, {kills} killed):\n{errs}")
    ranks = [json.load(open(o))["steps"] for o in outs]
    init_s = max(json.load(open(o))["init_s"] for o in outs)
    timed = range(a.skip, a.steps)
    step_s = statistics.median(ranks[0][i]["step_s"] for i in timed)
    comm_s = statistics.median(statistics.fmean(r[i]["comm_s"] for r in ranks) for i in timed)
    return {"step_s": step_s, "comm_s": comm_s, "tokens_per_s": 16 * 64 / step_s,
            "comm_share": comm_s / step_s, "link_tx_per_step": (after[0] - before[0]) / a.steps,
            "wall_s": wall, "init_s": init_s, "teardown_kills": kills}


# ---------------------------------------------------------------------------- report

def med(xs):
    return statistics.median(xs) if xs else float("nan")


def rows_of(run):
    """A comm run's rows by size (JSON turns the keys into strings)."""
    return {int(k): v for k, v in run["rows"].items()}


def report(res, a):
    lines = []
    out = lines.append
    out(f"\nmachine: {res['cpu']}, {os.cpu_count()} cores; {res['when']}")
    out("\n| delay (each way, n2's link) | TCP stream n1 -> n2 | two streams at once (each way) | "
        "RTT n1 <-> n2 | forwarder CPU during the stream | load average before the rounds |")
    out("|---|---:|---:|---:|---:|---|")
    for cond in res["conditions"]:
        L = cond["link"]
        st = [x["stream_bps"] / 1e9 for x in L]
        du = [min(x["n1_to_n2_bps"], x["n2_to_n1_bps"]) / 1e9 for x in cond.get("duplex", [])]
        loads = [q["load1"] for q in cond["quiet"]]
        out(f"| {cond['delay_ms']} ms | {med(st):.3f} Gbit/s ({', '.join(f'{v:.3f}' for v in st)}) "
            f"| {med(du):.3f} Gbit/s | {med([x['rtt_ms'] for x in L]):.2f} ms | "
            f"{med([x['forwarder_cpu'] for x in L]):.0%} of a core | "
            f"{min(loads):.2f}-{max(loads):.2f} |")
    if any(cond.get("comm") for cond in res["conditions"]):
        out("\nlink busbw = bytes each node sends across per all-reduce / time (hier: algbw x 1, "
            "flat: algbw x 1.5); share = link busbw / the same round's TCP stream, median of "
            "per-round ratios")
        out("\n| delay | size | hier time | hier link busbw | hier / stream | flat time | "
            "flat link busbw | flat / stream | hier / flat time | hier / stream per round |")
        out("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for cond in res["conditions"]:
            rounds = cond["comm"]
            for b in sorted(int(k) for k in rounds[0]["hier"]["rows"]):
                h = [rows_of(r["hier"])[b] for r in rounds]
                f = [rows_of(r["tcp"])[b] for r in rounds]
                hs = [x["algbw"] * 8 / (r["stream_bps"] / 1e9) for x, r in zip(h, rounds)]
                fs = [x["algbw"] * 1.5 * 8 / (r["stream_bps"] / 1e9) for x, r in zip(f, rounds)]
                sp = [y["time_us"] / x["time_us"] for x, y in zip(h, f)]
                out(f"| {cond['delay_ms']} ms | {size_label(b)} | {med([x['time_us'] for x in h]) / 1e3:.1f} ms "
                    f"| {med([x['algbw'] * 8 for x in h]):.3f} Gbit/s | **{med(hs):.0%}** "
                    f"| {med([x['time_us'] for x in f]) / 1e3:.1f} ms "
                    f"| {med([x['algbw'] * 1.5 * 8 for x in f]):.3f} Gbit/s | {med(fs):.0%} "
                    f"| {med(sp):.2f}x | {', '.join(f'{v:.0%}' for v in hs)} |")
        out("\nbytes n1's eth0 sent per run / predicted (calls x size x factor), CPU of the ranks "
            "and of the forwarder per run (2 cores = 2.0 per second of wall)")
        out("\n| delay | transport | sent / predicted | received / predicted | rank CPU / wall | "
            "forwarder CPU / wall |")
        out("|---|---|---:|---:|---:|---:|")
        for cond in res["conditions"]:
            for t in ("hier", "tcp"):
                rs = [r[t] for r in cond["comm"]]
                out(f"| {cond['delay_ms']} ms | {t} | {med([r['tx'] / r['predicted_bytes'] for r in rs]):.3f} "
                    f"| {med([r['rx'] / r['predicted_bytes'] for r in rs]):.3f} "
                    f"| {med([r['cpu_s'] / r['wall_s'] for r in rs]):.2f} "
                    f"| {med([r['forwarder_cpu_s'] / r['wall_s'] for r in rs]):.2f} |")
    if any(cond.get("train") for cond in res["conditions"]):
        out(f"\ntraining, 2 nodes x 2 ranks, median step over steps {a.skip + 1}-{a.steps}, then "
            f"median over {a.rounds} rounds; ratio = per-round troupe / torch, median")
        out("\n| delay | troupe (hier) tok/s | comm | troupe (flat) tok/s | comm | torch DDP tok/s "
            "| comm (exposed) | troupe hier / torch | per round | troupe flat / torch | "
            "bytes n1 sent per step: hier, flat, torch |")
        out("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|")
        for cond in res["conditions"]:
            rs = cond["train"]
            h = [r["troupe_hier"] for r in rs]
            f = [r["troupe_flat"] for r in rs]
            t = [r["torch"] for r in rs]
            ratio = [x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(h, t)]
            flat_ratio = [x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(f, t)]
            out(f"| {cond['delay_ms']} ms | {med([x['tokens_per_s'] for x in h]):,.0f} "
                f"| {med([x['comm_share'] for x in h]):.0%} "
                f"| {med([x['tokens_per_s'] for x in f]):,.0f} | {med([x['comm_share'] for x in f]):.0%} "
                f"| {med([x['tokens_per_s'] for x in t]):,.0f} | {med([x['comm_share'] for x in t]):.0%} "
                f"| **{med(ratio):.2f}** | {', '.join(f'{v:.2f}' for v in ratio)} "
                f"| {med(flat_ratio):.2f} "
                f"| {med([x['link_tx_per_step'] for x in h]) / 1e6:.2f}, "
                f"{med([x['link_tx_per_step'] for x in f]) / 1e6:.2f}, "
                f"{med([x['link_tx_per_step'] for x in t]) / 1e6:.2f} MB |")
    return "\n".join(lines)


def save(res, path):
    with open(path + ".tmp", "w") as f:
        json.dump(res, f, indent=1, default=str)
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--data", default=None, help="corpus (default BUILD/data/kjv.txt)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--conditions", default="0,1,10", help="delays in ms, each way on n2's link")
    ap.add_argument("--rate-mbit", type=int, default=1000)
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--parts", default="link,comm,train")
    ap.add_argument("--sizes", default="256K,64M", help="smallest,largest all-reduce (x4 steps)")
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--batch-seconds", type=float, default=0.5)
    ap.add_argument("--stream-seconds", type=float, default=3.0)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--skip", type=int, default=10, help="first steps not counted")
    ap.add_argument("--quiet-wait", type=float, default=900)
    ap.add_argument("--max-load", type=float, default=1.5)
    ap.add_argument("--out", default=None, help="raw results (JSON)")
    a = ap.parse_args()
    parts = set(a.parts.split(","))
    sizes = [parse_size(s) for s in a.sizes.split(",")]

    ok, why = netns.can_run()
    if not ok:
        sys.exit(f"cross_node_bench: cannot make namespaces here: {why}")
    build = os.path.abspath(a.build)
    data = a.data or os.path.join(build, "data", "kjv.txt")
    tmp = tempfile.mkdtemp(prefix="troupe-xnode-")
    # Copies: another build during the run must not swap the binaries under it.
    bins = {}
    for name, rel in (("comm_bench", "bench/comm_bench"), ("troupe", "cli/troupe"),
                      ("tap_forwarder", "chaos/tap_forwarder")):
        src = os.path.join(build, rel)
        if not os.access(src, os.X_OK):
            sys.exit(f"cross_node_bench: build {src} first")
        bins[name] = os.path.join(tmp, name)
        shutil.copy2(src, bins[name])
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), "?")
    res = {"cpu": cpu, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "args": vars(a), "conditions": []}
    port = 29700
    with netns.Cluster(nodes=2, forwarder=["n2"], mtu=a.mtu, verbose=False,
                       forwarder_bin=bins["tap_forwarder"]) as c:
        for node in ("n1", "n2"):
            c.rate(node, a.rate_mbit)
        delay = None
        for ms in (float(x) for x in a.conditions.split(",")):
            if delay is not None:
                delay.revert()
            delay = c.delay("n2", ms=ms) if ms > 0 else None
            cond = {"delay_ms": ms if ms != int(ms) else int(ms), "link": [], "duplex": [],
                    "comm": [], "train": [], "quiet": []}
            res["conditions"].append(cond)
            for r in range(a.rounds):
                cond["quiet"].append(wait_quiet(c, a.quiet_wait, a.max_load))
                log(f"delay {ms} ms, round {r + 1}/{a.rounds}: {cond['quiet'][-1]}")
                L = measure_link(c, a.stream_seconds)
                cond["link"].append(L)
                cond["duplex"].append(measure_duplex(c, a.stream_seconds))
                log(f"  link: {L['stream_bps'] / 1e9:.3f} Gbit/s, rtt {L['rtt_ms']:.2f} ms")
                if "comm" in parts:
                    rnd = {"stream_bps": L["stream_bps"]}
                    for t in ("hier", "tcp"):
                        port += 1
                        rnd[t] = run_comm(c, bins["comm_bench"], t, sizes, port, tmp, a.batches,
                                          a.batch_seconds)
                        top = rnd[t]["rows"][max(rnd[t]["rows"])]
                        log(f"  comm {t}: {max(sizes) >> 20} MiB algbw {top['algbw']:.3f} GB/s")
                    cond["comm"].append(rnd)
                if "train" in parts:
                    rnd = {}
                    rnd["troupe_hier"] = run_troupe(c, bins["troupe"], data, a, tmp,
                                                    f"troupe-hier-{ms}-{r}", flat=False)
                    rnd["troupe_flat"] = run_troupe(c, bins["troupe"], data, a, tmp,
                                                    f"troupe-flat-{ms}-{r}", flat=True)
                    port += 1
                    rnd["torch"] = run_torch(c, data, a, tmp, f"torch-{ms}-{r}", port)
                    log("  train: " + ", ".join(f"{k} {v['tokens_per_s']:.0f} tok/s comm "
                                                f"{v['comm_share']:.0%} ({v['wall_s']:.0f} s)"
                                                for k, v in rnd.items()))
                    cond["train"].append(rnd)
                if a.out:  # after every round: a failure later keeps what was measured
                    save(res, a.out)
    shutil.rmtree(tmp, ignore_errors=True)
    if a.out:
        save(res, a.out)
    print(report(res, a))


if __name__ == "__main__":
    main()
