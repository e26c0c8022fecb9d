"""The README's path from text to a model you can use (issue 40), end to end, as a user runs it:

    troupe tokenize CORPUS data/ --vocab 400         a SentencePiece tokenizer and token files
    troupe run --data data/train.bin ...              trains on them (the vocabulary and val.bin
                                                      come from the data), world 2, ZeRO-1
    troupe eval RUN_DIR                               the validation loss of the last checkpoint
    troupe ckpt export RUN_DIR --format torch OUT     GPT-2 names
    examples/python/gpt2.py                           the same loss in plain PyTorch
    troupe sample RUN_DIR --prompt ... --tokens N     text through the tokenizer

Checks: the job's vocabulary is the tokenizer's; `troupe eval` gives the job's own last
validation loss (1e-5 relative); PyTorch gives it too from the exported file (1e-5); the
sample decodes to text that starts with the prompt and is the same for the same seed.
"""

import glob
import json
import os
import subprocess
import sys
import tempfile

from harness import TROUPE, fail, main, run_ok, skip

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PYTHON = "/usr/bin/python3"


def troupe(*args, timeout=300):
    p = subprocess.run([TROUPE] + list(args), capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        fail(f"troupe {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p.stdout


def corpus_text():
    # Prose troupe did not generate: its own documentation, a few hundred kilobytes.
    parts = []
    for path in [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs",
                                                                               "*.md"))):
        with open(path, encoding="utf-8") as f:
            parts.append(f.read())
    return "\n".join(parts)


def pytorch_loss(export, windows_from, run_dir):
    """The loss of the exported model on the windows `troupe eval --json` scored, in a child
    process with torch (Skipped without it)."""
    code = f"""
import json, sys
sys.path.insert(0, {os.path.join(ROOT, "examples", "python")!r})
import torch
from gpt2 import load, batch_loss
model, _ = load({export!r})
windows = json.load(open({windows_from!r}))
x = torch.tensor(windows["inputs"]); y = torch.tensor(windows["targets"])
print(float(batch_loss(model, x, y)))
"""
    p = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        if "No module named 'torch'" in p.stderr:
            return None
        fail(f"loading the export in PyTorch failed:\n{p.stderr}")
    return float(p.stdout.strip().splitlines()[-1])


def val_windows(data_dir, context, count):
    """Consecutive windows of val.bin: the test's own batch, read from the token file."""
    with open(os.path.join(data_dir, "val.bin.json")) as f:
        meta = json.load(f)
    width = {"uint16": 2, "uint32": 4}[meta["dtype"]]
    with open(os.path.join(data_dir, "val.bin"), "rb") as f:
        raw = f.read()
    ids = [int.from_bytes(raw[i:i + width], "little") for i in range(0, len(raw), width)]
    inputs, targets = [], []
    for k in range(count):
        w = ids[k * context:(k + 1) * context + 1]
        inputs.append(w[:-1])
        targets.append(w[1:])
    return inputs, targets


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-datapath-") as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            f.write(corpus_text())
        data = os.path.join(tmp, "data")
        troupe("tokenize", corpus, data, "--vocab", "400", "--threads", "2")
        for name in ("tokenizer.model", "train.bin", "train.bin.json", "val.bin", "val.bin.json"):
            if not os.path.exists(os.path.join(data, name)):
                fail(f"troupe tokenize wrote no {name}")

        run_dir = os.path.join(tmp, "run")
        context = 32
        events = run_ok("training on the token files",
                        ["--data", os.path.join(data, "train.bin"), "--world", "2", "--zero", "1",
                         "--layers", "2", "--heads", "2", "--d-model", "32", "--context",
                         str(context), "--batch", "8", "--micro-batch", "2", "--steps", "40",
                         "--eval-every", "20", "--checkpoint-every", "20", "--no-progress",
                         "--metrics-port", "0"], run_dir)
        with open(os.path.join(run_dir, "config.json")) as f:
            cfg = json.load(f)
        if cfg["model"]["vocab"] != 400:
            fail(f"the job's vocabulary is {cfg['model']['vocab']}, not the tokenizer's 400")
        logged = {e["step"]: e["val_loss"] for e in events if e.get("event") == "validation"}
        if 40 not in logged:
            fail(f"no validation loss at step 40: {sorted(logged)}")

        evaluated = json.loads(troupe("eval", run_dir, "--json").strip().splitlines()[-1])
        diff = abs(evaluated["loss"] - logged[40]) / logged[40]
        print(f"troupe eval {evaluated['loss']:.6f} against the job's validation loss "
              f"{logged[40]:.6f} ({diff:.1e})")
        if diff > 1e-5:
            fail(f"troupe eval gives {evaluated['loss']}, the job logged {logged[40]}")

        export = os.path.join(tmp, "model.pt")
        troupe("ckpt", "export", run_dir, "--format", "torch", export)
        inputs, targets = val_windows(data, context, 8)
        windows = os.path.join(tmp, "windows.json")
        with open(windows, "w") as f:
            json.dump({"inputs": inputs, "targets": targets}, f)
        ids_file = os.path.join(tmp, "windows.bin")
        with open(ids_file, "wb") as f:
            for w in inputs:
                for t in w:
                    f.write(int(t).to_bytes(2, "little"))
            f.write(int(targets[-1][-1]).to_bytes(2, "little"))
        torch_loss = pytorch_loss(export, windows, run_dir)
        if torch_loss is None:
            skip("the PyTorch part: no torch here (scripts/setup.sh installs python3-torch)")
        else:
            # troupe's loss on the same consecutive windows (eval --data scores every token
            # after the first once, in windows of the context).
            with open(ids_file + ".json", "w") as f:
                json.dump({"format": "troupe.tokens", "version": 1, "dtype": "uint16",
                           "vocab_size": 400, "tokens": len(inputs) * context + 1,
                           "tokenizer": os.path.join("data", "tokenizer.model")}, f)
            ours = json.loads(troupe("eval", run_dir, "--data", ids_file,
                                     "--json").strip().splitlines()[-1])["loss"]
            diff = abs(torch_loss - ours) / ours
            print(f"PyTorch on the export {torch_loss:.6f}, troupe {ours:.6f} ({diff:.1e})")
            if diff > 1e-5:
                fail(f"the exported model's loss in PyTorch is {torch_loss}, troupe's {ours}")

        prompt = "The coordinator"
        text = troupe("sample", run_dir, "--prompt", prompt, "--tokens", "40", "--seed", "5")
        again = troupe("sample", run_dir, "--prompt", prompt, "--tokens", "40", "--seed", "5")
        if not text.startswith(prompt):
            fail(f"the sample does not start with its prompt: {text!r}")
        if text != again:
            fail(f"the same seed sampled two texts:\n{text!r}\n{again!r}")
        print(f"sample: {text.strip()!r}")


if __name__ == "__main__":
    main(test)
