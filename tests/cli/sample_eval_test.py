"""`troupe sample` and `troupe eval` (issue 40) on real runs.

A byte-level run (world 2, ZeRO-1: its parameters come back through the restore path) is
trained on a small text of a few words, stopping after step 1 once so that the untrained model
stays committed beside the trained ones. Then:

- sampling is deterministic: the same seed gives the same text, another seed other text;
  temperature 0 is greedy (any seed, the same as --top-k 1);
- training helps, judged by each model on its own text: the trained model's samples have a
  per-token loss under the trained model (`troupe eval --data`) well below the untrained
  model's samples under the untrained model (about ln 256: it draws nearly uniform bytes), and
  they are made of the corpus's words;
- `troupe eval` without --data is the job's own `validation` event at the same step (relative
  1e-5), at steps 1, 60 and 120;
- a token-file run (uint16 ids, vocabulary 300, no tokenizer) samples ids; one made by
  `troupe tokenize` samples text through its SentencePiece model; a tokenizer gone is exit 2;
  an MoE run samples;
- bad input exits 2 with a message; a damaged checkpoint exits 1 when asked for, and is passed
  over otherwise.
"""

import json
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile

TROUPE = os.environ.get("TROUPE_BIN", "")
WORDS = "the quick brown fox jumps over lazy dog and cat sat on mat".split()


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    raise SystemExit(1)


def troupe(*args, timeout=120):
    p = subprocess.run([TROUPE, *args], capture_output=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")


def ok(*args):
    code, out, err = troupe(*args)
    if code != 0:
        fail(f"troupe {' '.join(args)}: exit {code}\nstderr:\n{err}")
    return out, err


def expect_exit(code_wanted, *args, says=None):
    code, out, err = troupe(*args)
    if code != code_wanted or not err.strip():
        fail(f"troupe {' '.join(args)}: expected exit {code_wanted} with a message, got {code}:\n"
             f"{out[:300]!r}\n{err}")
    if says and not re.search(says, err):
        fail(f"troupe {' '.join(args)}: the message does not say /{says}/:\n{err}")
    return err


def train(tmp, name, data, *extra):
    run_dir = os.path.join(tmp, name)
    ok("run", "--data", data, "--run-dir", run_dir, "--no-progress", "--metrics-port", "0",
       *extra)
    return run_dir


def sample(run_dir, *args):
    out, _ = ok("sample", run_dir, *args)
    return out


def evaluate(run_dir, *args):
    out, _ = ok("eval", run_dir, "--json", *args)
    return json.loads(out)


def validation_events(run_dir):
    losses = {}
    with open(os.path.join(run_dir, "events.jsonl")) as f:
        for line in f:
            e = json.loads(line)
            if e.get("event") == "validation":
                losses[e["step"]] = e["val_loss"]
    return losses


def byte_run(tmp):
    rng = random.Random(3)
    corpus = os.path.join(tmp, "corpus.txt")
    with open(corpus, "w") as f:
        for _ in range(4000):
            f.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) + "\n")
    shape = ["--layers", "2", "--heads", "2", "--d-model", "32", "--context", "32", "--batch",
             "8", "--micro-batch", "2", "--steps", "120", "--lr", "1e-2", "--checkpoint-every",
             "60", "--eval-every", "60", "--world", "2", "--zero", "1", "--keep-last", "0"]
    run_dir = train(tmp, "bytes", corpus, *shape, "--exit-after-step", "1")
    ok("run", "--run-dir", run_dir, "--resume", "--no-progress", "--metrics-port", "0")
    return corpus, run_dir


