"""Shared helpers of the netns tests: the netns harness (chaos/netns) on the path, failures that
say what broke, and waits on conditions with deadlines (never a sleep that hopes); `fail` and
`wait_until` are the end-to-end tests' own (tests/integration/harness.py)."""

import os
import sys

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "chaos", "netns"))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))

import cluster as netns  # noqa: E402,F401  (re-exported for the tests)
import measure  # noqa: E402,F401
import scenario  # noqa: E402,F401
from harness import fail, wait_until  # noqa: E402,F401

SCENARIOS = os.path.join(REPO, "chaos", "scenarios")


def check(cond, msg):
    if not cond:
        fail(msg)


def step(text):
    print(f"--- {text}", flush=True)
