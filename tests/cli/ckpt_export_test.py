"""`troupe ckpt export` (issue 40) on real runs: tiny jobs trained as dp (world 2), ZeRO-1,
tp2 and pp2 are exported as safetensors and as torch files.

- An independent safetensors reader (here, the standard library only) accepts each file:
  header length and padding, JSON, F32 dtypes, shapes, offsets sorted, contiguous and in
  bounds, metadata.
- torch.load (Debian's torch 1.13) reads the torch file as an OrderedDict of the same tensors
  (the tied lm_head sharing wte's storage), weights_only too.
- examples/python/gpt2.py takes each file with load_state_dict(strict=True), and its loss on
  troupe's validation windows (reproduced here from runtime/data/dataset.cpp and
  runtime/data/random.hpp) equals the validation loss troupe logged for that step (relative
  1e-5); its script prints a loss and samples.
- The layouts' exports of the same training (and of a dp2 x tp2 ZeRO-1 mix) agree within
  float noise.
- Bad options exit 2 (unknown format, no OUT, no --format, a step with no checkpoint naming
  the steps that exist, OUT a directory); damaged checkpoints exit 1 under --step, and the
  default passes over them to an intact one; an MoE model is refused with exit 2; a failed
  export leaves OUT as it was.

Without torch the torch parts are skipped (exit 77) after the rest ran."""

import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import harness  # noqa: E402
from harness import fail  # noqa: E402

TROUPE = os.environ.get("TROUPE_BIN", "")
SEED = 11
STEPS = 12  # enough, at a high learning rate, to move the loss well below ln 256
MODEL = {"layers": 2, "heads": 2, "d_model": 32, "context": 32}
MICRO_BATCH = 2
EVAL_BATCHES = 3
VAL_FRACTION = 0.05
MODEL_ARGS = ["--layers", "2", "--heads", "2", "--d-model", "32", "--context", "32",
              "--batch", "8", "--micro-batch", str(MICRO_BATCH), "--steps", str(STEPS),
              "--seed", str(SEED), "--lr", "0.01", "--warmup-steps", "2", "--eval-every", "0", "--eval-batches", str(EVAL_BATCHES),
              "--val-fraction", str(VAL_FRACTION), "--keep-last", "0", "--metrics-port", "0",
              "--no-progress"]
# Each layout trains the same job; dp checkpoints every step (the damage checks need older
# checkpoints), the others at the end only. The value: the options, and what the manifest's
# layout names.
LAYOUTS = {"dp": (["--world", "2", "--checkpoint-every", "1"], "dp2"),
           "zero1": (["--world", "2", "--zero", "1", "--checkpoint-every", "0"], "dp2"),
           "tp2": (["--world", "2", "--tp", "2", "--checkpoint-every", "0"], "tp2"),
           "pp2": (["--world", "2", "--pp", "2", "--checkpoint-every", "0"], "pp2"),
           "tp2+zero1": (["--world", "4", "--tp", "2", "--zero", "1", "--checkpoint-every", "0"],
                         "dp2xtp2")}