def test_determinism(run_dir):
    a = sample(run_dir, "--prompt", "the ", "--tokens", "200", "--seed", "7")
    b = sample(run_dir, "--prompt", "the ", "--tokens", "200", "--seed", "7")
    c = sample(run_dir, "--prompt", "the ", "--tokens", "200", "--seed", "8")
    if a != b:
        fail(f"the same seed gave two texts:\n{a!r}\n{b!r}")
    if a == c:
        fail(f"seeds 7 and 8 gave the same text: {a!r}")
    if not a.startswith(b"the ") or len(a) != 4 + 200:
        fail(f"expected the prompt and 200 bytes, got {len(a)} bytes: {a!r}")
    greedy = {sample(run_dir, "--prompt", "the ", "--tokens", "100", "--temperature", "0",
                     "--seed", s) for s in ("1", "2")}
    greedy.add(sample(run_dir, "--prompt", "the ", "--tokens", "100", "--top-k", "1", "--seed", "3"))
    if len(greedy) != 1:
        fail(f"temperature 0 and --top-k 1 are not one greedy text: {greedy}")
    # Past the context (32): the cropped window still gives text, deterministically.
    long_a = sample(run_dir, "--prompt", "the ", "--tokens", "120", "--top-k", "5")
    if long_a != sample(run_dir, "--prompt", "the ", "--tokens", "120", "--top-k", "5"):
        fail("a sample past the context is not deterministic")
    print(f"ok: deterministic samples; greedy {next(iter(greedy))[:60]!r}")


def test_training_helps(tmp, run_dir, corpus):
    """Each model scores its own samples: a trained model's text is likely under it (low loss),
    an untrained model's draws are nearly uniform bytes (loss near ln 256 = 5.55)."""
    losses = {}
    texts = {}
    for step in (1, 120):
        text = sample(run_dir, "--step", str(step), "--prompt", "the ", "--tokens", "600",
                      "--seed", "11")
        path = os.path.join(tmp, f"sampled-{step}.txt")
        with open(path, "wb") as f:
            f.write(text)
        texts[step] = text
        losses[step] = evaluate(run_dir, "--step", str(step), "--data", path)["loss"]
    if not losses[120] < losses[1] - 1.0:
        fail(f"the trained model's samples are not clearly likelier under it than the untrained "
             f"model's under it: {losses}")
    words = set(re.findall(rb"[a-z]+", texts[120]))
    known = words & {w.encode() for w in WORDS}
    if len(known) < 5:
        fail(f"the trained model's text holds few of the corpus's words ({known}): {texts[120]!r}")
    # And the trained model scores the corpus itself better than the untrained one does.
    corpus_loss = {s: evaluate(run_dir, "--step", str(s), "--data", corpus, "--batches", "20")["loss"]
                   for s in (1, 120)}
    if not corpus_loss[120] < corpus_loss[1]:
        fail(f"the corpus is not likelier under the trained model: {corpus_loss}")
    print(f"ok: own-sample loss trained {losses[120]:.3f} < untrained {losses[1]:.3f} "
          f"(ln 256 = {math.log(256):.3f}); corpus words {sorted(known)}")


def test_eval_matches_validation(run_dir):
    logged = validation_events(run_dir)
    for step in (1, 60, 120):
        if step not in logged:
            fail(f"no validation event at step {step}: {logged}")
        got = evaluate(run_dir, "--step", str(step))
        if abs(got["loss"] - logged[step]) > 1e-5 * abs(logged[step]):
            fail(f"step {step}: troupe eval {got['loss']!r}, the job's validation {logged[step]!r}")
        if got["split"] != "validation" or got["tokens"] != 8 * 2 * 32:
            fail(f"unexpected eval line: {got}")
        if abs(got["perplexity"] - math.exp(got["loss"])) > 1e-9 * got["perplexity"]:
            fail(f"perplexity is not e^loss: {got}")
    text, _ = ok("eval", run_dir)
    if not re.match(r"step 120: loss \d+\.\d{4}, perplexity \d+\.\d{2} over 512 tokens of ",
                    text.decode()):
        fail(f"unexpected eval text: {text!r}")
    other = evaluate(run_dir, "--seed", "5", "--batches", "3")
    if other["tokens"] != 3 * 2 * 32 or other["loss"] == logged[120]:
        fail(f"--seed/--batches changed nothing: {other}")
    print(f"ok: troupe eval = validation events at steps 1, 60 and 120 ({logged})")


