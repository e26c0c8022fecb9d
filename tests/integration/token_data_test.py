"""Token files (issue 40): flat uint16 or uint32 ids with a .json sidecar, memory-mapped.

(a) A uint16 file and a uint32 file each train at world 2 and resume exactly: 10 steps, stop,
    --resume to 16, against 16 uninterrupted (1e-6 relative); the vocabulary is the
    sidecar's and a train.bin finds the val.bin beside it.
(b) A 4 GB sparse token file trains with each worker's peak resident memory within 100 MB of
    the same job on a 4 MB file (VmHWM, reported in the `memory` events).
(c) Each bad file, and a --vocab below the data's, is refused with exit 2 and a message that
    names it, before anything starts.
"""

import json
import os
import struct
import tempfile

from harness import (SMALL_MODEL, fail, last_job, main, relative_difference, run_ok,
                     run_to_end, step_losses)

JOB = SMALL_MODEL + ["--world", "2", "--metrics-port", "0"]


def write_tokens(path, ids, dtype, vocab, sidecar_tokens=None):
    code = {"uint16": "H", "uint32": "I"}[dtype]
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{len(ids)}{code}", *ids))
    with open(path + ".json", "w") as f:
        json.dump({"format": "troupe.tokens", "version": 1, "dtype": dtype, "vocab_size": vocab,
                   "tokens": len(ids) if sidecar_tokens is None else sidecar_tokens,
                   "tokenizer": ""}, f)


def corpus(n, vocab, seed):
    # A learnable stream: short runs of consecutive ids starting at pseudo-random places.
    ids, x = [], seed
    while len(ids) < n:
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        start = (x >> 33) % (vocab - 8)
        ids.extend(range(start, start + 8))
    return ids[:n]


def config_of(run_dir):
    with open(os.path.join(run_dir, "config.json")) as f:
        return json.load(f)


def trains_and_resumes(tmp, dtype, vocab):
    data = os.path.join(tmp, dtype)
    os.makedirs(data)
    write_tokens(os.path.join(data, "train.bin"), corpus(40000, vocab, 1), dtype, vocab)
    write_tokens(os.path.join(data, "val.bin"), corpus(4000, vocab, 2), dtype, vocab)
    args = JOB + ["--data", os.path.join(data, "train.bin"), "--steps", "16",
                  "--checkpoint-every", "10", "--eval-every", "8"]
    whole_dir = os.path.join(tmp, dtype + "-whole")
    whole = run_ok(f"{dtype} uninterrupted", args, whole_dir)
    cfg = config_of(whole_dir)
    if cfg["model"]["vocab"] != vocab:
        fail(f"{dtype}: the job's vocabulary is {cfg['model']['vocab']}, not the sidecar's {vocab}")
    if not cfg.get("val_data", "").endswith(os.path.join(dtype, "val.bin")):
        fail(f"{dtype}: train.bin did not find the val.bin beside it: val_data "
             f"{cfg.get('val_data')!r}")
    if not any(e.get("event") == "validation" for e in whole):
        fail(f"{dtype}: no validation loss was reported")
    reference = step_losses(whole)
    halves = os.path.join(tmp, dtype + "-halves")
    first = step_losses(run_ok(f"{dtype} first half", args + ["--exit-after-step", "10"], halves))
    if max(first) != 10:
        fail(f"{dtype}: the first half stopped at step {max(first)}, not 10")
    resumed = step_losses(last_job(run_ok(f"{dtype} resumed", args + ["--resume"], halves)))
    if sorted(resumed) != list(range(11, 17)):
        fail(f"{dtype}: the resumed run trained steps {sorted(resumed)}, not 11..16")
    worst = max(relative_difference(reference[s], loss)
                for s, loss in list(first.items()) + list(resumed.items()))
    print(f"{dtype} (vocabulary {vocab}): worst relative difference against the uninterrupted "
          f"run {worst:.2e}")
    if worst > 1e-6:
        fail(f"{dtype}: stopped and resumed, the losses differ by {worst:.2e} (> 1e-6)")


def peak_rss(events):
    peaks = {}
    for e in events:
        if e.get("event") == "memory" and e.get("peak_rss_bytes"):
            peaks[e["rank"]] = max(peaks.get(e["rank"], 0), e["peak_rss_bytes"])
    return peaks


