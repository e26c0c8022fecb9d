#!/usr/bin/python3
"""torchrun's peer of troupe's coordinator takeover: kill -9 the torchrun agent that holds the
rendezvous, while training, and see whether the job lives on and how long until a step is
trained again.

troupe's figure comes from `troupe run --coordinators 2 --etcd local` with the leading
coordinator killed (kill -> first step committed afterwards); this script measures torchrun
(PyTorch 1.13, Debian's /usr/bin/python3 and /usr/bin/torchrun) the same way, in two modes:

  c10d-store-host  two agents (--nnodes 2 --nproc_per_node 2), c10d rendezvous on a free
                   loopback port; agent A hosts the TCP store (--rdzv_conf is_host=true),
                   agent B is a client (is_host=false). Agent A is killed.
  etcd             two agents, --rdzv_backend etcd against a private etcd (/usr/bin/etcd
                   --enable-v2, free loopback ports, data in a temp dir; the python client
                   is Debian's python3-etcd). Agent A is killed.

Each trial trains bench/torch_elastic.py (4 workers in all, DDP over gloo on CPU, one thread
each) for --steps steps with a checkpoint every 5, under --max_restarts 3. The default, 1000
steps (about 40 ms each on 2 cores), keeps training going well past torchrun's reaction, which
takes its 5 s monitor period: with 20 steps the job is over 0.4 s after the kill, before any
agent touches the rendezvous again, and nothing is measured. Just before step
--kill-step, agent A's local rank 0 logs a "kill" event and SIGKILLs agent A (its parent);
agent A's workers are left running, orphaned. As a supervisor would, this script starts a
replacement agent A2 with A's arguments as soon as A is reaped (--no-replace: none).

Per trial, from the event log (times from the kill event):
  continued   the first step committed after the kill by the workers already running
  restarted   the first step committed by a new worker group (rank 0 with a new pid)
  survived    step --steps was committed and agent B (and A2) exited 0
  trained     step --steps was committed (whatever the agents did afterwards)
  rc          exit status of B and A2; a failing agent's last error line is shown
The summary gives, per mode, median and max of kill -> restarted step (over trials that had
one) and how many trials survived. A trial that is still running after --timeout seconds is
stopped and counts as not survived; so does one whose agents are still running 15 s after
agent B exited or after the last step was committed (then "trained" says whether it was).

usage: bench/torchrun_takeover.py [--trials N] [--modes c10d-store-host,etcd] [--data CORPUS]
                                  [--timeout SECONDS] [--monitor-interval SECONDS] [--no-replace]
                                  [--steps N] [--kill-step S] [--keep]
  defaults: 3 trials, both modes, build/data/kjv.txt, 150 s per trial, 1000 steps, step 10.

torchrun runs with "--redirects 9:1 --tee 9:1": torch 1.13's default "0" crashes on Python 3.11
(see bench/torchrun_recovery.sh, which measures torchrun's recovery from a worker kill).
Everything stays on loopback.
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from troupe_events import read_events  # noqa: E402

PYTHON = "/usr/bin/python3"  # Debian's python3-torch
TORCHRUN = "/usr/bin/torchrun"
ETCD = "/usr/bin/etcd"
MODES = ("c10d-store-host", "etcd")
GRACE_S = 15  # how long agents may outlive agent B, or the last step
CHECKPOINT_EVERY, NPROC, NNODES, MAX_RESTARTS = 5, 2, 2, 3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_session(argv, out_path, env=None):
    """argv in a new session (and process group), output to out_path."""
    with open(out_path, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)


def kill_group(proc):
    """SIGKILL proc's process group: proc and whatever it started, orphans included."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def start_etcd(work):
    """A private single-member etcd with the v2 API on free loopback ports; (proc, endpoint)."""
    client, peer = free_port(), free_port()
    proc = start_session([ETCD, "--enable-v2", "--name", "bench", "--data-dir", os.path.join(work, "etcd"),
                          "--listen-client-urls", f"http://127.0.0.1:{client}",
                          "--advertise-client-urls", f"http://127.0.0.1:{client}",
                          "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                          "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                          "--initial-cluster", f"bench=http://127.0.0.1:{peer}"],
                         os.path.join(work, "etcd.out"))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{client}/v2/keys", timeout=1):
                return proc, f"127.0.0.1:{client}"
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.2)
    kill_group(proc)
    sys.exit(f"torchrun_takeover: etcd did not come up; see its output:\n{tail(os.path.join(work, 'etcd.out'))}")


