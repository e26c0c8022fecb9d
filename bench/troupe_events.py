"""Reading a run's events.jsonl: for the benchmarks, and (through tests/integration/harness.py)
for the tests."""

import json
import sys


def parse_events(lines, source="events.jsonl"):
    """The events among `lines` (text, one JSON object per line). A line that is not a JSON
    object (the torn tail of a write a full disk cut short, a line still being written, or
    garbage) is skipped with a warning on stderr: a reader never fails on the file's content."""
    out = []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):  # JSONDecodeError; nesting deeper than Python's stack
            print(f"warning: {source}:{number}: skipping a torn line ({line[:60]!r})",
                  file=sys.stderr, flush=True)
            continue
        if not isinstance(event, dict):
            print(f"warning: {source}:{number}: skipping a line that is not an event object "
                  f"({line[:60]!r})", file=sys.stderr, flush=True)
            continue
        out.append(event)
    return out


def read_events(path):
    """events.jsonl as a list of events (see parse_events); bytes that are not UTF-8 are
    replaced, never fatal."""
    with open(path, "rb") as f:
        # Lines end at "\n" alone (JSON Lines); a stray "\r" is whitespace inside a line.
        return parse_events((raw.decode("utf-8", "replace") for raw in f), path)