def bounded_memory(tmp):
    big = os.path.join(tmp, "big.bin")
    tokens = 2 << 30  # 4 GiB of uint16 ids, all holes: no disk used
    with open(big, "wb") as f:
        f.truncate(2 * tokens)
    with open(big + ".json", "w") as f:
        json.dump({"format": "troupe.tokens", "version": 1, "dtype": "uint16",
                   "vocab_size": 512, "tokens": tokens, "tokenizer": ""}, f)
    small = os.path.join(tmp, "small.bin")
    write_tokens(small, corpus(2 << 20, 512, 3), "uint16", 512)  # 4 MiB
    peaks = {}
    for name, path in (("4 MiB", small), ("4 GiB", big)):
        events = run_ok(f"the {name} file", JOB + ["--data", path, "--steps", "12"],
                        os.path.join(tmp, "rss-" + name.replace(" ", "")))
        peaks[name] = peak_rss(events)
        if len(peaks[name]) != 2:
            fail(f"the {name} file: no peak memory reported for both ranks: {peaks[name]}")
    for rank in (0, 1):
        extra = peaks["4 GiB"][rank] - peaks["4 MiB"][rank]
        print(f"rank {rank}: peak RSS {peaks['4 MiB'][rank] >> 20} MiB on 4 MiB of tokens, "
              f"{peaks['4 GiB'][rank] >> 20} MiB on 4 GiB ({extra / 2**20:+.1f} MiB)")
        if extra > 100 << 20:
            fail(f"rank {rank} held {extra >> 20} MiB more on the 4 GiB file (> 100 MiB)")


def refusals(tmp):
    good = os.path.join(tmp, "good.bin")
    write_tokens(good, corpus(20000, 300, 4), "uint16", 300)
    odd = os.path.join(tmp, "odd.bin")
    write_tokens(odd, corpus(20000, 300, 4), "uint16", 300)
    with open(odd, "ab") as f:
        f.write(b"\0")
    high = os.path.join(tmp, "high.bin")
    ids = corpus(20000, 300, 5)
    ids[12345] = 300
    write_tokens(high, ids, "uint16", 300)
    empty = os.path.join(tmp, "empty.bin")
    write_tokens(empty, [], "uint16", 300)
    miscounted = os.path.join(tmp, "miscounted.bin")
    write_tokens(miscounted, corpus(20000, 300, 4), "uint16", 300, sidecar_tokens=30000)
    bad_sidecar = os.path.join(tmp, "bad-sidecar.bin")
    write_tokens(bad_sidecar, corpus(20000, 300, 4), "uint16", 300)
    with open(bad_sidecar + ".json", "w") as f:
        f.write('{"format": "troupe.tokens", "version": 1, "dtype": "int8"}')
    other_val = os.path.join(tmp, "other-val.bin")
    write_tokens(other_val, corpus(20000, 600, 4), "uint16", 600)
    headless = os.path.join(tmp, "nanogpt.bin")
    with open(headless, "wb") as f:
        f.write(struct.pack("<20000H", *corpus(20000, 300, 4)))
    cases = [
        ("a .bin file without a sidecar", ["--data", headless],
         [headless + ".json", "no sidecar"]),
        ("size not a multiple of the width", ["--data", odd], [odd, "not a multiple of 2"]),
        ("an id at the vocabulary", ["--data", high], [high, "token 12345 is 300"]),
        ("empty", ["--data", empty], [empty, "empty"]),
        ("a directory", ["--data", tmp], [tmp, "is a directory"]),
        ("a count the file does not hold", ["--data", miscounted], [miscounted, "30000"]),
        ("a malformed sidecar", ["--data", bad_sidecar], [bad_sidecar + ".json"]),
        ("--vocab below the data's", ["--data", good, "--vocab", "256"],
         ["--vocab", "300", good]),
        ("a validation file of another vocabulary", ["--data", good, "--val-data", other_val],
         [other_val, "does not match"]),
    ]
    for what, args, words in cases:
        code, _, output = run_to_end(JOB + ["--steps", "2"] + args, timeout=60,
                                     run_dir=os.path.join(tmp, "refused"))
        if code != 2:
            fail(f"{what}: exit {code}, not 2:\n{output}")
        missing = [w for w in words if w not in output]
        if missing:
            fail(f"{what}: the message does not say {missing}:\n{output}")
        print(f"refused, exit 2: {what}")


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-tokens-") as tmp:
        refusals(tmp)
        trains_and_resumes(tmp, "uint16", 1000)
        trains_and_resumes(tmp, "uint32", 70000)
        bounded_memory(tmp)


if __name__ == "__main__":
    main(test)
