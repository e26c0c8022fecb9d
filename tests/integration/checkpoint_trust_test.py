"""Checkpoints that trust nothing on disk (issue 24), through real jobs:

- a damaged chunk that the two newest checkpoints share: --resume falls back to the intact
  older one, and the checkpoints the resumed run writes never reference the damaged chunk
  (it is moved aside and written again): every checkpoint left verifies;
- a fallback heals: the damaged newest checkpoint is quarantined, its step is committed
  afresh when the replay reaches it, LATEST names an intact step, exit 0, losses exact;
- a manifest of bytes that are not UTF-8: garbage collection does not crash the coordinator,
  says so in a checkpoint_gc_failed event, quarantines it, and the next resume collects;
- a symbolic link and a directory among the recycled chunk files: the file the link points
  to is unchanged, and the save succeeds;
- a missing LATEST is said (console and checkpoint_fallback event), then the newest intact
  checkpoint is taken and LATEST repaired;
- `troupe ckpt scrub` quarantines a damaged checkpoint and repairs LATEST; `ckpt ls` lists it;
- --verify-checkpoints after-write: checkpoints are read back from the disk and commit.
Every run directory is verified at the end: nothing damaged but what was damaged on purpose
(and that is in checkpoints/damaged/)."""

import json
import os
import shutil
import subprocess

from harness import (SMALL_MODEL, TROUPE, fail, last_job, main, read_events, run_ok, run_to_end,
                     step_losses, tempfile)

BASE = SMALL_MODEL + ["--world", "2", "--metrics-port", "0", "--checkpoint-every", "5"]


def of(events, name):
    return [e for e in events if e.get("event") == name]