def gpt2_names(n_layer):
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        names += [p + n for n in ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight",
                                  "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
                                  "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                                  "mlp.c_proj.weight", "mlp.c_proj.bias")]
    return names + ["transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"]


def gpt2_shapes(vocab, C, T, n_layer):
    shapes = {"transformer.wte.weight": [vocab, C], "transformer.wpe.weight": [T, C],
              "transformer.ln_f.weight": [C], "transformer.ln_f.bias": [C],
              "lm_head.weight": [vocab, C]}
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        shapes.update({p + "ln_1.weight": [C], p + "ln_1.bias": [C], p + "ln_2.weight": [C],
                       p + "ln_2.bias": [C], p + "attn.c_attn.weight": [C, 3 * C],
                       p + "attn.c_attn.bias": [3 * C], p + "attn.c_proj.weight": [C, C],
                       p + "attn.c_proj.bias": [C], p + "mlp.c_fc.weight": [C, 4 * C],
                       p + "mlp.c_fc.bias": [4 * C], p + "mlp.c_proj.weight": [4 * C, C],
                       p + "mlp.c_proj.bias": [C]})
    return shapes


# ---- troupe's validation windows (runtime/data/random.hpp, dataset.cpp) ----------------------

MASK64 = (1 << 64) - 1
VAL_STREAM = 0x76616C  # "val"


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def hash_words(a, b, c, d=0):
    h = splitmix64(a)
    h = splitmix64(h ^ b)
    h = splitmix64(h ^ c)
    return splitmix64(h ^ d)


def val_windows(data, seed, val_fraction, eval_batches, B, T):
    """The windows of T + 1 bytes of troupe's validation pass: micro-batch b, sample i at
    val_offset(seed, b, i), inside the held-out tail of the corpus."""
    held_out = math.floor(len(data) * val_fraction)
    begin = len(data) - held_out
    out = []
    for b in range(eval_batches):
        for i in range(B):
            o = begin + hash_words(seed, VAL_STREAM, b, i) % (held_out - T)
            out.append(data[o:o + T + 1])
    return out


# ---- an independent safetensors reader ----------------------------------------------------

def read_safetensors_strictly(path):
    """(names in data order, {name: (shape, floats)}, metadata), checking the specification."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        fail(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8 or (8 + n) % 8:
        fail(f"{path}: header length {n} runs past the file or leaves the data unaligned")
    raw = blob[8:8 + n]
    text = raw.rstrip(b" ")  # the padding: spaces only
    if not text.startswith(b"{") or not text.endswith(b"}"):
        fail(f"{path}: the header is not a JSON object padded with spaces: {raw[:40]!r}")
    header = json.loads(text)
    metadata = header.pop("__metadata__", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        fail(f"{path}: __metadata__ must map strings to strings: {metadata}")
    data = blob[8 + n:]
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    at = 0
    tensors = {}
    for name, info in entries:
        if set(info) != {"dtype", "shape", "data_offsets"} or info["dtype"] != "F32":
            fail(f"{path}: {name}: expected dtype F32, shape and data_offsets, got {info}")
        begin, end = info["data_offsets"]
        numel = math.prod(info["shape"])
        if begin != at or end - begin != 4 * numel or end > len(data):
            fail(f"{path}: {name}: offsets [{begin}, {end}) after {at}, {numel} floats, "
                 f"{len(data)} data bytes: not contiguous or out of bounds")
        tensors[name] = (info["shape"], struct.unpack(f"<{numel}f", data[begin:end]))
        at = end
    if at != len(data):
        fail(f"{path}: {len(data) - at} bytes after the last tensor")
    names = [name for name, _ in entries]
    if names != sorted(names):
        fail(f"{path}: tensors are not stored in name order: {names}")
    return names, tensors, metadata


# ---- running troupe -----------------------------------------------------------------------

def troupe(*args, timeout=60):
    p = subprocess.run([TROUPE, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def export(run_dir, fmt, out, *extra, expect=0):
    code, stdout, stderr = troupe("ckpt", "export", run_dir, *extra, "--format", fmt, out)
    if code != expect:
        fail(f"troupe ckpt export {run_dir} {' '.join(extra)} --format {fmt} {out}: expected exit "
             f"{expect}, got {code}\nstdout:\n{stdout}\nstderr:\n{stderr}")
    return stdout, stderr


def train(name, corpus, tmp, extra):
    run_dir = os.path.join(tmp, name)
    args = MODEL_ARGS + ["--data", corpus] + extra
    events = harness.run_ok(name, args, run_dir, timeout=120)
    losses = [e["val_loss"] for e in events if e.get("event") == "validation" and e["step"] == STEPS]
    if len(losses) != 1:
        fail(f"{name}: expected one validation event at step {STEPS}, got {losses}")
    return run_dir, losses[0]


def make_corpus(path):
    """Some 60 KB of varied text, the same every run."""
    words = ("the keeper wrote of wind and swell and fog that came in from the banks while "
             "seals slept on the rocks at low tide and the lamp turned by itself").split()
    lines, x = [], 7
    for _ in range(1500):
        x = (x * 6364136223846793005 + 1442695040888963407) & MASK64
        n = 5 + (x >> 60)
        lines.append(" ".join(words[(x >> (4 * k)) % len(words)] for k in range(n)).capitalize() + ".")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def have_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


# ---- the checks ---------------------------------------------------------------------------

def check_safetensors(path, step, layout):
    names, tensors, meta = read_safetensors_strictly(path)
    C, T, L = MODEL["d_model"], MODEL["context"], MODEL["layers"]
    expected = gpt2_shapes(256, C, T, L)
    if set(names) != set(expected):
        fail(f"{path}: tensors {sorted(set(names) ^ set(expected))} differ from GPT-2's")
    for name, (shape, _) in tensors.items():
        if shape != expected[name]:
            fail(f"{path}: {name} has shape {shape}, GPT-2's is {expected[name]}")
    want = {"format": "pt", "troupe_step": str(step), "d_model": str(C), "n_head": "2",
            "n_layer": str(L), "context": str(T), "vocab": "256", "weight_orientation": "conv1d"}
    if any(meta.get(k) != v for k, v in want.items()) or layout not in meta.get("troupe_layout", ""):
        fail(f"{path}: metadata {meta}, expected at least {want} and layout {layout}")
    hf = json.loads(meta["gpt2_config"])
    if (hf["n_embd"], hf["n_layer"], hf["n_head"], hf["n_positions"], hf["vocab_size"]) != \
            (C, L, 2, T, 256):
        fail(f"{path}: gpt2_config {hf}")
    if tensors["lm_head.weight"][1] != tensors["transformer.wte.weight"][1]:
        fail(f"{path}: lm_head.weight is not the tied wte")
    return tensors


def check_torch_file(path, st_tensors):
    import torch
    state = torch.load(path)
    if type(state).__name__ != "OrderedDict" or list(state) != gpt2_names(MODEL["layers"]):
        fail(f"{path}: torch.load gave {type(state).__name__} with keys {list(state)[:5]}...")
    for name, t in state.items():
        shape, values = st_tensors[name]
        if t.dtype != torch.float32 or list(t.shape) != shape or not t.is_contiguous() or \
                t.flatten().tolist() != list(values):
            fail(f"{path}: {name} differs from the safetensors export")
    if state["lm_head.weight"].data_ptr() != state["transformer.wte.weight"].data_ptr():
        fail(f"{path}: lm_head.weight should share wte's storage (tied)")
    if getattr(state, "troupe_metadata", {}).get("n_head") != "2":
        fail(f"{path}: troupe_metadata {getattr(state, 'troupe_metadata', None)}")
    safe = torch.load(path, weights_only=True)
    if list(safe) != list(state):
        fail(f"{path}: torch.load(weights_only=True) read {list(safe)[:3]}...")
    return state


def check_loss(gpt2, path, windows, troupe_loss):
    import torch
    model, meta = gpt2.load(path)
    batch = torch.tensor([list(w) for w in windows], dtype=torch.long)
    with torch.no_grad():
        loss = gpt2.batch_loss(model, batch[:, :-1], batch[:, 1:]).item()
    rel = harness.relative_difference(loss, troupe_loss)
    print(f"  {os.path.basename(path)}: loss {loss:.7f}, troupe's {troupe_loss:.7f}, "
          f"relative {rel:.2e}", flush=True)
    if rel > 1e-5:
        fail(f"{path}: the PyTorch module's loss {loss} differs from troupe's validation loss "
             f"{troupe_loss} by {rel:.2e} (relative) on the same windows")


def compare_layouts(exports):
    """The layouts' tensors of the same training, side by side with dp's."""
    base = exports["dp"]
    for layout, tensors in exports.items():
        worst = max(max(abs(a - b) for a, b in zip(tensors[n][1], base[n][1])) for n in base)
        print(f"  {layout} vs dp: largest difference {worst:.3g}", flush=True)
        # ZeRO-1 shards the optimizer and nothing of the arithmetic: the same bits. tp and pp
        # sum in another order: float noise, which three AdamW steps keep near 1e-6.
        limit = 0.0 if layout == "dp" else 1e-4
        if worst > limit:
            fail(f"{layout}'s export differs from dp's by {worst} (limit {limit})")


def check_readme_snippet(path):
    """README.md's load snippet (Checkpoints, Export) runs, on this test's tiny model."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    at = text.index("**Export.**")
    code = text[text.index("```python\n", at) + 10:text.index("```\n", text.index("```python", at) + 9)]
    shape = "GPT2(vocab=256, d_model=128, n_head=4, n_layer=4, context=64)"
    if shape not in code or '"model.pt"' not in code or '"examples/python"' not in code:
        fail(f"README.md's export snippet changed; update this test:\n{code}")
    code = code.replace(shape, "GPT2(vocab=256, d_model=32, n_head=2, n_layer=2, context=32)")
    code = code.replace('"model.pt"', repr(path))
    code = code.replace('"examples/python"', repr(os.path.join(ROOT, "examples", "python")))
    exec(compile(code, "README.md (export snippet)", "exec"), {})


def check_usage(tmp, run_dir):
    out = os.path.join(tmp, "usage.safetensors")
    for args, words in (
            (["ckpt", "export", run_dir, "--format", "onnx", out], "unknown --format 'onnx'"),
            (["ckpt", "export", run_dir, "--format", "torch"], "OUT"),
            (["ckpt", "export", run_dir, out], "--format is required"),
            (["ckpt", "export", "--format", "torch"], "RUN_DIR is required"),
            (["ckpt", "export", run_dir, "--step", "99", "--format", "torch", out],
             "its steps: " + ", ".join(str(s) for s in range(1, STEPS + 1)) + " ("),
            (["ckpt", "export", run_dir, "--step", "x", "--format", "torch", out], "--step"),
            (["ckpt", "export", run_dir, "--format", "torch", tmp], "is a directory"),
            (["ckpt", "export", run_dir, "--format", "torch", out, "extra"], "one too many"),
            (["ckpt", "export", run_dir, "--bogus", "--format", "torch", out], "--bogus")):
        code, stdout, stderr = troupe(*args)
        if code != 2 or words not in stderr:
            fail(f"{args}: expected exit 2 and {words!r} on stderr, got {code}:\n{stdout}{stderr}")
    if os.path.exists(out):
        fail(f"a refused export wrote {out}")
    code, stdout, _ = troupe("ckpt", "export", "--help")
    if code != 0 or "usage: troupe ckpt export" not in stdout or "Conv1D" not in stdout:
        fail(f"troupe ckpt export --help:\n{stdout}")
    code, _, stderr = troupe("ckpt", "export", os.path.join(tmp, "nowhere"), "--format", "torch",
                             out)
    if code != 1 or "not a directory" not in stderr:
        fail(f"export of a missing run directory: expected exit 1, got {code}:\n{stderr}")


def param_chunks(run_dir, step):
    """Chunk files holding step `step`'s parameters that no other checkpoint references."""
    ckpts = os.path.join(run_dir, "checkpoints")

    def manifest(s):
        with open(os.path.join(ckpts, f"step-{s:08d}", "manifest.json")) as f:
            return json.load(f)
    others = {k for s in range(1, STEPS + 1) if s != step
              for p in manifest(s)["pieces"] for k in p["chunks"]}
    keys = {k for p in manifest(step)["pieces"] if p["array"] == "params" for k in p["chunks"]}
    return [os.path.join(ckpts, "chunks", k[:2], k) for k in sorted(keys - others)]


def flip_byte(path):
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(48 + (os.path.getsize(path) - 48) // 2)  # past the 48-byte chunk header
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))


