"""Issue 25, test 6: troupe under a real Slurm. Debian's slurmctld, slurmd and munge run across
network namespaces on this machine (chaos/netns/slurm_cluster.py: munged with its own key and
socket, slurmctld in the coordinator's namespace, one slurmd per node namespace, each with its
own hostname and a hosts file bind-mounted in a private mount namespace), started and stopped
here. Every job is `sbatch deploy/slurm/troupe.sbatch`, the script users submit: the coordinator
runs in the batch script on node1 (`troupe run --slurm`), one agent per node comes from
`srun --no-kill`, and the agents find the coordinator and the join token through the shared
run directory.

(a) 2 nodes x 2 ranks train exactly what one host trains with the same reduction order
    (`troupe run --world 4 --nodes 2`): every step's loss, and the final parameters bit-equal.
(b) node2's link cut at step 15 and restored 5 s later (issue 37): the job shrinks to node1's
    ranks, and when the link heals node2's agent (the task `srun --no-kill` keeps) starts its
    members again and the job grows back to 4 ranks (neither the job nor the step end), exactly:
    bit-equal to one host running 4 ranks up to the step the shrunk generation started from, 2
    ranks from its checkpoint to the step the regrown one started from, then 4 again.
(c) Preempted three times, each attempt requeued by the script (exit 75) and released as soon
    as its last attempt is gone from the nodes (Slurm holds a requeued job back 120 s):
    `scancel --batch --signal=USR1` (what `#SBATCH --signal=B:USR1@120` sends before the time
    limit: the batch shell alone, which passes it on to troupe) and `scancel --signal=TERM` (every task of the steps: the agents
    pass it on to the coordinator, the workers leave it to it) each commit the next step with a
    checkpoint and lose no rank; `scancel --full --signal=TERM` (every process, srun included,
    as cancellation, preemption and the time limit do; srun answers with SIGKILL to its tasks)
    stops with whatever checkpoint wins the race. The fourth attempt (SLURM_RESTART_COUNT 3)
    finishes, bit-equal to an uninterrupted run.

(d) A plain `scancel`: troupe still stops with 75 and a checkpoint, but the script does not
    requeue a job Slurm is cancelling; a second `sbatch` with the same run directory resumes it,
    exactly.
(e) A user's own PyTorch script (examples/python/mlp.py) under Slurm, issue 39: `sbatch
    troupe.sbatch [options] -- python3 mlp.py`; the agents start the script as the workers on
    both nodes, and the final state_dict equals the script run alone within float32 noise.

Every daemon and process is stopped by pid (Slurm's, then everything in the namespaces), also
when a part fails. Needs root, namespaces and `slurmctld slurmd slurm-client munge`; Skipped
(exit 77) otherwise."""

import os
import subprocess
import sys
import tempfile
import time

from harness import (SMALL_MODEL, TROUPE, checkpoint_param_diff, fail, main, read_events,
                     relative_difference, run_ok, step_losses)

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "chaos", "netns"))
import cluster as netns  # noqa: E402
import slurm_cluster  # noqa: E402
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
from torch_state import PYTHON, have_torch, max_relative, state_of  # noqa: E402
from netns_jobs import batch_of, run_schedule, worlds_of  # noqa: E402

SBATCH = os.path.join(REPO, "deploy", "slurm", "troupe.sbatch")
MLP = os.path.join(REPO, "examples", "python", "mlp.py")
BUILD_PYTHON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(TROUPE))), "python")
COMMON = SMALL_MODEL + ["--metrics-port", "0", "--step-timeout-ms", "30000"]
SHORT = COMMON + ["--steps", "30", "--checkpoint-every", "10"]
# Room for part (c)'s three stops: each attempt runs 20 steps past its start before the test
# signals it, and a loaded machine stretches the signal-to-stop into tens of steps (up to 78
# seen). With 200 the third signal sometimes came after the last step: the job COMPLETED
# instead of requeueing itself.
STEPS_LONG = 400
LONG = COMMON + ["--steps", str(STEPS_LONG), "--checkpoint-every", "50",
                 "--heartbeat-timeout-ms", "2000"]
