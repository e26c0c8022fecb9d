"""Issue 41: the simulator's members are checked against real workers. One job of world 10:
members 0 and 1 are real `troupe agent --ranks 2` workers on the null data plane
(TROUPE_TRANSPORT=null: their collectives do nothing, so each trains on its own data), members
2..9 are simulated (`troupe bench control-plane --coordinator ... --first-member 2`). The job
trains and commits every step, loses one simulated member after step 12 (the bench kills only
its own), goes on at world 9, and every process exits 0. It checkpoints every 10 steps: the
real ranks and the simulated ones write their shares into the same run directory, and the
coordinator commits manifests of both (the simulated ranks' shares are checked as a real
rank's: the same optimizer step, pieces that tile every tensor with the real ones)."""

import json
import os
import signal
import subprocess
import tempfile
import time

from harness import TROUPE, Job, fail, main, pid_alive, wait_until

WORLD, REAL, STEPS, LOSE_AT = 10, 2, 30, 12
DEADLINE_S = 240  # for the whole job; the test's TIMEOUT is 300
# The smallest model: the control plane is what is checked. --peak-flops skips the FLOP/s
# measurement at start, which no one reads here.
COORDINATOR = ["--host", "127.0.0.1", "--port", "0", "--metrics-port", "0", "--world",
               str(WORLD), "--steps", str(STEPS), "--checkpoint-every", "10", "--eval-every", "0",
               "--layers", "1", "--heads", "1", "--d-model", "16", "--context", "16", "--batch",
               str(WORLD), "--micro-batch", "1", "--peak-flops", "1e12", "--no-progress"]


def tail(path, lines=60):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return f"({path} unreadable)"


def endpoint_of(run_dir):
    """HOST:PORT from RUN_DIR/coordinator.addr once it and the join token exist."""
    addr = os.path.join(run_dir, "coordinator.addr")
    if not (os.path.exists(addr) and os.path.exists(os.path.join(run_dir, "join.token"))):
        return None
    line = open(addr).read().split("\n", 1)[0].strip()
    return line or None


def wait_all(procs, deadline, logs):
    """Waits for every process in `procs` (name -> Popen) until `deadline`; the first to end
    with a non-zero code fails the test at once. Returns name -> exit code."""
    codes = {}
    while len(codes) < len(procs):
        for name, p in procs.items():
            if name in codes or p.poll() is None:
                continue
            codes[name] = p.returncode
            if p.returncode != 0:
                fail(f"{name} exited {p.returncode} (others so far: {codes})\n{logs()}")
        if time.monotonic() > deadline:
            running = [n for n in procs if n not in codes]
            fail(f"{running} still running after {DEADLINE_S} s\n{logs()}")
        time.sleep(0.1)
    return codes


def check_events(events):
    problems = []
    steps = {e.get("step") for e in events if e.get("event") == "step"}
    missing = sorted(set(range(1, STEPS + 1)) - steps)
    if missing:
        problems.append(f"no step event for steps {missing}")
    worlds = [e.get("world") for e in events if e.get("event") == "generation"]
    if not worlds or worlds[0] != WORLD or WORLD - 1 not in worlds[1:]:
        problems.append(f"generations of worlds {worlds}: expected {WORLD}, then {WORLD - 1}")
    lost = [e for e in events if e.get("event") == "rank_lost"]
    if len(lost) != 1 or not REAL <= lost[0].get("member", -1) < WORLD:
        problems.append(f"expected one simulated member lost, got {lost}")
    elif not LOSE_AT <= lost[0].get("step", -1) <= LOSE_AT + 1:  # its kill races one vote
        problems.append(f"the loss came after step {lost[0].get('step')}, not {LOSE_AT}")
    backends = {e.get("backend") for e in events if e.get("event") == "transport"}
    if backends != {"null"}:
        problems.append(f"transport backends {backends}: every member asked for null")
    joined = {e.get("member") for e in events if e.get("event") == "rank_joined"}
    if joined != set(range(WORLD)):
        problems.append(f"members {sorted(joined)} joined, expected 0..{WORLD - 1}")
    # The agent reports a worker that ends before the job does; the real ones must not.
    exits = [e for e in events if e.get("event") == "worker_exited"]
    if exits:
        problems.append(f"real workers exited during the job: {exits}")
    if not any(e.get("event") == "job_done" for e in events):
        problems.append("no job_done event")
    committed = sorted(e.get("step") for e in events if e.get("event") == "checkpoint")
    failed = [e for e in events if e.get("event") == "checkpoint_failed"]
    # Step 10's may still be collecting its shares when the loss after step 12 ends its
    # generation: then it is abandoned and the next step committed writes one in its place.
    if len(committed) != 3 or not 10 <= committed[0] <= LOSE_AT + 3 or \
            committed[1:] != [20, 30] or failed:
        problems.append(f"checkpoints committed at steps {committed} (expected 10 or its "
                        f"stand-in, 20, 30), failed: {failed}")
    return problems


def manifest_problems(run_dir):
    """The last checkpoint (step 30, world 9) holds shares of every rank, real and simulated."""
    try:
        with open(os.path.join(run_dir, "checkpoints", "step-00000030", "manifest.json")) as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        return [f"the manifest of step 30: {e}"]
    ranks = {p["rank"] for p in m["pieces"] if p["tensor"] == "wte.weight"}
    if m.get("world") != WORLD - 1 or ranks != set(range(WORLD - 1)):
        return [f"the manifest of step 30 is of world {m.get('world')} with shares of wte from "
                f"ranks {sorted(ranks)}, not every rank of world {WORLD - 1}"]
    return []


