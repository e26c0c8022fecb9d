"""`troupe run --metrics-token FILE` (README "Security"): GET /metrics without the file's token,
or with another one, is refused with 401 and counted in
troupe_rejected_connections_total{listener="metrics"}; with it the job's series are served;
/healthz needs no token. A token file others may read is refused before anything starts."""

import os
import re
import signal
import tempfile
import urllib.error
import urllib.request

from harness import SMALL_MODEL, Job, fail, free_port, main, run_to_end, wait_until

TOKEN = "s3cret-scrape-token"


def get(port, path, token=None):
    """(status, body) of GET http://127.0.0.1:port/path."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-token-") as tmp:
        token_file = os.path.join(tmp, "metrics.token")
        with open(token_file, "w") as f:
            f.write(TOKEN + "\n")
        os.chmod(token_file, 0o644)
        code, _, out = run_to_end(SMALL_MODEL + ["--steps", "2", "--metrics-port", str(free_port()),
                                                 "--metrics-token", token_file], timeout=60)
        if code != 2 or "chmod 600" not in out:
            fail(f"a token file others can read should be refused with exit 2, got {code}:\n{out}")
        os.chmod(token_file, 0o600)

        port = free_port()
        args = SMALL_MODEL + ["--world", "2", "--steps", "100000", "--checkpoint-every", "0",
                              "--metrics-port", str(port), "--metrics-token", token_file]
        with Job(args) as job:
            wait_until(lambda: any(e.get("event") == "step" for e in job.events())
                       or job.proc.poll() is not None, 120, "the first step")
            for token in (None, "wrong-token", TOKEN + "x"):
                status, body = get(port, "/metrics", token)
                if status != 401 or "troupe_" in body:
                    fail(f"GET /metrics with token {token!r}: expected 401 and no series, got "
                         f"{status}:\n{body[:300]}")
            status, body = get(port, "/healthz")
            if status != 200 or body != "ok":
                fail(f"GET /healthz without a token: expected 200 ok, got {status} {body!r}")
            status, body = get(port, "/metrics", TOKEN)
            if status != 200 or "troupe_steps_total" not in body:
                fail(f"GET /metrics with the token: expected 200 and the job's series, got "
                     f"{status}:\n{body[:300]}")
            refused = re.search(r'^troupe_rejected_connections_total\{listener="metrics"\} (\S+)$',
                                body, re.M)
            if not refused or float(refused.group(1)) < 3:
                fail(f"the 3 refused scrapes are not counted: {refused and refused.group(0)}")
            print(f"no token, a wrong one, a longer one: 401; the token: 200; "
                  f"{refused.group(0)}")
            job.proc.send_signal(signal.SIGINT)
            if job.wait(60) != 130:
                fail(f"Ctrl-C should end the job with 130:\n{job.output()}")


if __name__ == "__main__":
    main(test)
