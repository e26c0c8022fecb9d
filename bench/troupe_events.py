"""Reading a run's events.jsonl for the benchmarks (the tests have their own in harness.py)."""

import json
import sys


def read_events(path):
    """events.jsonl as a list; a torn line (a write the disk cut short) is skipped with a warning."""
    out = []
    with open(path, errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                print(f"warning: {path}:{number}: skipping a torn line", file=sys.stderr)
    return out