def check_bench(out):
    try:
        r = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [f"the bench's stdout is not one JSON object: {out!r}"], {}
    problems = []
    expected = {"members": WORLD - REAL, "first_member": REAL, "steps": STEPS, "lost": 1,
                "coordinator_exit": None}
    for key, want in expected.items():
        if r.get(key, "absent") != want:
            problems.append(f"bench {key} = {r.get(key, 'absent')!r}, not {want!r}")
    if not isinstance(r.get("loss_to_commit_s"), (int, float)) or r["loss_to_commit_s"] <= 0:
        problems.append(f"bench loss_to_commit_s = {r.get('loss_to_commit_s')!r}")
    # Another's coordinator: no /proc figures, and no events figures without its run dir.
    for key in ("coordinator_rss_bytes", "coordinator_cpu_s_per_step", "events_bytes",
                "events_bytes_per_step", "rss_per_member_bytes"):
        if key in r:
            problems.append(f"bench reported {key} = {r[key]} of a coordinator it did not start")
    return problems, r


def bad_first_member():
    """--first-member is refused with exit 2 and one line: out of range, or without another's
    coordinator (the one the bench starts expects members 0..N-1)."""
    cases = [["--members", "8", "--first-member", "2"],
             ["--members", "8", "--first-member", "-1", "--coordinator", "x:1", "--join-token",
              "t"],
             ["--members", "8", "--first-member", str(1 << 20), "--coordinator", "x:1",
              "--join-token", "t"]]
    for args in cases:
        p = subprocess.run([TROUPE, "bench", "control-plane"] + args, capture_output=True,
                           text=True, timeout=30)
        out = (p.stdout + p.stderr).strip()
        if p.returncode != 2 or "--first-member" not in out or len(out.splitlines()) != 1:
            fail(f"{args}: expected exit 2 and one line naming --first-member, got "
                 f"{p.returncode}:\n{out}")


def test():
    bad_first_member()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="troupe-mixed-test-") as tmp, \
            Job(COORDINATOR, command="coordinator") as coord:
        endpoint = wait_until(lambda: endpoint_of(coord.run_dir), 60, "the coordinator's address")
        token = os.path.join(coord.run_dir, "join.token")
        agent_log_path = os.path.join(tmp, "agent.log")
        bench_err_path = os.path.join(tmp, "bench.err")
        bench_out_path = os.path.join(tmp, "bench.out")
        with open(agent_log_path, "w") as agent_log, open(bench_err_path, "w") as bench_err, \
                open(bench_out_path, "w") as bench_out:
            # The agent's workers inherit its environment: both run on the null data plane.
            agent = subprocess.Popen(
                [TROUPE, "agent", "--coordinator", endpoint, "--join-token", token, "--ranks",
                 str(REAL)], stdout=agent_log, stderr=subprocess.STDOUT,
                env=dict(os.environ, TROUPE_TRANSPORT="null"))
            coord.extra_pids.append(agent.pid)
            # Its own session: the simulator processes it forks die with it (killpg by its pid).
            bench = subprocess.Popen(
                [TROUPE, "bench", "control-plane", "--coordinator", endpoint, "--join-token",
                 token, "--members", str(WORLD - REAL), "--first-member", str(REAL), "--steps",
                 str(STEPS), "--step-ms", "50", "--lose", "1", "--lose-at", str(LOSE_AT),
                 "--json"], stdout=bench_out, stderr=bench_err, start_new_session=True)

            def logs():
                return (f"coordinator:\n{coord.output()[-3000:]}\nagent:\n"
                        f"{tail(agent_log_path)}\nbench:\n{tail(bench_err_path)}")

            try:
                procs = {"coordinator": coord.proc, "agent": agent, "bench": bench}
                wait_all(procs, start + DEADLINE_S, logs)
            finally:
                if bench.poll() is None:
                    os.killpg(bench.pid, signal.SIGKILL)
                    bench.wait(timeout=30)
                # The coordinator, the agent and the workers it reported: Job.close kills them.
        wall = time.monotonic() - start
        problems = check_events(coord.events()) + manifest_problems(coord.run_dir)
        bench_problems, r = check_bench(open(bench_out_path).read())
        problems += bench_problems
        agent_text = open(agent_log_path, errors="replace").read()
        warning = "null data plane: collectives do nothing (control-plane tests only)"
        if agent_text.count(warning) != REAL:
            problems.append(f"the null data plane's warning appears {agent_text.count(warning)} "
                            f"times in the agent's log, not once per real worker ({REAL})")
        if problems:
            fail("; ".join(problems) + f"\n{logs()}")
        real = [e["pid"] for e in coord.events()
                if e.get("event") == "rank_joined" and e.get("member", WORLD) < REAL]
        wait_until(lambda: not any(pid_alive(p) for p in real), 20, f"real workers {real} to exit")
        print(f"mixed job of {REAL} real and {WORLD - REAL} simulated members: {STEPS} steps, "
              f"one simulated member lost after step {LOSE_AT}, all exited 0 in {wall:.1f} s; "
              f"bench: loss_to_commit_s {r.get('loss_to_commit_s'):.3f}, "
              f"step_control_ms_p50 {r.get('step_control_ms_p50'):.1f}", flush=True)


if __name__ == "__main__":
    main(test)
