"""Checkpoints under damage, pressure and overlap, through real jobs:

- corruption: a flipped byte in a chunk, a truncated chunk, a truncated manifest, a deleted
  chunk -> `troupe ckpt verify` names the object (exit 1), and --resume falls back to the
  previous committed checkpoint (output + a checkpoint_fallback event) and trains on; with
  every checkpoint damaged --resume stops with exit 1;
- incremental: with more than half the model frozen, the second checkpoint writes at most
  half the bytes of the first (as counted by the writers), and retention keeps exactly the
  steps it promises (--keep-last 2 --keep-every 4) with exactly their chunks on disk;
- asynchronous: steps are committed while a checkpoint's background write is in flight
  (event timestamps), and the checkpoint still restores exactly;
- disk full (a 24 MiB tmpfs in a private mount namespace): the save fails with a clear
  checkpoint_failed event and metric, training goes on to the end (exit 4: no later
  checkpoint committed), and the previous checkpoint stays committed, verifies and resumes."""

import json
import os
import shutil
import subprocess
import urllib.request

from harness import (SMALL_MODEL, TROUPE, fail, free_port, last_job, main, read_events,
                     read_events_file, run_ok,
                     run_to_end, step_losses, tempfile)

BASE = SMALL_MODEL + ["--world", "2", "--metrics-port", "0"]


def of(events, name):
    return [e for e in events if e.get("event") == name]


