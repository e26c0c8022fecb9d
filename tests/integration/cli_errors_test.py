"""Bad options and bad configs end with exit code 2 and a one-line message naming the field."""

import json
import os
import subprocess
import tempfile

from harness import TROUPE, fail, main


def run(args):
    p = subprocess.run([TROUPE] + args, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def expect_usage_error(args, *needles):
    code, out = run(args)
    if code != 2:
        fail(f"{args}: expected exit code 2, got {code}:\n{out}")
    for n in needles:
        if n not in out:
            fail(f"{args}: message should mention {n!r}:\n{out}")
    if len(out.strip().splitlines()) != 1:
        fail(f"{args}: expected a one-line message, got:\n{out}")


def test():
    with tempfile.TemporaryDirectory() as tmp:
        def config(name, text):
            path = os.path.join(tmp, name)
            with open(path, "w") as f:
                f.write(text)
            return path

        rd = ["--run-dir", os.path.join(tmp, "run")]
        expect_usage_error(["run", "--bogus"], "--bogus")
        expect_usage_error(["run", "--world"], "--world")
        expect_usage_error(["run", "--world", "abc"], "--world", "integer")
        expect_usage_error(["run", "--steps", "0"], "steps")
        expect_usage_error(["run", "--heads", "3"], "model.n_head", "model.d_model")
        expect_usage_error(["run", "--world", "3"], "world", "micro-batches")
        expect_usage_error(["run", "--world", "64"], "world")
        expect_usage_error(["run", "--batch", "10", "--micro-batch", "4"], "batch", "micro_batch")
        expect_usage_error(["run", "--set", "optim.lr"], "--set", "KEY=VALUE")
        expect_usage_error(["run", "--set", "optim.nope=1"], "optim.nope")
        expect_usage_error(["run", "--config", os.path.join(tmp, "missing.json")], "missing.json")
        expect_usage_error(["run", "--config", config("bad.json", "{ steps: ")], "bad.json", "JSON")
        expect_usage_error(["run", "--config", config("unknown.json", '{"stpes": 10}')], "stpes")
        expect_usage_error(["run", "--config", config("type.json", '{"model": {"n_layer": "four"}}')],
                           "model.n_layer", "integer")
        expect_usage_error(["run", "--config", config("heads.json", json.dumps({"model": {"n_head": 5}}))],
                           "model.n_head")
        expect_usage_error(["run", "--data", os.path.join(tmp, "nothing.txt")] + rd, "nothing.txt")
        expect_usage_error(["run", "--resume"] + rd, "resume", "checkpoint")
        expect_usage_error(["run", "--tp", "3"], "parallel.tp", "model.n_head")
        expect_usage_error(["run", "--pp", "9"], "parallel.pp", "model.n_layer")
        expect_usage_error(["run", "--ep", "2"], "parallel.ep", "model.experts")
        expect_usage_error(["run", "--schedule", "zigzag"], "parallel.schedule")
        expect_usage_error(["run", "--zero", "2"], "parallel.zero")
        expect_usage_error(["run", "--top-k", "3"], "model.top_k")
        # An explicit --micro-batches is honoured or refused, never answered with another layout.
        fresh = ["--run-dir", os.path.join(tmp, "fresh")]
        expect_usage_error(["run", "--world", "4", "--micro-batches", "2"] + fresh, "--micro-batches", "4")
        expect_usage_error(["run", "--micro-batches", "3"] + fresh, "--micro-batches", "must divide batch")
        # The elastic options are checked before anything starts.
        expect_usage_error(["run", "--min-ranks", "3"], "--min-ranks")
        expect_usage_error(["run", "--max-ranks", "1"], "--max-ranks")
        expect_usage_error(["run", "--spares", "-1"], "--spares")
        expect_usage_error(["run", "--nodes", "9"], "--nodes")
        expect_usage_error(["run", "--heartbeat-timeout-ms", "5"], "--heartbeat-timeout-ms")
        expect_usage_error(["run", "--straggler-policy", "shoot"], "--straggler-policy")
        expect_usage_error(["run", "--fault", "kill:rank=9:step=3"], "--fault", "rank")
        expect_usage_error(["run", "--fault", "melt:rank=1:step=3"], "--fault", "melt")
        expect_usage_error(["run", "--fault", "slow:rank=1:factor=0.5:from=3"], "--fault", "factor")
        expect_usage_error(["run", "--fault", "random:kills=500:seed=1"] + fresh, "--fault", "kills")
        if os.path.exists(os.path.join(tmp, "fresh")):
            fail("a refused run left a run directory behind")
        expect_usage_error(["agent"], "--coordinator")
        expect_usage_error(["agent", "--coordinator", "nohost"], "HOST:PORT")
        expect_usage_error(["worker", "--coordinator", "127.0.0.1:5", "--member", "x"], "--member")
        expect_usage_error(["worker", "--coordinator", "127.0.0.1:5", "--member", "1", "--standby",
                            "--join-token", "t"], "--standby")
        expect_usage_error(["agent", "--coordinator", "127.0.0.1:5", "--ranks", "0"], "--ranks")
        expect_usage_error(["dance"], "dance")
        expect_usage_error(["bench", "nothing"], "nothing")
        # The collectives benchmark runs (a tiny sweep) and prints its table.
        code, out = run(["bench", "comm", "--ranks", "2", "--ops", "all_reduce", "--min-bytes", "4K",
                         "--max-bytes", "16K", "--batches", "1", "--batch-seconds", "0.01"])
        if code != 0 or "busbw" not in out or "16384" not in out:
            fail(f"troupe bench comm smoke run: exit {code}:\n{out}")
        for cmd in (["run"], ["coordinator"], ["agent"], ["worker"], ["bench"], ["bench", "comm"], []):
            code, out = run(cmd + ["--help"])
            if code != 0 or "usage" not in out:
                fail(f"troupe {' '.join(cmd)} --help: exit {code}:\n{out}")
        # A valid config file is accepted and options override it.
        good = config("good.json", json.dumps({"steps": 7, "model": {"n_layer": 1}}))
        code, out = run(["run", "--config", good, "--steps", "0"])
        if code != 2 or "steps" not in out:
            fail(f"an option should override the config file (steps 0 is invalid):\n{out}")


if __name__ == "__main__":
    main(test)