def write_tokens(path, ids, vocab, tokenizer=""):
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{len(ids)}H", *ids))
    with open(path + ".json", "w") as f:
        json.dump({"format": "troupe.tokens", "version": 1, "dtype": "uint16", "vocab_size": vocab,
                   "tokens": len(ids), "tokenizer": tokenizer}, f)


def test_token_runs(tmp, corpus, byte_run_dir):
    small = ["--layers", "1", "--heads", "2", "--d-model", "16", "--context", "16", "--batch",
             "4", "--micro-batch", "2", "--steps", "8", "--checkpoint-every", "8", "--world", "1"]
    # Ids without a tokenizer: the prompt and the output are ids.
    rng = random.Random(5)
    ids = [rng.choice([7, 42, 299, 150, 3]) for _ in range(6000)]
    data = os.path.join(tmp, "ids.bin")
    write_tokens(data, ids, 300)
    run_dir = train(tmp, "ids", data, *small)
    out = sample(run_dir, "--prompt", "7 42 299", "--tokens", "20", "--seed", "2").decode()
    got = [int(t) for t in out.split()]
    if len(got) != 23 or got[:3] != [7, 42, 299] or max(got) >= 300 or not out.endswith("\n"):
        fail(f"expected 23 ids below 300, the prompt first, on one line: {out!r}")
    expect_exit(2, "sample", run_dir, "--prompt", "the fox", "--tokens", "3", says="token ids")
    expect_exit(2, "sample", run_dir, "--prompt", "7 300", "--tokens", "3", says="vocabulary")
    evaluate(run_dir)
    expect_exit(2, "eval", run_dir, "--data", corpus, says="vocabulary")
    expect_exit(2, "eval", byte_run_dir, "--data", data, says="vocabulary")
    # The sidecar names a tokenizer that is gone: exit 2 naming it.
    write_tokens(data, ids, 300, tokenizer="gone.model")
    expect_exit(2, "sample", run_dir, "--prompt", "7", "--tokens", "3", says="gone.model")
    print(f"ok: an id run samples ids ({out.strip()[:40]}...); a missing tokenizer is named")

    # A corpus through `troupe tokenize`: text in, text out.
    tok_dir = os.path.join(tmp, "tok")
    ok("tokenize", corpus, tok_dir, "--vocab", "300")
    run_dir = train(tmp, "spm", os.path.join(tok_dir, "train.bin"), *small)
    text = sample(run_dir, "--prompt", "the quick fox", "--tokens", "30", "--seed", "4").decode()
    if not text.startswith("the quick fox") or len(text) <= len("the quick fox"):
        fail(f"expected the prompt and its continuation as text: {text!r}")
    val = evaluate(run_dir, "--data", os.path.join(tok_dir, "val.bin"))
    if not (val["split"] == "file" and val["tokens"] > 0 and math.isfinite(val["loss"])):
        fail(f"eval of val.bin: {val}")
    print(f"ok: a tokenized run samples text: {text[:50]!r}")

    # MoE: every expert runs at inference.
    moe = train(tmp, "moe", corpus, *small, "--experts", "2", "--top-k", "2")
    a = sample(moe, "--prompt", "the ", "--tokens", "40", "--seed", "3")
    if a != sample(moe, "--prompt", "the ", "--tokens", "40", "--seed", "3") or len(a) != 44:
        fail(f"an MoE run's samples: {a!r}")
    print("ok: an MoE run samples")


