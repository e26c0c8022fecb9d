"""`troupe ckpt` on a real run: ls, inspect, verify (intact, a corrupted chunk, a damaged or a missing
LATEST), diff, hash, gc (refused under the run lock, then --keep-last 1), and usage errors."""

import fcntl
import json
import os
import re
import subprocess
import sys
import tempfile

TROUPE = os.environ.get("TROUPE_BIN", "")


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    raise SystemExit(1)


def troupe(*args, timeout=60):
    p = subprocess.run([TROUPE, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def ckpt(*args, expect=0):
    code, out, err = troupe("ckpt", *args)
    if code != expect:
        fail(f"troupe ckpt {' '.join(args)}: expected exit {expect}, got {code}\n"
             f"stdout:\n{out}\nstderr:\n{err}")
    return out, err


def manifest(run_dir, step):
    with open(os.path.join(run_dir, "checkpoints", f"step-{step:08d}", "manifest.json")) as f:
        return json.load(f)


def chunk_keys(m):
    return {key for piece in m["pieces"] for key in piece["chunks"]}


def chunk_path(run_dir, key):
    return os.path.join(run_dir, "checkpoints", "chunks", key[:2], key)


def chunk_files(run_dir):
    root = os.path.join(run_dir, "checkpoints", "chunks")
    return {name for _, _, files in os.walk(root) for name in files}


def listed_steps(ls_out):
    """{step: line} for the checkpoint lines of `troupe ckpt ls`."""
    return {int(line.split()[0]): line for line in ls_out.splitlines() if re.match(r"\d+\s", line)}


def flip_byte(path, offset):
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def test_usage(tmp, run_dir):
    for args in (["ckpt"], ["ckpt", "bogus", run_dir], ["ckpt", "ls"], ["ckpt", "ls", run_dir, "x"],
                 ["ckpt", "ls", run_dir, "--nope"], ["ckpt", "inspect", run_dir, "--step"],
                 ["ckpt", "inspect", run_dir, "--step", "x"], ["ckpt", "verify", run_dir, "--step=-3"],
                 ["ckpt", "diff", run_dir, "4"], ["ckpt", "diff", run_dir, "4", "y"],
                 ["ckpt", "gc", run_dir, "--keep-last", "many"], ["ckpt", "gc", run_dir, "--step", "1"],
                 ["ckpt", "hash", run_dir, "4"], ["ckpt", "hash", run_dir, "--step", "x"]):
        code, out, err = troupe(*args)
        if code != 2 or not err.strip():
            fail(f"{args}: expected exit 2 and a message on stderr, got {code}:\n{out}{err}")
    for args in (["ckpt", "--help"], ["ckpt", "verify", "--help"], ["ckpt", "gc", run_dir, "-h"]):
        code, out, _ = troupe(*args)
        if code != 0 or "usage: troupe ckpt" not in out:
            fail(f"{args}: expected usage on stdout and exit 0, got {code}:\n{out}")
    code, out, _ = troupe("--help")
    if code != 0 or "ckpt" not in out:
        fail(f"troupe --help does not list ckpt:\n{out}")
    # Not a run directory: a clear message and exit 1.
    _, err = ckpt("ls", tmp, expect=1)
    if "no checkpoints directory" not in err:
        fail(f"ls of a directory without checkpoints: unclear message:\n{err}")
    ckpt("verify", os.path.join(tmp, "missing"), expect=1)


def test():
    if not TROUPE:
        fail("TROUPE_BIN is not set")
    with tempfile.TemporaryDirectory(prefix="troupe-ckpt-") as tmp:
        run_dir = os.path.join(tmp, "run")
        # --freeze keeps wpe's chunks unchanged, so checkpoints share some chunks (small chunks,
        # so that wpe gets chunks of its own rather than being packed with trained tensors).
        code, out, err = troupe("run", "--world", "2", "--steps", "12", "--checkpoint-every", "4",
                                "--keep-last", "0", "--metrics-port", "0", "--no-progress",
                                "--run-dir", run_dir, "--layers", "2", "--d-model", "64",
                                "--freeze", "wpe*", "--checkpoint-chunk-kib", "4", timeout=100)
        if code != 0:
            fail(f"troupe run failed ({code}):\n{out}\n{err}")

        # ls: 4, 8, 12 oldest first, LATEST on 12, and the chunk store's size.
        out, _ = ckpt("ls", run_dir)
        steps = listed_steps(out)
        if list(steps) != [4, 8, 12]:
            fail(f"ls should list steps 4, 8, 12 in order:\n{out}")
        if "LATEST" not in steps[12] or "LATEST" in steps[4] + steps[8]:
            fail(f"ls should mark step 12 (only) as LATEST:\n{out}")
        if "dp2" not in steps[4] or not out.strip().splitlines()[-1].startswith("chunk store:"):
            fail(f"ls should show the layout and end with the chunk store's size:\n{out}")

        # inspect: the manifest summary and per-tensor pieces.
        out, _ = ckpt("inspect", run_dir)
        if not re.search(r"^\s*layout\s+dp2", out, re.M) or not re.search(r"^\s*step\s+12$", out, re.M):
            fail(f"inspect should show step 12 and layout dp2:\n{out}")
        if not re.search(r"wte\.weight\s+256x64\s+0\s+2 pieces \(ranks 0,1\)", out):
            fail(f"inspect should show wte.weight's shape and the ranks that wrote it:\n{out}")
        out, _ = ckpt("inspect", run_dir, "--step", "4")
        if not re.search(r"^\s*adam_t\s+4$", out, re.M):
            fail(f"inspect --step 4 should show adam_t 4:\n{out}")

        # verify: all intact.
        out, _ = ckpt("verify", run_dir)
        for s in (4, 8, 12):
            if f"step {s}: ok" not in out:
                fail(f"verify should report step {s} ok:\n{out}")

        # diff 4 8: shared (the frozen tensor) and per-checkpoint bytes, and values.
        out, _ = ckpt("diff", run_dir, "4", "8")
        sizes = {m.group(1): int(m.group(2))
                 for m in re.finditer(r"^\s*(shared|only in A|only in B).*?(\d+) bytes$", out, re.M)}
        if set(sizes) != {"shared", "only in A", "only in B"}:
            fail(f"diff should report shared bytes and bytes only in A and only in B:\n{out}")
        if sizes["shared"] <= 0 or sizes["only in A"] <= 0 or sizes["only in B"] <= 0:
            fail(f"diff 4 8: expected shared and unshared bytes:\n{out}")
        if not re.search(r"^\s*wpe\.weight\s+same\s+same\s+same$", out, re.M):
            fail(f"diff should show the frozen wpe.weight as identical:\n{out}")
        if not re.search(r"^\s*wte\.weight\s+[0-9.e+-]+\s", out, re.M):
            fail(f"diff should show wte.weight's largest difference:\n{out}")
        ckpt("diff", run_dir)  # default: the two newest

        # hash: the training state's digests; LATEST's by default, equal for equal bits only.
        out, _ = ckpt("hash", run_dir)
        digest = re.fullmatch(r"step 12 adam_t 12 params ([0-9a-f]{16}) exp_avg ([0-9a-f]{16}) "
                              r"exp_avg_sq ([0-9a-f]{16}) state ([0-9a-f]{16})", out.strip())
        if not digest:
            fail(f"hash should print step, adam_t and four 16-hex-digit digests:\n{out}")
        if ckpt("hash", run_dir, "--step", "12")[0] != out:
            fail("hash --step 12 should print what hash of LATEST (12) prints")
        out4, _ = ckpt("hash", run_dir, "--step", "4")
        if not out4.startswith("step 4 adam_t 4 ") or out4.split()[5] == digest.group(1):
            fail(f"hash of step 4 should differ from step 12's:\n{out4}{out}")
        ckpt("hash", run_dir, "--step", "5", expect=1)  # no such checkpoint

        # A corrupted chunk that only step 12 references: verify names it, exit 1.
        m12 = manifest(run_dir, 12)
        older = chunk_keys(manifest(run_dir, 4)) | chunk_keys(manifest(run_dir, 8))
        victim = next(k for p in m12["pieces"] for k in p["chunks"] if k not in older)
        path = chunk_path(run_dir, victim)
        flip_byte(path, 48 + (os.path.getsize(path) - 48) // 2)
        out, _ = ckpt("verify", run_dir, expect=1)
        if path not in out or "step 4: ok" not in out or "step 12: ok" in out:
            fail(f"verify should name the damaged chunk {path} of step 12:\n{out}")
        _, err = ckpt("hash", run_dir, expect=1)
        if path not in err:
            fail(f"hash of a damaged checkpoint should name the damaged chunk {path}:\n{err}")
        out, _ = ckpt("verify", run_dir, "--step", "8")
        if "step 8: ok" not in out or "step 12" in out:
            fail(f"verify --step 8 should check step 8 only:\n{out}")
        flip_byte(path, 48 + (os.path.getsize(path) - 48) // 2)  # repaired
        ckpt("verify", run_dir)

        # A damaged LATEST is a problem, but every step is still verified.
        latest = os.path.join(run_dir, "checkpoints", "LATEST")
        with open(latest) as f:
            good_latest = f.read()
        with open(latest, "w") as f:
            f.write("not a step\n")
        out, _ = ckpt("verify", run_dir, expect=1)
        if "LATEST" not in out or not all(f"step {s}: ok" in out for s in (4, 8, 12)):
            fail(f"verify with a damaged LATEST:\n{out}")
        with open(latest, "w") as f:
            f.write(good_latest)

        # A missing LATEST beside several manifests is a problem: a commit made them all.
        os.remove(latest)
        out, _ = ckpt("verify", run_dir, expect=1)
        if "LATEST: missing" not in out:
            fail(f"verify without LATEST beside three manifests:\n{out}")
        with open(latest, "w") as f:
            f.write(good_latest)

        # gc refuses while a job holds the run's lock, and deletes nothing.
        before = chunk_files(run_dir)
        lock_fd = os.open(os.path.join(run_dir, "checkpoints", ".lock"), os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            _, err = ckpt("gc", run_dir, "--keep-last", "1", expect=1)
            if "job" not in err:
                fail(f"gc under the run lock: unclear message:\n{err}")
        finally:
            os.close(lock_fd)
        if chunk_files(run_dir) != before or list(listed_steps(ckpt("ls", run_dir)[0])) != [4, 8, 12]:
            fail("gc deleted something while the run was locked")

        # gc --keep-last 1: steps 4 and 8 go, exactly step 12's chunks stay.
        out, _ = ckpt("gc", run_dir, "--keep-last", "1")
        if not re.search(r"steps removed\s+4, 8$", out, re.M):
            fail(f"gc should report steps 4 and 8 removed:\n{out}")
        ckpts = os.path.join(run_dir, "checkpoints")
        if sorted(d for d in os.listdir(ckpts) if d.startswith("step-")) != ["step-00000012"]:
            fail(f"after gc: {sorted(os.listdir(ckpts))}")
        left = chunk_files(run_dir)
        if left != chunk_keys(m12):
            fail(f"after gc: {len(left)} chunk files, step 12 references {len(chunk_keys(m12))}; "
                 f"extra {sorted(left - chunk_keys(m12))[:5]}, missing {sorted(chunk_keys(m12) - left)[:5]}")
        ckpt("verify", run_dir)

        # One manifest and no LATEST is what a job killed between its first manifest and
        # LATEST leaves: nothing committed yet, and nothing damaged.
        os.remove(latest)
        out, _ = ckpt("verify", run_dir)
        if "LATEST: not written yet: step-00000012" not in out or "step 12: ok" not in out:
            fail(f"verify with the first checkpoint's commit unfinished:\n{out}")
        with open(latest, "w") as f:
            f.write(good_latest)

        test_usage(tmp, run_dir)
    print("ckpt_tool_test: ok")


if __name__ == "__main__":
    test()
    sys.exit(0)