def ckpt(*args):
    p = subprocess.run([TROUPE, "ckpt", *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def manifest_keys(run_dir, step):
    path = os.path.join(run_dir, "checkpoints", f"step-{step:08d}", "manifest.json")
    with open(path) as f:
        return {key for piece in json.load(f)["pieces"] for key in piece["chunks"]}


def chunk_path(run_dir, key):
    return os.path.join(run_dir, "checkpoints", "chunks", key[:2], key)


def damage(path):
    with open(path, "r+b") as f:
        f.seek(60)
        b = f.read(1)
        f.seek(60)
        f.write(bytes([b[0] ^ 0x40]))


def latest(run_dir):
    with open(os.path.join(run_dir, "checkpoints", "LATEST")) as f:
        return f.read().strip()


def quarantined(run_dir):
    root = os.path.join(run_dir, "checkpoints", "damaged")
    return sorted(d for d in os.listdir(root) if d.startswith("step-")) if os.path.isdir(root) else []


def all_intact(name, run_dir):
    code, out = ckpt("verify", run_dir)
    if code != 0 or "all intact" not in out:
        fail(f"{name}: `troupe ckpt verify` finds damage after the run:\n{out}")


def shared_chunk(tmp):
    d = os.path.join(tmp, "shared")
    # Step 10 is written with larger chunks than 15 and 20, which freeze wte: those two share
    # wte's chunks, and step 10 holds none of them.
    run_ok("shared: to 10", BASE + ["--steps", "30", "--exit-after-step", "10", "--keep-last", "0",
                                    "--checkpoint-chunk-kib", "8"], d)
    frozen = BASE + ["--steps", "30", "--checkpoint-chunk-kib", "4", "--freeze", "wte", "--resume"]
    run_ok("shared: to 20", frozen + ["--exit-after-step", "20", "--keep-last", "0"], d)
    shared = sorted((manifest_keys(d, 15) & manifest_keys(d, 20)) - manifest_keys(d, 10))
    if not shared:
        fail("shared: steps 15 and 20 share no chunk that step 10 lacks")
    victim = shared[0]
    damage(chunk_path(d, victim))
    code, events, output = run_to_end(frozen + ["--keep-last", "2"], timeout=300, run_dir=d)
    if code != 0:
        fail(f"shared: the resumed run exited {code}:\n{output}")
    job = last_job(events)
    resumed = of(job, "resume")
    passed = sorted(f["step"] for f in of(job, "checkpoint_fallback"))
    if not resumed or resumed[0]["step"] != 10 or passed != [15, 20]:
        fail(f"shared: expected a fallback over 20 and 15 to step 10, got {passed} {resumed}")
    if quarantined(d) != ["step-00000015-corrupt", "step-00000020-corrupt"]:
        fail(f"shared: the damaged checkpoints were not quarantined: {quarantined(d)}")
    if "was damaged" not in output or victim not in output:
        fail(f"shared: no rank said it rewrote the damaged chunk {victim}:\n{output}")
    if [c["step"] for c in of(job, "checkpoint")] != [15, 20, 25, 30]:
        fail(f"shared: the resumed run committed {[c['step'] for c in of(job, 'checkpoint')]}")
    all_intact("shared", d)  # 25 and 30, which retention kept, reference the rewritten chunk
    print(f"shared chunk: fell back to 10 over 15 and 20 (quarantined); the rewritten chunk "
          f"{victim[:8]} verifies and every checkpoint left is intact")


def fallback_heals(tmp):
    d = os.path.join(tmp, "heal")
    args = BASE + ["--steps", "30", "--keep-last", "3"]
    run_ok("heal: to 20", args + ["--exit-after-step", "20"], d)
    victim = sorted(manifest_keys(d, 20) - manifest_keys(d, 15))[0]
    damage(chunk_path(d, victim))
    code, events, output = run_to_end(args + ["--resume"], timeout=300, run_dir=d)
    if code != 0:
        fail(f"heal: the resumed run exited {code} (a replayed step must commit afresh):\n{output}")
    job = last_job(events)
    fallback = of(job, "checkpoint_fallback")
    if not fallback or fallback[0]["step"] != 20 or "damaged" not in fallback[0]["quarantined"]:
        fail(f"heal: expected step 20 passed over and quarantined, got {fallback}")
    if 20 not in [c["step"] for c in of(job, "checkpoint")]:
        fail("heal: the replay did not commit step 20 again")
    if latest(d) != "step-00000030":
        fail(f"heal: LATEST names {latest(d)}, not the last step")
    code, out = ckpt("verify", d, "--step", "20")
    if code != 0:
        fail(f"heal: the re-committed step 20 does not verify:\n{out}")
    full = step_losses(run_ok("heal: uninterrupted", args, d + "-full"))
    resumed = step_losses(job)
    worst = max(abs(resumed[s] - full[s]) / abs(full[s]) for s in resumed)
    if sorted(resumed) != list(range(16, 31)) or worst > 1e-6:
        fail(f"heal: replayed steps {sorted(resumed)}, worst relative difference {worst:.2e}")
    all_intact("heal", d)
    print(f"fallback heals: step 20 quarantined, replayed and committed afresh; LATEST is step 30; "
          f"losses exact (worst {worst:.1e})")


def unreadable_manifest(tmp):
    d = os.path.join(tmp, "unreadable")
    run_ok("unreadable: to 20", BASE + ["--steps", "40", "--exit-after-step", "20", "--keep-last", "0"], d)
    with open(os.path.join(d, "checkpoints", "step-00000010", "manifest.json"), "wb") as f:
        f.write(b'\xff\xfe{"step": \x1b[31m\xc3\x28')
    for session, until in ((1, "30"), (2, "35")):
        code, events, output = run_to_end(BASE + ["--steps", "40", "--exit-after-step", until,
                                                  "--keep-last", "2", "--resume"],
                                          timeout=300, run_dir=d)
        if code != 0:
            fail(f"unreadable: session {session} exited {code} (the coordinator must not abort):\n"
                 f"{output}")
        job = last_job(events)
        if session == 1:
            failed = of(job, "checkpoint_gc_failed")
            if not failed or "step-00000010" not in failed[0]["error"]:
                fail(f"unreadable: no checkpoint_gc_failed event naming step 10: {failed}")
            if "\x1b" in failed[0]["error"] or "\\xff" not in failed[0]["error"]:
                fail(f"unreadable: the error text is not escaped: {failed[0]['error']!r}")
        else:
            removed = [s for g in of(job, "checkpoint_gc") for s in g["removed_steps"]]
            if not removed:
                fail("unreadable: the next session's garbage collection removed nothing")
    with open(os.path.join(d, "events.jsonl"), "rb") as f:
        f.read().decode("utf-8")  # strict: every line the coordinator wrote is valid UTF-8
    if quarantined(d) != ["step-00000010-unreadable-manifest"]:
        fail(f"unreadable: step 10 was not quarantined: {quarantined(d)}")
    all_intact("unreadable", d)
    print("unreadable manifest: no crash, checkpoint_gc_failed (escaped), quarantined; the next "
          "session collects")


def recycled_links(tmp):
    d = os.path.join(tmp, "recycled")
    run_ok("recycled: to 20", BASE + ["--steps", "30", "--exit-after-step", "20", "--keep-last", "2"], d)
    folder = os.path.join(d, "checkpoints", "recycled-chunks")
    files = sorted(os.listdir(folder))
    if not files:
        fail("recycled: the collection kept no files to recycle")
    outside = os.path.join(tmp, "outside.txt")
    with open(outside, "w") as f:
        f.write("precious")
    for name in files:
        os.remove(os.path.join(folder, name))
        os.symlink(outside, os.path.join(folder, name))
    os.mkdir(os.path.join(folder, "0123456789abcdef0123456789abcdef"))
    code, events, output = run_to_end(BASE + ["--steps", "30", "--keep-last", "2", "--resume"],
                                      timeout=300, run_dir=d)
    if code != 0:
        fail(f"recycled: the save failed (exit {code}):\n{output}")
    with open(outside) as f:
        if f.read() != "precious":
            fail("recycled: the file a recycled-chunks link points to was written")
    if "is not a regular file" not in output:
        fail(f"recycled: the ranks did not report the foreign entries:\n{output}")
    if [c["step"] for c in of(last_job(events), "checkpoint")] != [25, 30]:
        fail("recycled: the checkpoints of 25 and 30 were not committed")
    all_intact("recycled", d)
    print(f"recycled links: {len(files)} links and a directory skipped, the outside file unchanged, "
          "checkpoints 25 and 30 committed")


def missing_latest(tmp):
    d = os.path.join(tmp, "no-latest")
    run_ok("no-latest: to 20", BASE + ["--steps", "30", "--exit-after-step", "20"], d)
    os.remove(os.path.join(d, "checkpoints", "LATEST"))
    code, events, output = run_to_end(BASE + ["--steps", "30", "--resume"], timeout=300, run_dir=d)
    if code != 0:
        fail(f"no-latest: exited {code}:\n{output}")
    job = last_job(events)
    fallback = of(job, "checkpoint_fallback")
    if not fallback or fallback[0]["step"] != -1 or "missing" not in fallback[0]["error"]:
        fail(f"no-latest: no checkpoint_fallback event says LATEST is missing: {fallback}")
    if "LATEST" not in output or "is missing" not in output:
        fail(f"no-latest: the console does not say LATEST is missing:\n{output}")
    resumed = of(job, "resume")
    if not resumed or resumed[0]["step"] != 20 or not resumed[0]["latest_repaired"]:
        fail(f"no-latest: expected a resume from 20 with LATEST repaired, got {resumed}")
    all_intact("no-latest", d)
    print("missing LATEST: said on the console and in checkpoint_fallback; resumed from 20")


def scrub(tmp):
    d = os.path.join(tmp, "scrub")
    run_ok("scrub: to 20", BASE + ["--steps", "30", "--exit-after-step", "20"], d)
    damage(chunk_path(d, sorted(manifest_keys(d, 20) - manifest_keys(d, 15))[0]))
    code, out = ckpt("scrub", d)
    if code != 1 or "moved to" not in out or "LATEST: now names step-00000015" not in out:
        fail(f"scrub: expected exit 1, step 20 quarantined and LATEST repaired:\n{out}")
    if latest(d) != "step-00000015" or quarantined(d) != ["step-00000020-corrupt"]:
        fail(f"scrub: LATEST {latest(d)}, quarantined {quarantined(d)}")
    code, out = ckpt("scrub", d)
    if code != 0 or "all intact" not in out:
        fail(f"scrub: a second scrub is not clean:\n{out}")
    code, out = ckpt("ls", d)
    if code != 0 or "step-00000020-corrupt" not in out:
        fail(f"scrub: `ckpt ls` does not list the quarantined checkpoint:\n{out}")
    all_intact("scrub", d)
    print("scrub: step 20 quarantined, LATEST repaired to 15, listed by `ckpt ls`")


def read_back(tmp):
    d = os.path.join(tmp, "read-back")
    events = run_ok("read-back", BASE + ["--steps", "10", "--verify-checkpoints", "after-write"], d)
    if [c["step"] for c in of(events, "checkpoint")] != [5, 10]:
        fail("read-back: the checkpoints were not committed")
    code, _, output = run_to_end(BASE + ["--steps", "10", "--verify-checkpoints", "sometimes"],
                                 timeout=60, run_dir=d + "-bad")
    if code != 2 or "--verify-checkpoints" not in output:
        fail(f"read-back: an unknown --verify-checkpoints value exited {code}:\n{output}")
    all_intact("read-back", d)
    print("--verify-checkpoints after-write: checkpoints read back and committed; a bad value is exit 2")


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-trust-") as tmp:
        shared_chunk(tmp)
        fallback_heals(tmp)
        unreadable_manifest(tmp)
        recycled_links(tmp)
        missing_latest(tmp)
        scrub(tmp)
        read_back(tmp)


if __name__ == "__main__":
    main(test)
