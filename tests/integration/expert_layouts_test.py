"""Exactness of expert-parallel layouts in real jobs: an MoE model (4 experts, top-2 and
top-1, a capacity factor low enough that tokens are dropped) trains 20 steps on ep2
(--world 2 --ep 2) and dp2xep2 (--world 4 --ep 2) with the same loss at every step as one
rank (within 1e-4 relative), the same final validation loss, and the same final parameters,
read back from the checkpoints in the single-rank layout (checkpoint_diff, within 1e-4). Every step writes an
`expert_load` event whose per-block totals are tokens * top_k, with some drops; a checkpoint
of ep2 resumes on dp2xep2; --micro-batches sets the micro-batches the ep ranks share (or is
refused with exit 2 when they cannot share them); and /metrics exports
troupe_expert_tokens_total{block,expert}, which promtool accepts."""

import os
import signal
import subprocess
import tempfile
import urllib.request

from harness import (SMALL_MODEL, Job, checkpoint_param_diff, fail, free_port, last_job, main,
                     relative_difference, run_ok, run_to_end, step_losses, wait_until)

STEPS = 20
MOE = ["--experts", "4", "--set", "model.capacity_factor=0.75"]
COMMON = SMALL_MODEL + MOE + ["--steps", str(STEPS), "--metrics-port", "0", "--checkpoint-every", "10"]
LAYOUTS = {
    "ep2": ["--world", "2", "--ep", "2"],
    "dp2xep2": ["--world", "4", "--ep", "2"],
}


def option(args, name):
    return int(args[args.index(name) + 1])






def run(name, args, run_dir):
    return run_ok(name, COMMON + args, run_dir, timeout=300)


def check_expert_load(name, events, top_k):
    """One expert_load event per step, each block's tokens summing to tokens * top_k."""
    tokens = option(SMALL_MODEL, "--batch") * option(SMALL_MODEL, "--context")
    loads = {e["step"]: e for e in events if e.get("event") == "expert_load"}
    if sorted(loads) != list(range(1, STEPS + 1)):
        fail(f"{name}: expert_load events for steps {sorted(loads)}")
    dropped = 0
    for step, e in loads.items():
        if len(e["tokens"]) != option(SMALL_MODEL, "--layers") or any(len(b) != 4 for b in e["tokens"]):
            fail(f"{name}: step {step} expert_load has shape {[len(b) for b in e['tokens']]}")
        for block, counts in enumerate(e["tokens"]):
            if sum(counts) != tokens * top_k:
                fail(f"{name}: step {step} block {block} routed {sum(counts)} choices, not {tokens * top_k}")
        dropped += sum(e["dropped"])
    if dropped == 0:
        fail(f"{name}: capacity dropped no token in {STEPS} steps; lower the capacity factor")
    return loads, dropped


def validation(events):
    """The final validation loss (the job evaluates after its last step)."""
    values = [e["val_loss"] for e in events if e.get("event") == "validation"]
    if not values:
        fail("no validation event")
    return values[-1]


def exactness(tmp, top_k, layouts):
    extra = ["--top-k", str(top_k)]
    ref_dir = os.path.join(tmp, f"one_top{top_k}")
    ref_events = run("one rank", ["--world", "1"] + extra, ref_dir)
    reference = step_losses(ref_events)
    ref_loads, ref_dropped = check_expert_load(f"one rank top-{top_k}", ref_events, top_k)
    for name in layouts:
        run_dir = os.path.join(tmp, f"{name}_top{top_k}")
        events = run(name, LAYOUTS[name] + extra, run_dir)
        layout = next(e["layout"] for e in events if e.get("event") == "training_started")
        losses = step_losses(events)
        if sorted(losses) != sorted(reference):
            fail(f"{name} top-{top_k} trained steps {sorted(losses)}")
        worst = max(relative_difference(reference[s], losses[s]) for s in reference)
        params = checkpoint_param_diff(ref_dir, run_dir)
        loads, dropped = check_expert_load(f"{name} top-{top_k}", events, top_k)
        same = sum(loads[s]["tokens"] == ref_loads[s]["tokens"] for s in loads)
        val = relative_difference(validation(ref_events), validation(events))
        print(f"{name:8s} top-{top_k} ({layout['describe']}): loss {worst:.2e}, final parameters {params:.2e}, "
              f"validation {val:.2e}, dropped {dropped} (one rank {ref_dropped}), routing equal to one rank in "
              f"{same}/{STEPS} steps")
        if worst > 1e-4 or params > 1e-4 or val > 1e-4:
            fail(f"{name} top-{top_k} is not exact against one rank")
    return ref_dir, reference


