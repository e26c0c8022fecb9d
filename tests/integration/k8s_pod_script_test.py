"""The pod script of deploy/k8s/troupe-job.yaml, run as two "pods" on this machine (no
Kubernetes: the example is not tested against a cluster here). Each pod gets what the manifest
gives it (JOB_COMPLETION_INDEX, TROUPE_COORDINATOR, TROUPE_RUN_DIR, TROUPE_NODES, TROUPE_WORLD,
TROUPE_OPTIONS), with the coordinator on loopback instead of troupe-0.troupe. Pod 1 starts
first and waits for the join token; the job trains on both pods' agents. Then SIGTERM to pod 0
(what the kubelet sends when a pod is deleted) stops the job with a checkpoint and exit 75;
pod 1 does not complete but waits, and when pod 0 is replaced (as the Job's podFailurePolicy
does on 75) its agent rejoins and the job resumes and finishes."""

import os
import signal
import subprocess
import tempfile

from harness import SMALL_MODEL, TROUPE, fail, free_port, main, read_events, wait_until

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MANIFEST = os.path.join(REPO, "deploy", "k8s", "troupe-job.yaml")
STEPS = 400


def pod_script():
    """The `args: - |` block of the Job's container, as the kubelet hands it to bash -c."""
    lines = open(MANIFEST).read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- |")
    indent = len(lines[start + 1]) - len(lines[start + 1].lstrip())
    body = []
    for line in lines[start + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break
        body.append(line[indent:])
    return "\n".join(body) + "\n"


class Pods:
    def __init__(self, tmp):
        self.tmp = tmp
        self.bin = os.path.join(tmp, "bin")
        os.makedirs(self.bin, exist_ok=True)
        if not os.path.exists(os.path.join(self.bin, "troupe")):
            os.symlink(TROUPE, os.path.join(self.bin, "troupe"))
        self.port = free_port()
        self.run_dir = os.path.join(tmp, "runs", "troupe-uid")
        self.script = pod_script()
        self.procs = {}

    def start(self, index):
        env = {**os.environ, "PATH": self.bin + ":" + os.environ.get("PATH", "/usr/bin:/bin"),
               "JOB_COMPLETION_INDEX": str(index), "TROUPE_NODES": "2", "TROUPE_WORLD": "4",
               "TROUPE_RUN_DIR": self.run_dir, "TROUPE_PORT": str(self.port),
               "TROUPE_COORDINATOR": f"127.0.0.1:{self.port}",
               "TROUPE_OPTIONS": " ".join(SMALL_MODEL + ["--steps", str(STEPS),
                                                         "--checkpoint-every", "100",
                                                         "--metrics-port", "0"])}
        log = open(os.path.join(self.tmp, f"pod{index}.log"), "a")
        self.procs[index] = subprocess.Popen(["/bin/bash", "-c", self.script], env=env,
                                             stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True)

    def log(self, index):
        with open(os.path.join(self.tmp, f"pod{index}.log")) as f:
            return f.read()

    def wait(self, index, timeout):
        try:
            return self.procs[index].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            fail(f"pod {index} did not end within {timeout}s:\n{self.log(index)}")

    def kill_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-k8s-pod-") as tmp:
        pods = Pods(tmp)
        try:
            pods.start(1)              # its agent waits for pod 0's join token

            def steps():
                return [e["step"] for e in read_events(pods.run_dir) if e.get("event") == "step"]
            pods.start(0)
            wait_until(lambda: len(steps()) >= 20 or pods.procs[0].poll() is not None, 120,
                       "step 20")
            pods.procs[0].send_signal(signal.SIGTERM)   # bash, the pod's first process
            code0 = pods.wait(0, 120)
            if code0 != 75:
                fail(f"SIGTERM to pod 0: expected exit 75, got {code0}:\n--- pod 0\n"
                     f"{pods.log(0)}\n--- pod 1\n{pods.log(1)}")
            if pods.procs[1].poll() is not None:
                fail(f"pod 1 ended with the job it was told to stop (exit "
                     f"{pods.procs[1].returncode}); it must wait for pod 0's next attempt:\n"
                     f"{pods.log(1)}")
            stopped = max(steps())
            # Kubernetes replaces pod 0 (podFailurePolicy: Ignore on 75); pod 1's agent rejoins.
            pods.start(0)
            code0, code1 = pods.wait(0, 240), pods.wait(1, 120)
            if code0 != 0 or code1 != 0:
                fail(f"after pod 0 was replaced: exits {code0}, {code1}:\n--- pod 0\n"
                     f"{pods.log(0)}\n--- pod 1\n{pods.log(1)}")
            if "JOB_COMPLETION_INDEX 1" not in pods.log(1):
                fail(f"pod 1's agent does not name its index:\n{pods.log(1)}")
            events = read_events(pods.run_dir)
            starts = [(e.get("resume"), e.get("start_step")) for e in events
                      if e.get("event") == "job_start"]
            agents = {e.get("node") for e in events if e.get("event") == "agent_joined"}
            if starts != [(False, 0), (True, stopped)] or sorted(set(steps())) != \
                    list(range(1, STEPS + 1)) or agents != {0, 1}:
                fail(f"job starts {starts} (stopped at {stopped}), agents {agents}, steps "
                     f"{len(set(steps()))}")
            print(f"pod 0 stopped by SIGTERM at step {stopped} (exit 75), pod 1 waited; the "
                  f"replaced pod 0 resumed and both trained to step {STEPS}", flush=True)
        finally:
            pods.kill_all()


if __name__ == "__main__":
    main(test)