def test_bad_input(tmp, run_dir):
    not_run = os.path.join(tmp, "not-a-run")
    os.makedirs(not_run)
    empty = os.path.join(tmp, "empty-run")
    os.makedirs(empty)
    shutil.copy(os.path.join(run_dir, "config.json"), empty)
    for args, says in (
            (["sample", run_dir, "--tokens", "5"], "--prompt"),
            (["sample", run_dir, "--prompt", "x"], "--tokens"),
            (["sample", run_dir, "--prompt", "x", "--tokens", "many"], "--tokens"),
            (["sample", run_dir, "--prompt", "x", "--tokens", "5", "--temperature", "-1"], "temperature"),
            (["sample", run_dir, "--prompt", "x", "--tokens", "5", "--top-k", "1.5"], "top-k"),
            (["sample", run_dir, "--prompt", "x", "--tokens", "5", "--seed", "x"], "seed"),
            (["sample", run_dir, "--prompt", "", "--tokens", "5"], "no token"),
            (["sample", run_dir, "--prompt", "x", "--tokens", "5", "--step", "7"], "its steps: 1, 60, 120"),
            (["sample", not_run, "--prompt", "x", "--tokens", "5"], "not a run directory"),
            (["sample", os.path.join(tmp, "nowhere"), "--prompt", "x", "--tokens", "5"], "not a directory"),
            (["sample", empty, "--prompt", "x", "--tokens", "5"], "no committed checkpoint"),
            (["eval", run_dir, "--step", "x"], "--step"),
            (["eval", run_dir, "--batches", "0"], "--batches"),
            (["eval", run_dir, "--data", os.path.join(tmp, "nowhere.txt")], "nowhere.txt"),
            (["eval", run_dir, "--data", os.path.join(tmp, "corpus.txt"), "--seed", "1"], "--seed"),
            (["eval", not_run], "not a run directory"),
            (["eval", run_dir, "--bogus"], "unknown option"),
    ):
        expect_exit(2, *args, says=re.escape(says))
    for cmd in ("sample", "eval"):
        code, out, _ = troupe(cmd, "--help")
        if code != 0 or f"usage: troupe {cmd}" not in out.decode():
            fail(f"troupe {cmd} --help: {code} {out!r}")
    code, out, _ = troupe("--help")
    if code != 0 or "sample" not in out.decode() or "eval" not in out.decode():
        fail(f"troupe --help lists neither sample nor eval:\n{out.decode()}")
    print("ok: bad input exits 2 with a message")


def test_damaged(tmp, run_dir):
    damaged = os.path.join(tmp, "damaged")
    shutil.copytree(run_dir, damaged)
    with open(os.path.join(damaged, "checkpoints", "step-00000120", "manifest.json")) as f:
        m = json.load(f)
    older = set()
    for s in (1, 60):
        with open(os.path.join(damaged, "checkpoints", f"step-{s:08d}", "manifest.json")) as f:
            older |= {k for p in json.load(f)["pieces"] for k in p["chunks"]}
    key = next(k for p in m["pieces"] if p["array"] == "params" for k in p["chunks"]
               if k not in older)
    path = os.path.join(damaged, "checkpoints", "chunks", key[:2], key)
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 5)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    expect_exit(1, "sample", damaged, "--step", "120", "--prompt", "x", "--tokens", "5")
    expect_exit(1, "eval", damaged, "--step", "120")
    code, out, err = troupe("eval", damaged, "--json")
    if code != 0 or json.loads(out)["step"] != 60 or "120 is damaged" not in err:
        fail(f"without --step a damaged newest checkpoint is passed over: {code} {out!r} {err}")
    print("ok: a damaged checkpoint exits 1 when asked for, is passed over otherwise")


def main():
    if not TROUPE:
        fail("TROUPE_BIN is not set")
    with tempfile.TemporaryDirectory(prefix="troupe-sample-") as tmp:
        corpus, run_dir = byte_run(tmp)
        test_determinism(run_dir)
        test_training_helps(tmp, run_dir, corpus)
        test_eval_matches_validation(run_dir)
        test_bad_input(tmp, run_dir)
        test_damaged(tmp, run_dir)
        test_token_runs(tmp, corpus, run_dir)
    print("sample_eval_test: all passed")


if __name__ == "__main__":
    main()
