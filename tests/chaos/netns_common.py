"""Shared helpers of the netns tests: the harness on the path, failures that say what broke,
and waits on conditions with deadlines (never a sleep that hopes)."""

import os
import sys
import time

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "chaos", "netns"))

import cluster as netns  # noqa: E402,F401  (re-exported for the tests)
import measure  # noqa: E402,F401
import scenario  # noqa: E402,F401

SCENARIOS = os.path.join(REPO, "chaos", "scenarios")


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    raise SystemExit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def wait_until(predicate, timeout, what):
    """Polls `predicate` until it is truthy; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    pause = 0.01
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def step(text):
    print(f"--- {text}", flush=True)
