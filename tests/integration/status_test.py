"""`troupe status` and `troupe top` (README "Watching a job"): on a running job (rank 0 slowed
20x so that it trains for a while and shows as a straggler) the summary names the state, the
world and one row per rank; `--json` is the coordinator's GET /status document with its fields;
/status needs the job's metrics token like /metrics (401 without it, and `troupe status` then
exits 2 asking for --token-file); `troupe top` on a pipe prints a frame per interval; once the
job has ended, `troupe status RUN_DIR` summarises it from events.jsonl."""

import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from harness import SMALL_MODEL, TROUPE, Job, fail, free_port, main, wait_until

TOKEN = "status-view-token"


def status(*args, timeout=30):
    """(exit code, stdout, stderr) of `troupe status ARGS`."""
    p = subprocess.run([TROUPE, "status", *args], capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def get(port, path, token=None):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def check_live(job, port, token_file):
    run_dir = job.run_dir
    # The coordinator records where its /status is once it listens.
    wait_until(lambda: os.path.exists(os.path.join(run_dir, "metrics.addr")), 60,
               "RUN_DIR/metrics.addr")
    with open(os.path.join(run_dir, "metrics.addr")) as f:
        if f.read().strip() != f"127.0.0.1:{port}":
            fail("metrics.addr does not name the metrics endpoint")

    def training_with_ranks():
        doc_code, doc_out, doc_err = status(run_dir, "--json")
        if doc_code != 0:
            fail(f"troupe status --json exited {doc_code}:\n{doc_out}{doc_err}")
        doc = json.loads(doc_out)
        if doc.get("state") != "training" or len(doc.get("ranks", [])) != 2 or \
                doc.get("step", 0) < 3 or any(r.get("step_s") is None for r in doc["ranks"]):
            return None
        # The text is asked for after the document said the job trains on both ranks (a text
        # taken before could show the first moment of the job, with one rank in the table).
        code, out, err = status(run_dir)
        if code != 0:
            fail(f"troupe status RUN_DIR exited {code}:\n{out}{err}")
        return out, doc

    out, doc = wait_until(training_with_ranks, 120, "status to show 2 training ranks")
    print(out)
    for words in ("troupe status:", "(live", "job         training", "world       2 ranks",
                  "layout", "rank member node host", "last events:"):
        if words not in out:
            fail(f"`troupe status RUN_DIR` lacks {words!r}:\n{out}")
    rows = [line.split() for line in out.splitlines()
            if line.strip() and line.split()[0] in ("0", "1") and len(line.split()) >= 9]
    if sorted(r[0] for r in rows) != ["0", "1"]:
        fail(f"expected one table row for rank 0 and one for rank 1:\n{out}")

    for key in ("format", "state", "generation", "step", "total_steps", "world", "layout",
                "ranks", "events", "tokens_per_s", "loss", "step_breakdown"):
        if key not in doc:
            fail(f"the status document lacks {key!r}: {sorted(doc)}")
    if doc["world"] != 2 or doc["total_steps"] != 100000 or doc["generation"] != 1:
        fail(f"world, total steps or generation wrong: {doc['world']} {doc['total_steps']} "
             f"{doc['generation']}")
    pids = {e["rank"]: e["pid"] for e in job.events() if e.get("event") == "rank_joined"}
    for row in doc["ranks"]:
        for key in ("rank", "member", "node", "host", "pid", "step_s", "heartbeat_age_s",
                    "straggler_score"):
            if key not in row:
                fail(f"rank row lacks {key!r}: {row}")
        if pids.get(row["rank"]) != row["pid"]:
            fail(f"rank {row['rank']}'s pid {row['pid']} is not the one it joined with: {pids}")
        if not 0 <= row["heartbeat_age_s"] < 10:
            fail(f"heartbeat age out of range: {row}")
    # Rank 0 computes 20x slower: once both are judged it scores above the other.
    def slow_rank_scores_high():
        code, doc_out, _ = status(run_dir, "--json")
        d = json.loads(doc_out) if code == 0 else {}
        s = {r["rank"]: r["straggler_score"] for r in d.get("ranks", [])}
        return s.get(0) is not None and s.get(1) is not None and s[0] > 2 * s[1]
    wait_until(slow_rank_scores_high, 60, "rank 0's straggler score to stand out")
    if not doc["events"] or not all("event" in e for e in doc["events"]):
        fail(f"the last events are missing: {doc['events']}")

    # The same document over HTTP, behind the token; /healthz stays open.
    for token in (None, "wrong"):
        code, body = get(port, "/status", token)
        if code != 401 or "state" in body:
            fail(f"GET /status with token {token!r}: expected 401, got {code}: {body[:200]}")
    code, body = get(port, "/status", TOKEN)
    if code != 200 or json.loads(body).get("world") != 2:
        fail(f"GET /status with the token: expected 200 and the document, got {code}")
    if get(port, "/healthz")[0] != 200:
        fail("/healthz should need no token")

    # HOST:PORT needs the token: none, or the wrong one, is exit 2 naming --token-file.
    code, out, err = status(f"127.0.0.1:{port}")
    if code != 2 or "401" not in err or "--token-file" not in err:
        fail(f"no token: expected exit 2 asking for --token-file, got {code}:\n{out}{err}")
    with tempfile.TemporaryDirectory() as tmp:
        wrong = os.path.join(tmp, "wrong.token")
        with open(wrong, "w") as f:
            f.write("not-the-token\n")
        os.chmod(wrong, 0o600)
        code, out, err = status(f"127.0.0.1:{port}", "--token-file", wrong)
        if code != 2 or "401" not in err:
            fail(f"a wrong token: expected exit 2 and 401, got {code}:\n{out}{err}")
        code, out, err = status(run_dir, "--token-file", wrong)
        if code != 2 or "401" not in err:
            fail(f"RUN_DIR with a wrong --token-file: expected exit 2, got {code}:\n{out}{err}")
    code, out, err = status(f"127.0.0.1:{port}", "--token-file", token_file, "--json")
    if code != 0 or json.loads(out).get("state") != "training":
        fail(f"HOST:PORT with the token: expected the document, got {code}:\n{out}{err}")

    # Nothing listens there: exit 2, and bad arguments too.
    code, out, err = status(f"127.0.0.1:{free_port()}")
    if code != 2 or "cannot reach" not in err:
        fail(f"an unreachable target: expected exit 2, got {code}:\n{out}{err}")
    for args in (["--bogus"], [run_dir, run_dir], ["no/such/dir"]):
        code, out, err = status(*args)
        if code != 2:
            fail(f"troupe status {args}: expected exit 2, got {code}:\n{out}{err}")

    # top on a pipe: a frame per interval, and Ctrl-C ends it with 0.
    top = subprocess.Popen([TROUPE, "top", run_dir, "--interval-ms", "200"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2)
        top.send_signal(signal.SIGINT)
        out, err = top.communicate(timeout=20)
    finally:
        if top.poll() is None:
            top.kill()
            top.wait()
    frames = out.count("troupe status: ")
    if top.returncode != 0 or frames < 2 or "\x1b[" in out:
        fail(f"troupe top on a pipe: expected exit 0 and at least 2 plain frames, got exit "
             f"{top.returncode} and {frames} frames:\n{out[-2000:]}{err}")
    print(f"troupe top: {frames} frames in 2 s")


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-status-") as tmp:
        token_file = os.path.join(tmp, "metrics.token")
        with open(token_file, "w") as f:
            f.write(TOKEN + "\n")
        os.chmod(token_file, 0o600)
        port = free_port()
        args = SMALL_MODEL + ["--world", "2", "--steps", "100000", "--checkpoint-every", "0",
                              "--metrics-port", str(port), "--metrics-token", token_file,
                              "--fault", "slow:rank=0:factor=20:from=1"]
        with Job(args) as job:
            check_live(job, port, token_file)
            job.proc.send_signal(signal.SIGINT)
            if job.wait(60) != 130:
                fail(f"Ctrl-C should end the job with 130:\n{job.output()}")

            # Ended: the record in events.jsonl speaks for it.
            code, out, err = status(job.run_dir)
            if code != 0 or "from events.jsonl" not in out or "the job has ended" not in out \
                    or "exit 130" not in out:
                fail(f"after the end: expected a summary from events.jsonl, got {code}:\n"
                     f"{out}{err}")
            code, out, err = status(job.run_dir, "--json")
            doc = json.loads(out)
            if doc.get("source") != "events.jsonl" or doc.get("state") != "failed" or \
                    doc.get("ended", {}).get("exit_code") != 130 or len(doc.get("ranks", [])) != 2:
                fail(f"after the end: the document from events.jsonl is wrong: {doc}")
            print(out[:400])
            top = subprocess.run([TROUPE, "top", job.run_dir, "--interval-ms", "100"],
                                 capture_output=True, text=True, timeout=30)
            if top.returncode != 0 or top.stdout.count("troupe status: ") != 1:
                fail(f"troupe top on an ended job: one frame and exit 0 expected, got "
                     f"{top.returncode}:\n{top.stdout}{top.stderr}")
            job.assert_no_process_left()


if __name__ == "__main__":
    main(test)