def ckpt(*args):
    p = subprocess.run([TROUPE, "ckpt", *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def manifest(run_dir, step):
    with open(os.path.join(run_dir, "checkpoints", f"step-{step:08d}", "manifest.json")) as f:
        return json.load(f)


def chunk_keys(m):
    return {key for piece in m["pieces"] for key in piece["chunks"]}


def chunk_path(run_dir, key):
    return os.path.join(run_dir, "checkpoints", "chunks", key[:2], key)


def chunk_files(run_dir):
    root = os.path.join(run_dir, "checkpoints", "chunks")
    return {n for _, _, files in os.walk(root) for n in files if ".tmp." not in n}


def committed_steps(run_dir):
    root = os.path.join(run_dir, "checkpoints")
    return sorted(int(d[5:]) for d in os.listdir(root)
                  if d.startswith("step-") and os.path.exists(os.path.join(root, d, "manifest.json")))


def corruption(tmp):
    base = os.path.join(tmp, "base")
    run_ok("corruption base", BASE + ["--steps", "12", "--checkpoint-every", "4", "--keep-last", "0"], base)
    newest = manifest(base, 12)
    own = sorted(chunk_keys(newest) - chunk_keys(manifest(base, 8)))
    if not own:
        fail("step 12 shares every chunk with step 8")
    victim = own[0]
    manifest_path = os.path.join(base, "checkpoints", "step-00000012", "manifest.json")

    def flip(d):
        p = chunk_path(d, victim)
        with open(p, "r+b") as f:
            f.seek(60)
            b = f.read(1)
            f.seek(60)
            f.write(bytes([b[0] ^ 0x40]))
        return p

    def truncate_chunk(d):
        p = chunk_path(d, victim)
        os.truncate(p, os.path.getsize(p) // 2)
        return p

    def truncate_manifest(d):
        p = manifest_path.replace(base, d)
        os.truncate(p, os.path.getsize(p) // 2)
        return p

    def delete_chunk(d):
        p = chunk_path(d, victim)
        os.remove(p)
        return p

    for name, damage in [("flipped byte", flip), ("truncated chunk", truncate_chunk),
                         ("truncated manifest", truncate_manifest), ("deleted chunk", delete_chunk)]:
        d = os.path.join(tmp, name.replace(" ", "-"))
        shutil.copytree(base, d)
        path = damage(d)
        code, out = ckpt("verify", d)
        if code != 1 or os.path.basename(path) not in out:
            fail(f"{name}: ckpt verify exited {code} without naming {os.path.basename(path)}:\n{out}")
        if name != "truncated manifest" and "of h." not in out and "of w" not in out and "of l" not in out:
            fail(f"{name}: ckpt verify does not name the tensor the chunk holds:\n{out}")
        code, events, output = run_to_end(BASE + ["--steps", "16", "--checkpoint-every", "4", "--resume"],
                                          timeout=300, run_dir=d)
        if code != 0:
            fail(f"{name}: --resume exited {code}:\n{output}")
        job = last_job(events)
        fallback = of(job, "checkpoint_fallback")
        resumed = of(job, "resume")
        if not fallback or fallback[0]["step"] != 12 or not resumed or resumed[0]["step"] != 8:
            fail(f"{name}: expected a fallback from step 12 to 8; got {fallback} {resumed}")
        if "passing over checkpoint step 12" not in output:
            fail(f"{name}: the output does not say step 12 was passed over:\n{output}")
        if sorted(step_losses(job)) != list(range(9, 17)):
            fail(f"{name}: after the fallback trained {sorted(step_losses(job))}")
        print(f"{name}: verify names {os.path.basename(path)}; resume fell back to step 8 and trained to 16")

    # Every checkpoint damaged: nothing to resume from, exit 1 with the reason.
    d = os.path.join(tmp, "all-damaged")
    shutil.copytree(base, d)
    for step in committed_steps(d):
        p = os.path.join(d, "checkpoints", f"step-{step:08d}", "manifest.json")
        os.truncate(p, 10)
    code, events, output = run_to_end(BASE + ["--steps", "16", "--resume"], timeout=120, run_dir=d)
    if code != 1 or "reads back intact" not in output:
        fail(f"every checkpoint damaged: expected exit 1 naming why, got {code}:\n{output}")
    print("every checkpoint damaged: --resume stops with exit 1")


def incremental(tmp):
    d = os.path.join(tmp, "frozen")
    # wte, wpe and the first block are more than half of this model's parameters; small
    # chunks, so that its matrices (under 16 KiB each) get chunks of their own, not packed.
    events = run_ok("frozen", BASE + ["--steps", "12", "--checkpoint-every", "2", "--keep-last", "2",
                                      "--keep-every", "4", "--freeze", "wte,wpe,h.0.",
                                      "--checkpoint-chunk-kib", "4"], d)
    saved = of(events, "checkpoint")
    # The first checkpoint already stores the frozen moments (all zeros) once, so it is
    # compared by what it holds: the bytes written plus those deduplicated.
    first = saved[0]["bytes_written"] + saved[0]["bytes_deduplicated"]
    second = saved[1]["bytes_written"]
    print(f"frozen: the first checkpoint holds {first} bytes (wrote {saved[0]['bytes_written']}), "
          f"the second wrote {second} ({second / first:.2f}), deduplicated {saved[1]['bytes_deduplicated']}")
    if second > first / 2:
        fail(f"the second checkpoint wrote {second} bytes, more than half of the {first} it holds")
    if saved[1]["bytes_deduplicated"] <= 0:
        fail("the second checkpoint deduplicated nothing")
    steps = committed_steps(d)
    if steps != [4, 8, 10, 12]:
        fail(f"--keep-last 2 --keep-every 4 kept {steps}, expected [4, 8, 10, 12]")
    referenced = set()
    for s in steps:
        referenced |= chunk_keys(manifest(d, s))
    on_disk = chunk_files(d)
    if on_disk != referenced:
        fail(f"chunks on disk differ from those referenced: {len(on_disk - referenced)} extra, "
             f"{len(referenced - on_disk)} missing")
    code, out = ckpt("gc", d, "--keep-last", "1")
    if code != 0:
        fail(f"ckpt gc exited {code}:\n{out}")
    if committed_steps(d) != [12] or chunk_files(d) != chunk_keys(manifest(d, 12)):
        fail(f"after gc --keep-last 1: steps {committed_steps(d)}, chunks differ from step 12's")
    print(f"retention kept {steps} with exactly their {len(referenced)} chunks; gc kept step 12's")


def asynchronous(tmp):
    d = os.path.join(tmp, "async")
    # A bigger model, so that a write outlasts a few steps.
    args = ["--world", "2", "--metrics-port", "0", "--no-progress", "--steps", "34", "--eval-every", "0",
            "--checkpoint-every", "10", "--layers", "4", "--d-model", "128", "--heads", "4"]
    events = run_ok("async", args + ["--exit-after-step", "30"], d)
    overlapped = 0
    for c in of(events, "checkpoint"):
        during = [e for e in of(events, "step") if e["step"] > c["step"] and e["unix_ms"] < c["unix_ms"]]
        overlapped = max(overlapped, len(during))
        if c["step"] < 30 and c["stall_s"] >= c["write_s"]:
            fail(f"checkpoint {c['step']}: the stall ({c['stall_s']}) is not below the write ({c['write_s']})")
    if overlapped == 0:
        fail("no step was committed while a checkpoint was being written")
    print(f"async: up to {overlapped} steps committed during a background write")
    # The snapshot of step 30 must hold exactly step 30's state: resumed, steps 31-34 match
    # an uninterrupted run.
    resumed = step_losses(last_job(run_ok("async resume", args + ["--resume"], d)))
    full = step_losses(run_ok("async uninterrupted", args + ["--checkpoint-every", "0"], d + "-full"))
    worst = max(abs(resumed[s] - full[s]) / abs(full[s]) for s in resumed)
    if sorted(resumed) != [31, 32, 33, 34] or worst > 1e-6:
        fail(f"resuming the asynchronous checkpoint: steps {sorted(resumed)}, worst {worst:.2e}")
    print(f"async checkpoint restores exactly (worst {worst:.1e} over steps 31-34)")


def disk_full(tmp):
    d = os.path.join(tmp, "tiny-disk")
    os.makedirs(d)
    port = free_port()
    # Each checkpoint of this model is ~10 MB: two fit in 24 MiB, the third does not.
    script = f"""
set -u
mount -t tmpfs -o size=24m tmpfs {d} || exit 90
{TROUPE} run --run-dir {d}/run --world 2 --steps 64 --checkpoint-every 8 --keep-last 0 --eval-every 0 \
  --layers 4 --d-model 128 --heads 4 --no-progress --metrics-port {port} > {tmp}/disk.log 2>&1 &
job=$!
# Scrape the failure metric once the job is past its third checkpoint (it runs on to 64).
for i in $(seq 1 2000); do
  grep -q '"checkpoint_failed"' {d}/run/events.jsonl 2>/dev/null && break
  sleep 0.02
done
curl -s http://127.0.0.1:{port}/metrics > {tmp}/metrics.txt || python3 -c "
import urllib.request; open('{tmp}/metrics.txt','w').write(urllib.request.urlopen('http://127.0.0.1:{port}/metrics').read().decode())"
wait $job
echo "exit=$?" >> {tmp}/disk.log
{TROUPE} ckpt verify {d}/run > {tmp}/verify.log 2>&1; echo "verify=$?" >> {tmp}/verify.log
cp {d}/run/events.jsonl {tmp}/events.jsonl
rm -rf {d}/run/checkpoints/chunks/*/*.tmp.* 2>/dev/null
{TROUPE} run --run-dir {d}/run --world 2 --steps 66 --checkpoint-every 0 --eval-every 0 --layers 4 \
  --d-model 128 --heads 4 --no-progress --metrics-port 0 --resume > {tmp}/resume.log 2>&1
echo "resume=$?" >> {tmp}/resume.log
"""
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=400)
    if p.returncode == 90:
        fail("could not mount a tmpfs in a private mount namespace (run as root)")
    log = open(os.path.join(tmp, "disk.log")).read()
    events = read_events_file(os.path.join(tmp, "events.jsonl"))
    failed = of(events, "checkpoint_failed")
    # It trains to the end; exit 4 says that a checkpoint failed and none committed after it.
    if "exit=4" not in log:
        fail(f"the job did not finish with exit 4 despite the full disk:\n{log[-3000:]}")
    if not failed or "space" not in failed[0]["error"].lower():
        fail(f"expected a checkpoint_failed event naming the full disk, got {failed}")
    if max(step_losses(events)) != 64:
        fail("training did not go on to step 64")
    committed = [c["step"] for c in of(events, "checkpoint")]
    metrics = open(os.path.join(tmp, "metrics.txt")).read()
    line = [m for m in metrics.splitlines() if m.startswith("troupe_checkpoint_failures_total")]
    if not line or float(line[0].split()[-1]) < 1:
        fail(f"troupe_checkpoint_failures_total does not count the failure: {line}")
    verify = open(os.path.join(tmp, "verify.log")).read()
    if "verify=0" not in verify:
        fail(f"after the full disk, the committed checkpoints do not verify:\n{verify}")
    resume = open(os.path.join(tmp, "resume.log")).read()
    # The disk is still full: the resumed job trains from the committed checkpoint, and its
    # own final checkpoint fails too, which its exit status (4) says.
    if "resume=4" not in resume or f"checkpoint step {committed[-1]}" not in resume:
        fail(f"resuming after the full disk failed or did not use step {committed[-1]}:\n{resume}")
    print(f"disk full: committed {committed}, then failed with '{failed[0]['error'][:80]}...'; "
          f"training went on, step {committed[-1]} verifies and resumes")


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-durability-") as tmp:
        corruption(tmp)
        incremental(tmp)
        asynchronous(tmp)
        disk_full(tmp)


if __name__ == "__main__":
    main(test)
