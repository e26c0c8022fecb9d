"""Workers and agents that lose the coordinator (kill -9) exit with a clear error instead of
hanging, and leave no process behind."""

import os
import re
import signal
import subprocess
import tempfile

from harness import SMALL_MODEL, TROUPE, Job, fail, main, wait_until


def test():
    args = SMALL_MODEL + ["--world", "2", "--steps", "100000", "--metrics-port", "0", "--checkpoint-every", "0"]
    with Job(args, command="coordinator") as coord:
        addr = wait_until(lambda: re.search(r"listening on (\S+);", coord.output()), 60, "the coordinator's address")
        endpoint = addr.group(1)
        with tempfile.TemporaryFile() as agent_log:
            agent = subprocess.Popen([TROUPE, "agent", "--coordinator", endpoint, "--join-token",
                                      os.path.join(coord.run_dir, "join.token")], stdout=agent_log,
                                     stderr=subprocess.STDOUT)
            coord.extra_pids.append(agent.pid)
            try:
                wait_until(lambda: any(e.get("event") == "step" for e in coord.events()), 120, "the first step")
                pids = coord.all_pids()
                os.kill(coord.proc.pid, signal.SIGKILL)
                code = agent.wait(timeout=60)
                agent_log.seek(0)
                text = agent_log.read().decode()
                if code == 0:
                    fail(f"the agent should fail after losing the coordinator, exited 0:\n{text}")
                if "lost the coordinator" not in text:
                    fail(f"no clear error about the lost coordinator:\n{text}")
                coord.assert_no_process_left()
                print(f"agent exited {code}; processes {pids} all gone")
            finally:
                if agent.poll() is None:
                    agent.kill()
                    agent.wait()


if __name__ == "__main__":
    main(test)