def tail(path, lines=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def last_error(path):
    """The last two distinct exception lines of an agent's output (the error and, before it,
    usually its inner cause), for the trial's line."""
    found = []
    for line in tail(path, 400).splitlines():
        if not line.startswith(" ") and ("Error:" in line or "Exception:" in line):
            line = line.strip()[:200]
            if line in found:
                found.remove(line)
            found.append(line)
    return " <- ".join(reversed(found[-2:]))


def agent_argv(mode, endpoint, trial, host, script_args):
    argv = [TORCHRUN, "--nnodes", str(NNODES), "--nproc_per_node", str(NPROC),
            "--max_restarts", str(MAX_RESTARTS), "--redirects", "9:1", "--tee", "9:1",
            "--rdzv_endpoint", endpoint, "--rdzv_id", f"takeover{trial}"]
    if mode == "c10d-store-host":
        argv += ["--rdzv_backend", "c10d", "--rdzv_conf", f"is_host={'true' if host else 'false'}"]
    else:
        argv += ["--rdzv_backend", "etcd"]
    return argv + [os.path.join(HERE, "torch_elastic.py")] + script_args


def run_trial(mode, trial, args, work):
    """One job of two agents, agent A killed; returns the trial's result as a dict."""
    tdir = os.path.join(work, f"{mode}-{trial}")
    os.makedirs(os.path.join(tdir, "ckpt"))
    log = os.path.join(tdir, "events.jsonl")
    train = ["--data", args.data, "--steps", str(args.steps), "--checkpoint-every", str(CHECKPOINT_EVERY),
             "--ckpt-dir", os.path.join(tdir, "ckpt"), "--log", log]
    extra = ["--monitor_interval", str(args.monitor_interval)] if args.monitor_interval else []
    procs = []
    stopped = set()  # agents still running when the trial ended, stopped by this script
    exited_ms = {}  # agent -> when this script saw it gone
    etcd = None
    try:
        if mode == "etcd":
            etcd, endpoint = start_etcd(tdir)
        else:
            endpoint = f"127.0.0.1:{free_port()}"

        def launch(name, host, kill):
            fault = ["--kill-agent-step", str(args.kill_step)] if kill else []
            argv = agent_argv(mode, endpoint, trial, host, train + fault)
            argv[1:1] = extra
            proc = start_session(argv, os.path.join(tdir, f"agent-{name}.out"))
            procs.append((name, proc))
            return proc

        agent_a = launch("A", True, True)
        time.sleep(0.5)  # A binds the store first (c10d); harmless for etcd
        agent_b = launch("B", False, False)
        replacement = None
        reaped_ms = None
        deadline = time.monotonic() + args.timeout
        timed_out = False
        b_gone = done = None
        next_look = 0
        while True:
            if replacement is None and agent_a.poll() is not None:
                reaped_ms = int(time.time() * 1000)
                if not args.no_replace:
                    replacement = launch("A2", True, False)
                else:
                    replacement = False
            for name, proc in procs:
                if name not in exited_ms and proc.poll() is not None:
                    exited_ms[name] = int(time.time() * 1000)
            live = [p for _, p in procs if p.poll() is None]
            if not live:
                break
            # Without agent B no group of --nnodes 2 can form again: give the others a grace
            # period to finish (or fail) and stop the trial rather than wait for their timeouts.
            # Likewise once the last step is committed: an agent whose peer is gone can wait in
            # torchrun's exit barrier for 300 s.
            if done is None and time.monotonic() >= next_look:
                next_look = time.monotonic() + 1
                if os.path.exists(log) and any(e.get("event") == "step" and e.get("step") == args.steps
                                               for e in read_events(log)):
                    done = time.monotonic()
            if b_gone is None and agent_b.poll() is not None:
                b_gone = time.monotonic()
            ended = min((t for t in (b_gone, done) if t is not None), default=None)
            if ended is not None and time.monotonic() - ended > GRACE_S:
                break
            if time.monotonic() >= deadline:
                timed_out = True
                break
            time.sleep(0.02)
    finally:
        for name, proc in procs:
            if proc.poll() is None:
                stopped.add(name)
            kill_group(proc)
        if etcd is not None:
            kill_group(etcd)

    events = read_events(log) if os.path.exists(log) else []
    row = dict(mode=mode, trial=trial, timed_out=timed_out)
    kill = next((e for e in events if e.get("event") == "kill" and e.get("target") == "agent"), None)
    steps = [e for e in events if e.get("event") == "step"]
    row["last_step"] = max((e["step"] for e in steps), default=0)
    rcs = {name: proc.returncode for name, proc in procs if name != "A"}
    row["rc"] = rcs
    row["killed_agent_rc"] = agent_a.returncode
    if kill is None:
        row.update(survived=False, note="agent A was never killed (the job did not reach the kill step); "
                   + (last_error(os.path.join(tdir, "agent-A.out")) or last_error(os.path.join(tdir, "agent-B.out"))))
        return row, tdir
    row["kill_step"] = kill["step"]
    row["reap_s"] = (reaped_ms - kill["unix_ms"]) / 1000 if reaped_ms else None
    row["b_exit_s"] = (exited_ms["B"] - kill["unix_ms"]) / 1000 if "B" in exited_ms else None
    before = {e.get("pid") for e in steps if e["unix_ms"] <= kill["unix_ms"]}
    after = [e for e in steps if e["unix_ms"] > kill["unix_ms"]]
    cont = [e for e in after if e.get("pid") in before]
    new = [e for e in after if e.get("pid") not in before]
    sec = lambda e: (e["unix_ms"] - kill["unix_ms"]) / 1000  # noqa: E731
    row["continued_s"] = sec(cont[0]) if cont else None
    row["continued_last"] = max((e["step"] for e in cont), default=None)
    row["restarted_s"] = sec(new[0]) if new else None
    if new:
        start = next((e for e in events if e.get("event") == "start" and e.get("pid") == new[0]["pid"]), None)
        if start:
            # Committed steps the new group computes again: the old workers may have gone on
            # past the kill step before they were stopped.
            row["resume_step"] = start["resume_step"]
            row["lost"] = max([kill["step"] - 1] + [e["step"] for e in cont]) - start["resume_step"]
            row["respawn_s"] = (start["proc_unix_ms"] - kill["unix_ms"]) / 1000
            row["ready_s"] = sec(start)
    row["survived"] = (not timed_out and row["last_step"] == args.steps and all(rc == 0 for rc in rcs.values()))
    notes = []
    for name, rc in rcs.items():
        if name in stopped:
            notes.append(f"agent {name} still running {GRACE_S} s after "
                         f"{'the last step' if row['last_step'] == args.steps else 'B exited'}, stopped"
                         if not timed_out else f"agent {name} stopped")
        elif rc != 0:
            notes.append(f"agent {name} exit {rc} {fmt(row['b_exit_s']) if name == 'B' else ''} after the kill: "
                         f"{last_error(os.path.join(tdir, f'agent-{name}.out'))}")
    if timed_out:
        notes.append(f"still running after {args.timeout} s; stopped")
    row["note"] = "; ".join(notes)
    return row, tdir


def fmt(value):
    return "-" if value is None else f"{value:.2f} s"


def describe(row):
    if "kill_step" not in row:
        return f"torchrun {row['mode']} trial {row['trial']}: NOT SURVIVED, {row['note']}"
    text = (f"torchrun {row['mode']} trial {row['trial']}: {'survived' if row['survived'] else 'NOT SURVIVED'}, "
            f"agent A killed before step {row['kill_step']}; kill -> restarted group's first step "
            f"{fmt(row['restarted_s'])}")
    if row.get("resume_step") is not None:
        text += (f" (its rank 0 started {fmt(row['respawn_s'])}, ready {fmt(row['ready_s'])}; "
                 f"resumed after step {row['resume_step']}, {row['lost']} committed steps lost)")
    text += (f"; old workers went on to step {row['continued_last'] or '-'} "
             f"(first {fmt(row['continued_s'])} after the kill); last step {row['last_step']}; "
             f"exit {', '.join(f'{k} {v}' for k, v in row['rc'].items())}")
    if row["note"]:
        text += f"; {row['note']}"
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--data", default="build/data/kjv.txt")
    ap.add_argument("--timeout", type=float, default=150, help="seconds per trial")
    ap.add_argument("--monitor-interval", type=float, default=None, help="torchrun --monitor_interval")
    ap.add_argument("--no-replace", action="store_true", help="do not restart the killed agent")
    ap.add_argument("--steps", type=int, default=1000,
                    help="enough that training outlasts the restart (about 40 ms a step here)")
    ap.add_argument("--kill-step", type=int, default=10)
    ap.add_argument("--keep", action="store_true", help="keep the trial directories (printed)")
    args = ap.parse_args()
    modes = args.modes.split(",")
    for mode in modes:
        if mode not in MODES:
            sys.exit(f"torchrun_takeover: unknown mode {mode} (known: {', '.join(MODES)})")
    if not os.access(args.data, os.R_OK):
        sys.exit(f"torchrun_takeover: no corpus at {args.data} (scripts/make_corpus.sh {args.data})")
    args.data = os.path.abspath(args.data)
    for tool in (TORCHRUN,) + ((ETCD,) if "etcd" in modes else ()):
        if not os.access(tool, os.X_OK):
            sys.exit(f"torchrun_takeover: no {tool}")
    if "etcd" in modes and subprocess.run([PYTHON, "-c", "import etcd"], capture_output=True).returncode:
        sys.exit("torchrun_takeover: the etcd mode needs python3-etcd (apt-get install -y python3-etcd)")

    # One thread per worker; gloo on loopback only.
    os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    torch_version = subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__)"],
                                   capture_output=True, text=True).stdout.strip()
    print(f"torchrun takeover: {NNODES} agents x {NPROC} workers, {args.steps} steps, checkpoint every "
          f"{CHECKPOINT_EVERY}, kill -9 of agent A before step {args.kill_step}, "
          f"{'no replacement' if args.no_replace else 'replacement agent started at once'}", flush=True)
    print(f"torch {torch_version}, {os.cpu_count()} CPUs, {args.trials} trials per mode, corpus {args.data}, "
          f"monitor_interval {args.monitor_interval or 'default'}", flush=True)

    work = tempfile.mkdtemp(prefix="torchrun-takeover-")
    rows = []
    # SIGTERM (a timeout around this script) unwinds like Ctrl-C, so the agents are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for mode in modes:
            for trial in range(1, args.trials + 1):
                row, tdir = run_trial(mode, trial, args, work)
                rows.append(row)
                print(describe(row), flush=True)
                print("  " + json.dumps(row), flush=True)
    finally:
        if args.keep:
            print(f"trial directories kept in {work}")
        else:
            subprocess.run(["rm", "-rf", work])

    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        alive = sum(1 for r in mine if r["survived"])
        trained = sum(1 for r in mine if r["last_step"] == args.steps)
        rec = sorted(r["restarted_s"] for r in mine if r.get("restarted_s") is not None)
        line = (f"torchrun {mode}: job survived {alive}/{len(mine)} trials (all steps committed in {trained}); "
                f"kill -> first step of a restarted group ")
        line += (f"median {statistics.median(rec):.2f} s, max {rec[-1]:.2f} s ({len(rec)} trials with one)"
                 if rec else "never (no trial restarted a group)")
        print(line, flush=True)
        down = sorted(r["b_exit_s"] for r in mine if not r["survived"] and r["rc"].get("B") not in (0, -9)
                      and r.get("b_exit_s") is not None)
        if down:
            print(f"torchrun {mode}: agent B failed (taking its workers down) median {statistics.median(down):.2f} s, "
                  f"max {down[-1]:.2f} s after the kill ({len(down)} trials)", flush=True)


if __name__ == "__main__":
    main()