def check_damage(tmp, run_dir):
    """Run last: it damages the dp run's checkpoints."""
    out = os.path.join(tmp, "damaged.safetensors")
    with open(out, "w") as f:
        f.write("the old file\n")
    victims = param_chunks(run_dir, STEPS)
    if not victims:
        fail(f"found no chunk of step {STEPS}'s parameters of its own in {run_dir}")
    flip_byte(victims[0])
    _, stderr = export(run_dir, "safetensors", out, "--step", str(STEPS), expect=1)
    if os.path.basename(victims[0]) not in stderr:
        fail(f"export of a damaged checkpoint should name the chunk {victims[0]}:\n{stderr}")
    with open(out) as f:
        if f.read() != "the old file\n":
            fail("a failed export changed OUT")
    if [n for n in os.listdir(tmp) if ".tmp." in n]:
        fail(f"a failed export left temporary files: {os.listdir(tmp)}")
    # The default passes over the damaged step 3 to step 2, saying so.
    stdout, stderr = export(run_dir, "safetensors", out)
    if f"step {STEPS} is damaged, passed over" not in stderr or \
            f"exported step {STEPS - 1} " not in stdout:
        fail(f"export should pass over damaged step {STEPS} for step {STEPS - 1}:\n"
             f"{stdout}{stderr}")
    if read_safetensors_strictly(out)[2]["troupe_step"] != str(STEPS - 1):
        fail(f"{out} should hold step {STEPS - 1}")
    # An unreadable LATEST: every committed checkpoint is a candidate, newest first.
    latest = os.path.join(run_dir, "checkpoints", "LATEST")
    with open(latest, "w") as f:
        f.write("not a step\n")
    stdout, stderr = export(run_dir, "torch", out)
    if "LATEST is unreadable" not in stderr or f"exported step {STEPS - 1} " not in stdout:
        fail(f"export with an unreadable LATEST:\n{stdout}{stderr}")
    # Every checkpoint damaged: exit 1, nothing written.
    for step in range(1, STEPS):
        for path in param_chunks(run_dir, step)[:1]:
            flip_byte(path)
    os.remove(out)
    _, stderr = export(run_dir, "torch", out, expect=1)
    if "no intact checkpoint" not in stderr or os.path.exists(out):
        fail(f"export with every checkpoint damaged should fail, writing nothing:\n{stderr}")
    # A manifest that is not JSON is damage too, never a crash.
    with open(os.path.join(run_dir, "checkpoints", f"step-{STEPS:08d}", "manifest.json"), "w") as f:
        f.write("{not json")
    code, _, stderr = troupe("ckpt", "export", run_dir, "--step", str(STEPS), "--format", "torch",
                             out)
    if code != 1 or "manifest" not in stderr:
        fail(f"export of a garbled manifest: expected exit 1 naming it, got {code}:\n{stderr}")


