"""Fuzzes the reader of events.jsonl (bench/troupe_events.py, which the tests' harness uses
too): a real run's events file, mutated 3,000 times with a fixed seed (cut at any byte, bytes
flipped, random bytes and lines inserted, lines nested 100,000 deep, JSON lines that are not
objects, bytes that are not UTF-8). The reader must never raise, must return only event
objects, and must return every line that the mutation left whole."""

import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402
import troupe_events  # noqa: E402  (put on the path by harness)

ITERATIONS = 3000


def real_events_file(tmp):
    """events.jsonl of a short real run (its lines are what the reader meets in practice)."""
    run_dir = os.path.join(tmp, "run")
    p = subprocess.run([harness.TROUPE, "run", "--run-dir", run_dir, "--metrics-port", "0",
                        "--steps", "6", "--checkpoint-every", "3"] + harness.SMALL_MODEL,
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        harness.fail(f"the seed run failed ({p.returncode}): {p.stderr[-2000:]}")
    with open(os.path.join(run_dir, "events.jsonl"), "rb") as f:
        return f.read()


def mutate(data, rng):
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(7)
        at = rng.randint(0, len(data))
        if kind == 0:  # a write cut short
            del data[at:]
        elif kind == 1 and data:  # flipped bytes
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == 2:  # random bytes, newlines among them
            data[at:at] = bytes(rng.choice([0, 10, 13, 0x22, 0x7b, 0x7d, 0xff, rng.randrange(256)])
                                for _ in range(rng.randint(1, 64)))
        elif kind == 3:  # nesting deeper than Python's stack
            data[at:at] = b"\n" + b"[" * 100000 + b"\n"
        elif kind == 4:  # valid JSON that is not an event object
            data[at:at] = b"\n" + rng.choice([b"5", b"[1, 2]", b"null", b'"step"', b"true",
                                              b"1e999", b"NaN", b"-Infinity"]) + b"\n"
        elif kind == 5:  # not UTF-8
            data[at:at] = bytes([0xc3, 0x28, 0xa0, 0xa1, 0xf0, 0x28, 0x8c, 0xbc])
        else:  # a whole line repeated
            lines = bytes(data).split(b"\n")
            if lines:
                data += b"\n" + rng.choice(lines)
    return bytes(data)


def whole_event_lines(data):
    """The lines of `data` that parse as event objects by themselves (what must come back)."""
    out = []
    for raw in data.split(b"\n"):
        try:
            text = raw.decode("utf-8").strip()
            event = json.loads(text) if text else None
        except (ValueError, RecursionError):
            continue
        if isinstance(event, dict):
            out.append(event)
    return out


def main():
    with tempfile.TemporaryDirectory() as tmp:
        seed = real_events_file(tmp)
        if len(troupe_events.read_events(os.path.join(tmp, "run", "events.jsonl"))) < 10:
            harness.fail("the seed run wrote fewer than 10 events")
        rng = random.Random(20261204)
        path = os.path.join(tmp, "mutated.jsonl")
        devnull = open(os.devnull, "w")
        for i in range(ITERATIONS):
            data = mutate(seed, rng)
            with open(path, "wb") as f:
                f.write(data)
            stderr, sys.stderr = sys.stderr, devnull  # the reader's warnings, 3,000 times
            try:
                events = troupe_events.read_events(path)
            except Exception as e:  # noqa: BLE001 (any exception is the failure)
                sys.stderr = stderr
                harness.fail(f"iteration {i}: the reader raised {type(e).__name__}: {e}")
            finally:
                sys.stderr = stderr
            if not all(isinstance(e, dict) for e in events):
                harness.fail(f"iteration {i}: the reader returned something that is not an event")
            expected = whole_event_lines(data)
            missing = [e for e in expected if e not in events]
            if missing:
                harness.fail(f"iteration {i}: {len(missing)} whole lines were not returned, "
                             f"the first: {json.dumps(missing[0])[:200]}")
        print(f"events reader: {ITERATIONS} mutated files, no failure")


if __name__ == "__main__":
    main()
