"""`troupe tokenize` (issue 40): a corpus of odd whitespace, unicode and characters never seen in
training goes to token files that decode back to it byte for byte (BPE and unigram, --check,
--decode, SentencePiece's spm_decode, and Python's sentencepiece when it is installed); the sidecars say what the files
hold; the held-out share is the corpus's end, cut at a line end; an existing tokenizer encodes
the same ids; every bad input exits 2 with a message naming the problem."""

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

TROUPE = os.environ.get("TROUPE_BIN", "")


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    raise SystemExit(1)


def troupe(*args, timeout=120):
    p = subprocess.run([TROUPE, *args], capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"), p.stdout


def tokenize(*args, expect=0):
    code, out, err, raw = troupe("tokenize", *args)
    if code != expect:
        fail(f"troupe tokenize {' '.join(args)}: expected exit {expect}, got {code}\n"
             f"stdout:\n{out}\nstderr:\n{err}")
    return out, err, raw


def make_corpus(path, lines=6000, seed=7):
    """English-like lines with every kind of text SentencePiece could change on the way back:
    runs of spaces and tabs, leading and trailing spaces, empty lines, CRLF, accents, CJK, emoji,
    SentencePiece's own space mark U+2581, control characters; the last lines hold characters
    that appear nowhere before them (so never in the tokenizer's training sample), and the file
    ends without a newline."""
    rng = random.Random(seed)
    words = ("the of and to in is that for it as was with be by on not he this are or his from "
             "at which but have an they you were her she there been one all we their has would "
             "when who will more no if out so said what up its about than into them can only "
             "other new some could time these two may then do first any my now such like our "
             "over man me even most made after also did many before must through back years "
             "where much your way well down should because each just those people how too "
             "little state good very make world still own see men work long get here between "
             "both life being under never day same another know while last might us great old "
             "year off come since against go came right used take three").split()
    odd = ["caf\u00e9", "na\u00efve", "\u00fcber", "\u4e2d\u6587", "\U0001F600", "x\u2581y",
           "\u2581", "\u2581\u2581lead", "\t", "a\tb", "\x01", "\x7f", "\u00a0nbsp"]
    out = []
    for i in range(lines):
        n = rng.randint(0, 14)
        line = " ".join(rng.choice(words) for _ in range(n))
        r = rng.random()
        if r < 0.05:
            line = "  " + line                      # leading spaces
        elif r < 0.10:
            line = line + "   "                     # trailing spaces
        elif r < 0.15:
            line = line.replace(" ", "  ", 2)       # doubled spaces
        elif r < 0.20:
            line = "\t" + line.replace(" ", "\t\t", 1)
        elif r < 0.25:
            line = line + "\r"                      # CRLF
        elif r < 0.32:
            line = line + " " + rng.choice(odd)
        out.append(line)
    # Never in the training share: only in the held-out tail (and the line before it).
    out.append("unseen \u0f04\u0f05 \U0001D11E \uac00\ud7a3 \u16a0 end  ")
    out.append("\u2581 \u2581\u2581 \t \u00e9\u0301 last line, no newline")
    text = "\n".join(out)
    with open(path, "wb") as f:
        f.write(text.encode("utf-8"))
    return text.encode("utf-8")


def read_ids(path, dtype):
    import array
    a = array.array("H" if dtype == "uint16" else "I")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return a


def check_output(corpus_bytes, out_dir, vocab, val=True):
    names = ["train.bin", "val.bin"] if val else ["train.bin"]
    expect_files = {"tokenizer.model"} | set(names) | {n + ".json" for n in names}
    have = set(os.listdir(out_dir))
    if have != expect_files:
        fail(f"{out_dir} holds {sorted(have)}, expected {sorted(expect_files)} (no temporaries)")
    decoded = b""
    for name in names:
        with open(os.path.join(out_dir, name + ".json")) as f:
            sidecar = json.load(f)
        keys = {"format", "version", "dtype", "vocab_size", "tokens", "tokenizer"}
        if set(sidecar) != keys:
            fail(f"{name}.json keys {sorted(sidecar)}, expected {sorted(keys)}")
        if (sidecar["format"], sidecar["version"], sidecar["dtype"], sidecar["vocab_size"],
                sidecar["tokenizer"]) != ("troupe.tokens", 1, "uint16", vocab, "tokenizer.model"):
            fail(f"{name}.json: {sidecar}")
        size = os.path.getsize(os.path.join(out_dir, name))
        if sidecar["tokens"] <= 0 or sidecar["tokens"] * 2 != size:
            fail(f"{name}: {size} bytes, sidecar says {sidecar['tokens']} uint16 tokens")
        ids = read_ids(os.path.join(out_dir, name), sidecar["dtype"])
        if max(ids) >= vocab:
            fail(f"{name}: id {max(ids)} >= vocab_size {vocab}")
        _, _, raw = tokenize("--decode", os.path.join(out_dir, name))
        decoded += raw
        if name == "val.bin":
            val_text = raw
    if decoded != corpus_bytes:
        at = next((i for i, (a, b) in enumerate(zip(decoded, corpus_bytes)) if a != b),
                  min(len(decoded), len(corpus_bytes)))
        fail(f"{out_dir}: decode(train.bin) + decode(val.bin) differs from the corpus at byte "
             f"{at}: {decoded[at:at + 40]!r} against {corpus_bytes[at:at + 40]!r} "
             f"({len(decoded)} bytes against {len(corpus_bytes)})")
    if val:
        share = len(val_text) / len(corpus_bytes)
        if not corpus_bytes.endswith(val_text) or corpus_bytes[-len(val_text) - 1] != ord("\n"):
            fail("val.bin is not the end of the corpus starting at a line")
        if not 0.03 < share < 0.07:
            fail(f"val.bin holds {share:.3f} of the corpus, expected about 0.05")
    return decoded


def test_round_trip(tmp, corpus, corpus_bytes):
    out_dir = os.path.join(tmp, "bpe")
    out, err, _ = tokenize(corpus, out_dir, "--vocab", "400")
    if "train.bin" not in out or "val.bin" not in out:
        fail(f"the summary does not name the files:\n{out}")
    check_output(corpus_bytes, out_dir, 400)
    out, _, _ = tokenize(corpus, out_dir, "--check")
    if "byte for byte" not in out:
        fail(f"--check said:\n{out}")

    # SentencePiece's own decoder (spm_decode, from the `sentencepiece` package that
    # scripts/setup.sh installs) gives the corpus back from the ids, all on one line.
    spm_decode = shutil.which("spm_decode")
    if not spm_decode:
        print("spm_decode not installed: the decode by SentencePiece's own tool is skipped")
    else:
        ids = [i for n in ("train.bin", "val.bin") for i in read_ids(os.path.join(out_dir, n), "uint16")]
        p = subprocess.run([spm_decode, "--model", os.path.join(out_dir, "tokenizer.model"),
                            "--input_format=id"], input=" ".join(map(str, ids)).encode() + b"\n",
                           capture_output=True, timeout=60)
        if p.returncode != 0 or p.stdout != corpus_bytes + b"\n":
            fail(f"spm_decode of the token files differs from the corpus (exit {p.returncode}): "
                 f"{p.stdout[:80]!r}... {p.stderr.decode()[:400]}")

    # Python's sentencepiece, where installed, reads the same model and ids.
    try:
        import sentencepiece as spm  # noqa: F401
    except ImportError:
        print("python3-sentencepiece not installed: the independent decode is skipped")
    else:
        sp = spm.SentencePieceProcessor(model_file=os.path.join(out_dir, "tokenizer.model"))
        text = "".join(sp.decode(list(read_ids(os.path.join(out_dir, n), "uint16")))
                       for n in ("train.bin", "val.bin"))
        if text.encode("utf-8") != corpus_bytes:
            fail("Python's sentencepiece decodes the token files to something else")

    # The same corpus through the tokenizer just trained: the same ids.
    again = os.path.join(tmp, "again")
    tokenize(corpus, again, "--tokenizer", os.path.join(out_dir, "tokenizer.model"))
    for name in ("train.bin", "val.bin", "tokenizer.model"):
        with open(os.path.join(out_dir, name), "rb") as a, open(os.path.join(again, name), "rb") as b:
            if a.read() != b.read():
                fail(f"--tokenizer with the trained model wrote another {name}")
    tokenize(corpus, again, "--check")

    # A second run into the same directory replaces everything, leaving no temporaries.
    tokenize(corpus, out_dir, "--vocab", "300", "--val-fraction", "0.1", "--threads", "1")
    with open(os.path.join(out_dir, "train.bin.json")) as f:
        if json.load(f)["vocab_size"] != 300:
            fail("a second run kept the first run's sidecar")
    tokenize(corpus, out_dir, "--check")
    return out_dir


def test_unigram_without_validation(tmp, corpus, corpus_bytes):
    out_dir = os.path.join(tmp, "unigram")
    os.makedirs(out_dir)
    # A val.bin of an earlier run goes: with --val-fraction 0 there is no held-out share.
    for stale in ("val.bin", "val.bin.json"):
        open(os.path.join(out_dir, stale), "w").close()
    tokenize(corpus, out_dir, "--vocab", "500", "--model-type", "unigram", "--val-fraction", "0",
             "--sample-mb", "1")
    check_output(corpus_bytes, out_dir, 500, val=False)
    tokenize(corpus, out_dir, "--check")


def test_long_lines(tmp, model):
    """Lines longer than every block and batch: a 1.5 MB line of words, and one of 150,000
    characters the tokenizer never saw (450,000 byte pieces, more than one decoding batch: no
    character may be split between two); a corpus of so few lines still trains (its lines are
    sampled in sentences)."""
    rng = random.Random(11)
    words = "the of and to in is that for it as was with be by on not".split()
    text = ("first line\n" + " ".join(rng.choice(words) for _ in range(500000)) + "\n" +
            "".join(chr(rng.randint(0x9000, 0x9fff)) for _ in range(150000)) + "\n  tail\n")
    path = os.path.join(tmp, "long.txt")
    with open(path, "wb") as f:
        f.write(text.encode("utf-8"))
    given = os.path.join(tmp, "long_given")
    tokenize(path, given, "--tokenizer", model, "--val-fraction", "0")
    tokenize(path, given, "--check")
    _, _, raw = tokenize("--decode", os.path.join(given, "train.bin"))
    if raw != text.encode("utf-8"):
        fail("--decode of a file of long lines differs from its text")
    trained = os.path.join(tmp, "long_trained")
    tokenize(path, trained, "--vocab", "300", "--sample-mb", "1", "--val-fraction", "0.3")
    tokenize(path, trained, "--check")


def test_check_finds_a_difference(tmp, corpus_bytes, out_dir):
    other = os.path.join(tmp, "other.txt")
    changed = bytearray(corpus_bytes)
    changed[len(changed) // 2] = ord("#") if changed[len(changed) // 2] != ord("#") else ord("%")
    with open(other, "wb") as f:
        f.write(changed)
    code, out, err, _ = troupe("tokenize", other, out_dir, "--check")
    if code != 1 or f"at byte {len(changed) // 2}" not in err:
        fail(f"--check against a changed corpus: exit {code}\n{out}{err}")
    with open(other, "ab") as f:
        f.write(b"more")
    code, _, err, _ = troupe("tokenize", other, out_dir, "--check")
    if code != 1:
        fail(f"--check against a longer corpus: exit {code}\n{err}")


def test_bad_input(tmp, corpus, out_dir):
    def refused(args, *words):
        code, out, err, _ = troupe("tokenize", *args)
        if code != 2:
            fail(f"troupe tokenize {' '.join(args)}: expected exit 2, got {code}\n{out}{err}")
        for w in words:
            if w not in err:
                fail(f"troupe tokenize {' '.join(args)}: the message does not say '{w}':\n{err}")
        return err

    fresh = os.path.join(tmp, "fresh")
    empty = os.path.join(tmp, "empty.txt")
    open(empty, "w").close()
    latin1 = os.path.join(tmp, "latin1.txt")
    with open(latin1, "wb") as f:
        f.write(b"good line\nsecond line caf\xe9\nthird\n")
    one_line = os.path.join(tmp, "one_line.txt")
    with open(one_line, "w") as f:
        f.write("a single line of text without a line end " * 20)
    a_file = os.path.join(tmp, "a_file")
    open(a_file, "w").close()

    missing = os.path.join(tmp, "missing.txt")
    refused([missing, fresh, "--vocab", "400"], missing, "does not exist")
    refused([empty, fresh, "--vocab", "400"], empty, "empty")
    refused([tmp, fresh, "--vocab", "400"], "not a regular file")
    refused([latin1, fresh, "--vocab", "400"], latin1, "not UTF-8", "line 2", "iconv")
    refused([one_line, fresh, "--vocab", "400"], "single line", "--val-fraction 0")
    refused([corpus, fresh], "--vocab N is required")
    refused([corpus, fresh, "--vocab", "100"], "--vocab", "261")
    refused([corpus, fresh, "--vocab", "lots"], "--vocab", "lots")
    refused([corpus, fresh, "--vocab", "60000"], "--vocab 60000", corpus)  # too many for it
    refused([corpus, fresh, "--vocab", "400", "--model-type", "wordpiece"], "--model-type")
    refused([corpus, fresh, "--vocab", "400", "--val-fraction", "1.5"], "--val-fraction")
    refused([corpus, fresh, "--vocab", "400", "--vocabulary", "9"], "--vocabulary")
    refused([corpus, os.path.join(a_file, "sub"), "--vocab", "400"], "output directory",
            "give a directory you can write")
    refused([corpus, a_file, "--vocab", "400"], "output directory")
    refused([corpus], "output directory after the corpus")
    refused([corpus, fresh, "extra", "--vocab", "400"])
    refused([corpus, fresh, "--tokenizer", corpus], "not a SentencePiece model")
    refused([corpus, fresh, "--tokenizer", missing], missing)
    if os.path.exists(fresh) and os.listdir(fresh):
        fail(f"refused runs left files behind: {os.listdir(fresh)}")
    if os.geteuid() != 0:  # root writes anywhere
        locked = os.path.join(tmp, "locked")
        os.makedirs(locked, mode=0o500)
        refused([corpus, locked, "--vocab", "400"], "not writable")

    # Token files whose sidecar is missing or does not match.
    broken = os.path.join(tmp, "broken")
    shutil.copytree(out_dir, broken)
    with open(os.path.join(broken, "val.bin"), "ab") as f:
        f.write(b"\0")
    refused(["--decode", os.path.join(broken, "val.bin")], "val.bin", "sidecar")
    os.remove(os.path.join(broken, "train.bin.json"))
    refused(["--decode", os.path.join(broken, "train.bin")], "train.bin.json", "cannot be found")
    refused([corpus, broken, "--check"], "train.bin.json")
    with open(os.path.join(broken, "train.bin.json"), "w") as f:
        f.write('{"format": "troupe.tokens", "version": 1, "dtype": "int8", "vocab_size": 4, '
                '"tokens": 1, "tokenizer": "tokenizer.model"}')
    refused(["--decode", os.path.join(broken, "train.bin")], "train.bin.json", "dtype")
    refused(["--decode", os.path.join(broken, "nothing.bin")], "nothing.bin")


def test_help():
    code, out, _, _ = troupe("tokenize", "--help")
    if code != 0 or "usage: troupe tokenize" not in out or "--vocab" not in out:
        fail(f"troupe tokenize --help: exit {code}\n{out}")
    code, out, _, _ = troupe("--help")
    if code != 0 or "tokenize" not in out:
        fail(f"troupe --help does not list tokenize:\n{out}")


def main():
    if not TROUPE:
        fail("TROUPE_BIN is not set (ctest sets it)")
    with tempfile.TemporaryDirectory(prefix="tokenize_test.") as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        corpus_bytes = make_corpus(corpus)
        test_help()
        out_dir = test_round_trip(tmp, corpus, corpus_bytes)
        test_unigram_without_validation(tmp, corpus, corpus_bytes)
        test_long_lines(tmp, os.path.join(out_dir, "tokenizer.model"))
        test_check_finds_a_difference(tmp, corpus_bytes, out_dir)
        test_bad_input(tmp, corpus, out_dir)
    print("ok")


if __name__ == "__main__":
    main()