def scrape_metrics():
    port = free_port()
    args = SMALL_MODEL + MOE + ["--top-k", "2", "--world", "2", "--ep", "2", "--steps", "100000",
                                "--metrics-port", str(port), "--checkpoint-every", "0"]
    with Job(args) as job:
        wait_until(lambda: any(e.get("event") == "expert_load" and e["step"] >= 2 for e in job.events()), 120,
                   "two steps' expert_load events")
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        series = [line for line in body.splitlines() if line.startswith("troupe_expert_tokens_total{")]
        if len(series) != option(SMALL_MODEL, "--layers") * 4:
            fail(f"expected one troupe_expert_tokens_total series per block and expert, got:\n{body}")
        if not any(float(line.split()[-1]) > 0 for line in series):
            fail(f"troupe_expert_tokens_total is zero everywhere:\n{body}")
        if "troupe_expert_dropped_total{" not in body:
            fail(f"troupe_expert_dropped_total missing from /metrics:\n{body}")
        check = subprocess.run(["promtool", "check", "metrics"], input=body.encode(), capture_output=True)
        if check.returncode != 0:
            fail(f"promtool check metrics failed:\n{check.stdout.decode()}{check.stderr.decode()}")
        print(f"/metrics: {len(series)} troupe_expert_tokens_total series, e.g. {series[0]}; promtool ok")
        job.proc.send_signal(signal.SIGINT)
        if job.wait(60) != 130:
            fail(f"Ctrl-C should end the job with exit code 130:\n{job.output()}")


def rejected_layouts():
    """Micro-batches the ep group cannot share, and tp with experts, exit 2 naming the rule."""
    cases = [(["--world", "2", "--ep", "2", "--micro-batch", "1"], "must divide micro_batch (1)"),
             # --micro-batches sets the micro-batch the ep ranks share: 8 / 8 = 1 sequence.
             (["--world", "2", "--ep", "2", "--micro-batches", "8"], "(8 / 8 = 1)"),
             (["--world", "2", "--tp", "2"], "dp x ep only")]
    for args, reason in cases:
        code, _, output = run_to_end(SMALL_MODEL + MOE + ["--metrics-port", "0"] + args, timeout=60)
        if code != 2 or reason not in output:
            fail(f"{args} should exit 2 naming '{reason}', got {code}:\n{output}")
    print(f"{len(cases)} impossible MoE layouts exit 2 with the reason")


def micro_batches_honoured(tmp, reference):
    """--micro-batches decides the micro-batches an ep group shares (the plan's, not
    --micro-batch's): ep2 with --micro-batches 2 (4 sequences each) trains what one rank trains
    with --micro-batch 4, and not what the default micro-batches of 2 train."""
    extra = ["--top-k", "2"]
    one_dir = os.path.join(tmp, "one_mb4")
    one = step_losses(run("one rank, micro-batch 4", ["--world", "1", "--micro-batch", "4"] + extra, one_dir))
    ep_dir = os.path.join(tmp, "ep2_m2")
    ep = step_losses(run("ep2, 2 micro-batches", LAYOUTS["ep2"] + ["--micro-batches", "2"] + extra, ep_dir))
    if sorted(ep) != sorted(one):
        fail(f"ep2 --micro-batches 2 trained steps {sorted(ep)}")
    worst = max(relative_difference(one[s], ep[s]) for s in one)
    params = checkpoint_param_diff(one_dir, ep_dir)
    apart = max(relative_difference(reference[s], ep[s]) for s in reference)
    print(f"ep2 --micro-batches 2 against one rank --micro-batch 4: loss {worst:.2e}, final parameters "
          f"{params:.2e}; against the default micro-batches {apart:.2e}")
    if worst > 1e-4 or params > 1e-4:
        fail("ep2 --micro-batches 2 is not exact against one rank with micro-batches of 4")
    if apart < 1e-4:
        fail("ep2 --micro-batches 2 trained the default micro-batches: the option was not honoured")


def test():
    rejected_layouts()
    with tempfile.TemporaryDirectory(prefix="troupe-expert-layouts-") as tmp:
        ref_dir, reference = exactness(tmp, 2, ["ep2", "dp2xep2"])
        exactness(tmp, 1, ["ep2"])
        micro_batches_honoured(tmp, reference)

        # ep2 writes step 10, dp2xep2 resumes it: the checkpoint is layout-independent.
        run_dir = os.path.join(tmp, "switch")
        run("ep2 first half", LAYOUTS["ep2"] + ["--top-k", "2", "--exit-after-step", "10"], run_dir)
        resumed = step_losses(last_job(run("dp2xep2 resume", LAYOUTS["dp2xep2"] + ["--top-k", "2", "--resume"],
                                           run_dir)))
        if sorted(resumed) != list(range(11, STEPS + 1)):
            fail(f"resume on dp2xep2 trained {sorted(resumed)}")
        worst = max(relative_difference(reference[s], resumed[s]) for s in resumed)
        params = checkpoint_param_diff(ref_dir, run_dir)
        print(f"ep2 checkpoint resumed as dp2xep2: loss {worst:.2e}, final parameters {params:.2e}")
        if worst > 1e-4 or params > 1e-4:
            fail("resuming an ep2 checkpoint as dp2xep2 diverges")

    scrape_metrics()


if __name__ == "__main__":
    main(test)