REQUEUE_CODE = 75
HEAL_S = 5.0  # part (b): node2's link comes back this long after the cut
# Part (b) must still run when node2 comes back: rank 0 computes 30 times slower from step 16
# (tens of milliseconds a step; the coordinator shares node1 with it, so a delay on node1's link
# would not pace the job). The fault burns CPU and changes no number.
STEPS_CUT = 800
CUT_PLAIN = batch_of(COMMON, 24) + ["--steps", str(STEPS_CUT), "--checkpoint-every", "50",
                                    "--heartbeat-timeout-ms", "2000"]
CUT = CUT_PLAIN + ["--fault", "slow:rank=0:factor=30:from=16"]


def one_host(name, args, run_dir):
    """The same job on this host, agents as simulated nodes: the reference."""
    return step_losses(run_ok(name, args + ["--world", "4", "--nodes", "2"], run_dir, timeout=300))


class SlurmJobs:
    def __init__(self, slurm, cluster, tmp):
        self.s = slurm
        self.c = cluster
        self.tmp = tmp

    def submit(self, name, run_dir, args):
        out = os.path.join(self.tmp, f"job-{name}-%j.out")
        job = self.s.sbatch(SBATCH, ["--nodes=2", "--ntasks-per-node=2", f"--job-name={name}",
                                     f"--output={out}", f"--chdir={self.tmp}"], args,
                            env={"TROUPE": TROUPE, "TROUPE_RUN_DIR": run_dir})
        return job, out.replace("%j", job)

    def output(self, path):
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return "(no output)"

    def wait_done(self, name, job, out, timeout):
        try:
            return self.s.wait_done(job, timeout)
        except slurm_cluster.SlurmError as e:
            fail(f"{name}: {e}\n--- job output\n{self.output(out)[-6000:]}\n--- slurmctld\n"
                 f"{self.s.log('slurmctld')[-3000:]}")

    def wait_completed(self, name, job, out, timeout):
        """Waits for the job's end, which must be COMPLETED with exit 0:0; returns its output."""
        info = self.wait_done(name, job, out, timeout)
        text = self.output(out)
        if info.get("JobState") != "COMPLETED" or info.get("ExitCode") != "0:0":
            fail(f"{name}: job {job} ended {info.get('JobState')} {info.get('ExitCode')}:\n"
                 f"{text[-6000:]}")
        return text

    def wait_step(self, name, run_dir, step, job, out, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            done = [e["step"] for e in read_events(run_dir) if e.get("event") == "step"]
            if done and max(done) >= step:
                return max(done)
            info = self.s.job(job)
            if info.get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING", None):
                fail(f"{name}: the job ended ({info.get('JobState')}) before step {step}:\n"
                     f"{self.output(out)[-6000:]}")
            if time.monotonic() > deadline:
                fail(f"{name}: step {step} not committed within {timeout}s:\n"
                     f"{self.output(out)[-6000:]}")
            time.sleep(0.05)


def check_exact(name, ref, ref_dir, losses, run_dir, steps):
    if sorted(losses) != list(range(1, steps + 1)):
        fail(f"{name}: committed steps {sorted(losses)[:5]}..{sorted(losses)[-5:]}, expected "
             f"1..{steps}")
    worst = max(relative_difference(ref[s], losses[s]) for s in losses)
    params = checkpoint_param_diff(ref_dir, run_dir)
    print(f"{name}: against one host (same reduction order): loss {worst:.1e}, parameters "
          f"{params:.1e}", flush=True)
    # The loss of a step is a float64 sum of the ranks' votes in arrival order: 1e-12 leaves
    # that order free; the model must be the same to the last bit.
    if worst > 1e-12 or params != 0.0:
        fail(f"{name}: differs from one host: loss by {worst:.2e}, parameters by {params:.2e} "
             "(expected bit-equal)")


def part_a(jobs, tmp, ref, ref_dir):
    name = "a-two-nodes"
    run_dir = os.path.join(tmp, name)
    t0 = time.monotonic()
    job, out = jobs.submit(name, run_dir, SHORT)
    text = jobs.wait_completed(name, job, out, 120)
    took = time.monotonic() - t0
    events = read_events(run_dir)
    hosts = sorted({e["host"] for e in events if e.get("event") == "agent_joined"})
    rank_hosts = sorted({e["host"] for e in events if e.get("event") == "rank_joined"})
    if hosts != ["node1", "node2"] or rank_hosts != ["node1", "node2"]:
        fail(f"{name}: agents on {hosts}, ranks on {rank_hosts}; expected node1 and node2:\n{text}")
    for words in ("coordinator on node1", "--no-kill", "SLURM_NODEID 0 of 2", "SLURM_NODEID 1 of 2",
                  "rendezvous.json"):
        if words not in text:
            fail(f"{name}: '{words}' is not in the job's output:\n{text}")
    if os.path.exists(os.path.join(run_dir, "rendezvous.json")):
        fail(f"{name}: the coordinator left its rendezvous.json behind")
    mode = os.stat(os.path.join(run_dir, "join.token")).st_mode & 0o777
    if mode != 0o600:
        fail(f"{name}: join.token has mode {oct(mode)}, expected 0600")
    check_exact(name, ref, ref_dir, step_losses(events), run_dir, 30)
    print(f"{name}: job {job} COMPLETED in {took:.1f}s (sbatch to end), agents on {hosts}",
          flush=True)


def part_b(jobs, tmp):
    name = "b-node-cut"
    run_dir = os.path.join(tmp, name)
    job, out = jobs.submit(name, run_dir, CUT)
    at = jobs.wait_step(name, run_dir, 15, job, out)
    cut = jobs.c.cut("n2")
    t_cut = time.monotonic()
    print(f"{name}: cut node2's link at step {at}; heal in {HEAL_S:.0f}s", flush=True)
    while time.monotonic() < t_cut + HEAL_S:
        time.sleep(0.05)
    cut.revert()
    heal_ms = time.time() * 1000
    healed = time.monotonic()
    deadline = healed + 60
    while not any(e.get("event") == "generation" and e.get("world") == 4 and
                  e.get("unix_ms", 0) >= heal_ms for e in read_events(run_dir)):
        if time.monotonic() > deadline or jobs.s.job(job).get("JobState") not in (
                "RUNNING", "CONFIGURING"):
            fail(f"{name}: no generation of 4 ranks within 60s of the heal:\n"
                 f"{jobs.output(out)[-6000:]}")
        time.sleep(0.05)
    regrow_s = time.monotonic() - healed
    text = jobs.wait_completed(name, job, out, 150)
    took = time.monotonic() - t_cut
    events = read_events(run_dir)
    lost = [e for e in events if e.get("event") == "rank_lost"]
    generations = [e for e in events if e.get("event") == "generation"]
    shrunk = [g for g in generations if g.get("world") == 2]
    regrown = [g for g in generations if g.get("world") == 4 and g.get("number", 0) > 1]
    if len(lost) < 2 or not shrunk or not regrown or generations[-1].get("world") != 4:
        fail(f"{name}: expected node2's two ranks lost, a generation of world 2 and the job back "
             f"on 4; lost {lost}, generations "
             f"{[(g.get('number'), g.get('world')) for g in generations]}:\n{text[-6000:]}")
    node2 = {e["host"] for e in events if e.get("event") == "rank_joined" and
             e.get("unix_ms", 0) >= heal_ms}
    if node2 != {"node2"}:
        fail(f"{name}: expected node2's members to join again after the heal, joined on {node2}")
    # One host trains the same through the same worlds: 4 ranks to the step the shrunk
    # generation started from, 2 from its checkpoint to the step the regrown one started from,
    # then 4 again (3 in between when node2's members came back one at a time).
    first, second = shrunk[0]["start_step"], regrown[0]["start_step"]
    schedule = worlds_of(events, STEPS_CUT)
    ref_dir = os.path.join(tmp, "ref-cut")
    reference = run_schedule("one host", CUT_PLAIN, schedule, ref_dir)
    first_node = [e["host"] for e in events if e.get("event") == "agent_joined"][0]
    if first_node == "node1":
        check_exact(name, reference, ref_dir, step_losses(events), run_dir, STEPS_CUT)
    else:
        # srun started node2's agent first: it is the job's node 0, and once its members are
        # back as ranks 2 and 3 the nodes' shares are summed in the other order than on one
        # host (a difference of 1e-8 that training grows). Bit-equal up to the regrowth, the
        # same training after it.
        losses = step_losses(events)
        before = [s for s in losses if s <= second]
        worst_before = max(relative_difference(reference[s], losses[s]) for s in before)
        tail = range(STEPS_CUT - 49, STEPS_CUT + 1)
        mean_got = sum(losses[s] for s in tail) / len(tail)
        mean_ref = sum(reference[s] for s in tail) / len(tail)
        print(f"{name}: node2 joined first: loss {worst_before:.1e} from one host up to step "
              f"{second}; mean loss of the last 50 steps {mean_got:.4f} against "
              f"{mean_ref:.4f}", flush=True)
        if sorted(losses) != list(range(1, STEPS_CUT + 1)) or worst_before > 1e-12 or \
                relative_difference(mean_ref, mean_got) > 0.02:
            fail(f"{name}: differs from one host: {worst_before:.2e} up to step {second} "
                 f"(expected bit-equal); mean loss of the last 50 steps {mean_got:.4f} against "
                 f"{mean_ref:.4f} (expected within 2 %)")
    states = jobs.s.node_states()
    print(f"{name}: node2's ranks lost ({', '.join(sorted({e.get('cause', '?') for e in lost}))}), "
          f"world 2 from step {first}, back to 4 from step {second} {regrow_s:.1f}s after the "
          f"heal (worlds {schedule}); job COMPLETED {took:.1f}s after the cut; Slurm now says "
          f"{states}", flush=True)
    # node2 ready for the next part, should Slurm have marked it DOWN during the cut.
    deadline = time.monotonic() + 60
    while not jobs.s.node_states().get("node2", "").startswith("idle"):
        jobs.s.scontrol("update", "nodename=node2", "state=resume", check=False)
        if time.monotonic() > deadline:
            fail(f"{name}: node2 not idle again after the heal: {jobs.s.node_states()}")
        time.sleep(0.5)


def preempt(jobs, name, job, out, run_dir, at_least, how, restarts, expect_words=(),
            strict=True):
    """Signals the running attempt once it committed step `at_least` (`how`: scancel options),
    then checks that it stopped with exit 75 and that the job requeued itself, and (`strict`)
    that no rank was lost and its last committed step is checkpointed; releases it. Returns
    the step the next attempt resumes from (the last committed checkpoint)."""
    at = jobs.wait_step(name, run_dir, at_least, job, out)
    t_signal = time.monotonic()
    subprocess.run(["scancel"] + how + [job], env=jobs.s.env(), check=True, capture_output=True,
                   timeout=30)
    # The attempt ends with 75 and requeues itself; Slurm holds a requeued job back (BeginTime
    # +120 s): the test releases it at once rather than wait for that policy.
    deadline = time.monotonic() + 90
    while True:
        info = jobs.s.job(job)
        if info.get("Restarts") == str(restarts) and info.get("JobState") == "PENDING":
            requeued_by = time.time()  # Slurm revoked the attempt's credential before this
            break
        if info.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            fail(f"{name}: job {job} ended {info.get('JobState')} {info.get('ExitCode')} instead of "
                 f"requeueing itself after `scancel {' '.join(how)}`:\n{jobs.output(out)[-6000:]}")
        if time.monotonic() > deadline:
            fail(f"{name}: job {job} not requeued within 90s after `scancel {' '.join(how)}` "
                 f"({info.get('JobState')}):\n{jobs.output(out)[-6000:]}")
        time.sleep(0.1)
    stopped = time.monotonic() - t_signal
    attempt = read_events(run_dir)
    starts = [i for i, e in enumerate(attempt) if e.get("event") == "job_start"]
    if len(starts) != restarts:
        fail(f"{name}: {len(starts)} job starts in events.jsonl, expected {restarts}")
    attempt = attempt[starts[-1]:]
    preempted = [e for e in attempt if e.get("event") == "preempted"]
    ended = [e for e in attempt if e.get("event") in ("job_done", "job_failed")]
    checkpoints = [e["step"] for e in attempt if e.get("event") == "checkpoint"]
    if not preempted or not ended or ended[-1].get("exit_code") != REQUEUE_CODE:
        fail(f"{name}: expected a preempted event and exit {REQUEUE_CODE} after `scancel "
             f"{' '.join(how)}`; got {preempted} {ended}:\n{jobs.output(out)[-6000:]}")
    lost = [e for e in attempt if e.get("event") in ("rank_lost", "worker_exited")]
    if strict and lost:
        fail(f"{name}: ranks were lost while the job stopped for the scheduler: {lost}\n"
             f"{jobs.output(out)[-6000:]}")
    last_step = max(e["step"] for e in attempt if e.get("event") == "step")
    if strict and (not checkpoints or max(checkpoints) != last_step or last_step <= at):
        fail(f"{name}: the last committed step {last_step} (signal at step {at}) is not the last "
             f"checkpoint {checkpoints}")
    resume_at = max(checkpoints) if checkpoints else attempt[0].get("start_step", 0)
    text = jobs.output(out)
    if text.count(f"troupe exited with code {REQUEUE_CODE}") != restarts or \
            text.count(f"requeued job {job}") != restarts:
        fail(f"{name}: the job's output does not show {restarts} exits with {REQUEUE_CODE} and "
             f"requeues:\n{text[-6000:]}")
    for words in expect_words:
        if words not in text:
            fail(f"{name}: '{words}' is not in the job's output:\n{text[-6000:]}")
    print(f"{name}: `scancel {' '.join(how)}` at step {at}: stopped after step {last_step} with "
          f"checkpoint step {resume_at} and exit {REQUEUE_CODE}"
          f"{f' ({len(lost)} ranks lost first)' if lost else ''}; requeued {stopped:.1f}s after "
          "the signal", flush=True)
    release(jobs, name, job, requeued_by)
    return resume_at


def release(jobs, name, job, requeued_by):
    """Lets a requeued job start again at once instead of after Slurm's hold. Not before its
    last attempt is gone from the nodes and the clock has left the second in which Slurm
    revoked that attempt's credential: slurmd refuses a credential that is not newer, to the
    second, than the revocation ("Job 1 already killed, do not launch batch job"; slurmctld:
    "Killing non-startable batch JobId=1: Job credential revoked"), and the job then FAILS
    with exit 1 before its script runs. Slurm's own hold keeps real jobs far from that."""
    deadline = time.monotonic() + 60
    while True:
        states = jobs.s.node_states()
        done = all(states.get(n, "") == "idle" for n in jobs.s.node_names.values())
        if done and time.time() >= int(requeued_by) + 1:
            break
        if time.monotonic() > deadline:
            fail(f"{name}: job {job}'s requeued attempt still on the nodes after 60s: {states}")
        time.sleep(0.1)
    jobs.s.scontrol("update", f"jobid={job}", "StartTime=now")


def part_c(jobs, tmp, ref, ref_dir):
    name = "c-preempt"
    run_dir = os.path.join(tmp, name)
    job, out = jobs.submit(name, run_dir, LONG)
    # What `#SBATCH --signal=B:USR1@120` sends before the time limit: the batch shell alone,
    # which passes it on to troupe.
    first = preempt(jobs, name, job, out, run_dir, 20, ["--batch", "--signal=USR1"], 1)
    # What `--signal=TERM@120` (no B:) and `scancel --signal=TERM` send: every task of the
    # steps, the agents and their workers. The agents pass it on to the coordinator, the workers
    # leave it to the coordinator: no rank is lost, the job stops with its checkpoint.
    second = preempt(jobs, name, job, out, run_dir, first + 20, ["--signal=TERM"], 2,
                     ["SIGTERM from the scheduler: asked the coordinator",
                      "troupe worker: SIGTERM from the scheduler: left to the coordinator"])
    # What cancellation, preemption and the time limit send: SIGTERM to every process of the
    # job, srun included, which kills its tasks at once (SIGKILL). Best effort: the next step's
    # checkpoint if it wins the race, else the last one committed; exit 75 either way.
    third = preempt(jobs, name, job, out, run_dir, second + 20, ["--full", "--signal=TERM"], 3,
                    strict=False)
    t_resume = time.monotonic()
    info = jobs.wait_done(name, job, out, 150)
    text = jobs.output(out)
    if info.get("JobState") != "COMPLETED" or info.get("ExitCode") != "0:0" or \
            info.get("Restarts") != "3":
        fail(f"{name}: the requeued job ended {info.get('JobState')} {info.get('ExitCode')} "
             f"(restarts {info.get('Restarts')}):\n{text[-6000:]}")
    events = read_events(run_dir)
    starts = [(e.get("resume"), e.get("start_step")) for e in events
              if e.get("event") == "job_start"]
    if starts != [(False, 0), (True, first), (True, second), (True, third)]:
        fail(f"{name}: job starts (resume, start step) {starts}; expected a fresh start, then "
             f"resumes from steps {first}, {second} and {third}")
    for words in ("restart 1", "restart 2", "restart 3"):
        if words not in text:
            fail(f"{name}: no requeued attempt says '{words}':\n{text[-4000:]}")
    check_exact(name, ref, ref_dir, step_losses(events), run_dir, STEPS_LONG)
    print(f"{name}: the job resumed from steps {first}, {second} and {third} and finished "
          f"{time.monotonic() - t_resume:.1f}s after its last release", flush=True)


def part_d(jobs, tmp, ref, ref_dir):
    name = "d-cancel"
    run_dir = os.path.join(tmp, name)
    job, out = jobs.submit(name, run_dir, LONG)
    at = jobs.wait_step(name, run_dir, 20, job, out)
    subprocess.run(["scancel", job], env=jobs.s.env(), check=True, capture_output=True,
                   timeout=30)
    info = jobs.wait_done(name, job, out, 60)
    text = jobs.output(out)
    if info.get("JobState") != "CANCELLED" or info.get("Restarts") != "0":
        fail(f"{name}: a cancelled job must stay cancelled: {info.get('JobState')}, restarts "
             f"{info.get('Restarts')}:\n{text[-6000:]}")
    events = read_events(run_dir)
    ended = [e for e in events if e.get("event") in ("job_done", "job_failed")]
    checkpoints = [e["step"] for e in events if e.get("event") == "checkpoint"]
    for words in (f"troupe exited with code {REQUEUE_CODE}", "not requeued"):
        if words not in text:
            fail(f"{name}: '{words}' is not in the job's output:\n{text[-6000:]}")
    if not ended or ended[-1].get("exit_code") != REQUEUE_CODE or not checkpoints:
        fail(f"{name}: expected exit {REQUEUE_CODE} with a checkpoint after scancel; got "
             f"{ended}, checkpoints {checkpoints}")
    # A second submission with the same run directory resumes it.
    again, out2 = jobs.submit(name + "-again", run_dir, LONG)
    info = jobs.wait_done(name, again, out2, 120)
    if info.get("JobState") != "COMPLETED":
        fail(f"{name}: the second submission ended {info.get('JobState')}:\n"
             f"{jobs.output(out2)[-6000:]}")
    events = read_events(run_dir)
    starts = [(e.get("resume"), e.get("start_step")) for e in events
              if e.get("event") == "job_start"]
    if starts != [(False, 0), (True, max(checkpoints))]:
        fail(f"{name}: job starts {starts}, expected a resume from step {max(checkpoints)}")
    check_exact(name, ref, ref_dir, step_losses(events), run_dir, STEPS_LONG)
    print(f"{name}: scancel at step {at}: CANCELLED, not requeued, exit {REQUEUE_CODE} with "
          f"checkpoint step {max(checkpoints)}; a second sbatch resumed from it", flush=True)


def part_e(jobs, tmp):
    """A user's own PyTorch script under Slurm (issue 39): `sbatch troupe.sbatch [options] --
    python3 mlp.py`; the agents on both nodes start the script as the workers, and world 4
    trains what the script trains alone, within float32 noise."""
    name = "e-python"
    if not have_torch() or not os.path.isfile(os.path.join(BUILD_PYTHON, "troupe",
                                                              "__init__.py")):
        print(f"{name}: skipped (no torch for {PYTHON}, or the troupe module is not built)",
              flush=True)
        return
    run_dir = os.path.join(tmp, name)
    shape = ["--steps", "20", "--batch", "32", "--micro-batch", "8"]
    alone, together = os.path.join(tmp, "e-alone.pt"), os.path.join(tmp, "e-slurm.pt")
    env = dict(os.environ, PYTHONPATH=BUILD_PYTHON)
    for k in [k for k in env if k.startswith("TROUPE_")]:
        del env[k]
    p = subprocess.run([PYTHON, MLP] + shape + ["--seed", "7", "--out", alone], env=env,
                       cwd=tmp, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        fail(f"{name}: mlp.py alone exited {p.returncode}:\n{p.stdout}{p.stderr}")
    job, out = jobs.submit(name, run_dir, shape + [
        "--seed", "7", "--eval-every", "0", "--no-progress", "--metrics-port", "0",
        "--", PYTHON, MLP] + shape + ["--out", together])
    text = jobs.wait_completed(name, job, out, 180)
    events = read_events(run_dir)
    rank_hosts = sorted({e["host"] for e in events if e.get("event") == "rank_joined"})
    steps = sorted(e["step"] for e in events if e.get("event") == "step")
    if rank_hosts != ["node1", "node2"] or steps != list(range(1, 21)):
        fail(f"{name}: ranks on {rank_hosts}, steps {steps}; expected both nodes, 1..20:\n"
             f"{text[-6000:]}")
    diff = max_relative(state_of(alone), state_of(together))
    if diff > 1e-4:
        fail(f"{name}: world 4 under Slurm differs from the script alone by {diff:.3g}")
    print(f"{name}: job {job} COMPLETED: the script's workers on both nodes, its final "
          f"state_dict within {diff:.2g} of the script alone", flush=True)


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-slurm-", dir="/tmp") as tmp:
        t0 = time.monotonic()
        short_ref_dir = os.path.join(tmp, "ref-short")
        short_ref = one_host("one host, 30 steps", SHORT, short_ref_dir)
        long_ref_dir = os.path.join(tmp, "ref-long")
        long_ref = one_host(f"one host, {STEPS_LONG} steps", LONG, long_ref_dir)
        print(f"references on one host: {time.monotonic() - t0:.1f}s", flush=True)
        with netns.Cluster(nodes=2, verbose=False) as c, \
                slurm_cluster.Slurm(c, os.path.join(tmp, "slurm")) as s:
            jobs = SlurmJobs(s, c, tmp)
            for part in (lambda: part_a(jobs, tmp, short_ref, short_ref_dir),
                         lambda: part_b(jobs, tmp),
                         lambda: part_c(jobs, tmp, long_ref, long_ref_dir),
                         lambda: part_d(jobs, tmp, long_ref, long_ref_dir),
                         lambda: part_e(jobs, tmp)):
                started = time.monotonic()
                part()
                print(f"  ({time.monotonic() - started:.1f}s)", flush=True)
        print(f"total {time.monotonic() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    slurm_cluster.require_slurm()  # exit 77 (Skipped) without root, namespaces or Slurm
    main(test)