def check_moe_refused(tmp, corpus):
    run_dir = os.path.join(tmp, "moe")
    args = MODEL_ARGS + ["--world", "1", "--steps", "1", "--experts", "2", "--data", corpus]
    harness.run_ok("moe", args, run_dir, timeout=120)
    code, _, stderr = troupe("ckpt", "export", run_dir, "--format", "safetensors",
                             os.path.join(tmp, "moe.safetensors"))
    if code != 2 or "Mixture-of-Experts" not in stderr:
        fail(f"export of an MoE model: expected exit 2 naming the experts, got {code}:\n{stderr}")


def test():
    if not TROUPE:
        fail("TROUPE_BIN is not set")
    torch_here = have_torch()
    if torch_here:
        import torch
        torch.set_num_threads(1)
        sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
        import gpt2
    else:
        harness.skip(f"{sys.executable} cannot import torch: torch.load and the PyTorch module")
    with tempfile.TemporaryDirectory(prefix="troupe-export-") as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        make_corpus(corpus)
        with open(corpus, "rb") as f:
            windows = val_windows(f.read(), SEED, VAL_FRACTION, EVAL_BATCHES, MICRO_BATCH,
                                  MODEL["context"])
        exports = {}
        for layout, (extra, layout_name) in LAYOUTS.items():
            run_dir, val_loss = train(layout, corpus, tmp, extra)
            st = os.path.join(tmp, f"{layout}.safetensors")
            pt = os.path.join(tmp, f"{layout}.pt")
            stdout, _ = export(run_dir, "safetensors", st)
            if f"exported step {STEPS} " not in stdout or "GPT-2 with 2 layers" not in stdout:
                fail(f"export's summary: {stdout}")
            export(run_dir, "torch", pt)
            exports[layout] = check_safetensors(st, STEPS, layout_name)
            if torch_here:
                check_torch_file(pt, exports[layout])
                check_loss(gpt2, st, windows, val_loss)
                check_loss(gpt2, pt, windows, val_loss)
        compare_layouts(exports)
        if torch_here:  # the example as a script: a loss and a greedy sample
            script = os.path.join(ROOT, "examples", "python", "gpt2.py")
            p = subprocess.run([sys.executable, script, os.path.join(tmp, "tp2.pt"), "--loss",
                                corpus, "--offsets", "0", "100", "--prompt", "The keeper",
                                "--tokens", "16"], capture_output=True, text=True, timeout=60)
            if p.returncode != 0 or "loss " not in p.stdout or "The keeper" not in p.stdout:
                fail(f"examples/python/gpt2.py: exit {p.returncode}\n{p.stdout}{p.stderr}")
            check_readme_snippet(os.path.join(tmp, "pp2.pt"))
        check_usage(tmp, os.path.join(tmp, "dp"))
        check_moe_refused(tmp, corpus)
        check_damage(tmp, os.path.join(tmp, "dp"))
        shutil.rmtree(os.path.join(tmp, "dp"), ignore_errors=True)


if __name__ == "__main__":
    harness.main(test)
