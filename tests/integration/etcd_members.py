"""etcd clusters for the end-to-end tests: real /usr/bin/etcd members on free loopback ports,
each stopped by its pid; a member can be killed and started again on its data."""

import os
import signal
import subprocess

from harness import fail, free_port, wait_until

ETCD = "/usr/bin/etcd"
ETCDCTL = "/usr/bin/etcdctl"


def _ports(count):
    ports = []
    while len(ports) < count:
        p = free_port()
        if p not in ports:
            ports.append(p)
    return ports


class EtcdCluster:
    """`size` members named m0.., under `root`; `tls` (a dict of PEM paths) serves https with
    client certificates. `url` is the first member's client URL, `urls` all of them."""

    def __init__(self, root, size=1, tls=None):
        self.root, self.tls = root, tls
        os.makedirs(root, exist_ok=True)
        scheme = "https" if tls else "http"
        ports = _ports(2 * size)
        self.client_urls = [f"{scheme}://127.0.0.1:{ports[2 * i]}" for i in range(size)]
        self.peer_urls = [f"http://127.0.0.1:{ports[2 * i + 1]}" for i in range(size)]
        self.cluster = ",".join(f"m{i}={p}" for i, p in enumerate(self.peer_urls))
        self.procs = [None] * size
        self.logs = [None] * size
        for i in range(size):
            self.start_member(i)
        wait_until(lambda: self.get("/probe") is not None, 30,
                   f"etcd at {self.url} to answer")

    @property
    def url(self):
        return self.client_urls[0]

    @property
    def urls(self):
        return ",".join(self.client_urls)

    @property
    def proc(self):
        return self.procs[0]

    def start_member(self, i):
        """Starts member i (again, on its data directory if it ran before)."""
        name = f"m{i}"
        cmd = [ETCD, "--name", name, "--data-dir", os.path.join(self.root, f"etcd-{name}"),
               "--listen-client-urls", self.client_urls[i],
               "--advertise-client-urls", self.client_urls[i],
               "--listen-peer-urls", self.peer_urls[i],
               "--initial-advertise-peer-urls", self.peer_urls[i],
               "--initial-cluster", self.cluster, "--initial-cluster-token", "troupe-test"]
        if self.tls:
            cmd += ["--cert-file", self.tls["server.crt"], "--key-file", self.tls["server.key"],
                    "--client-cert-auth", "--trusted-ca-file", self.tls["ca.crt"]]
        if self.logs[i] is None:
            self.logs[i] = open(os.path.join(self.root, f"etcd-{name}.log"), "a")
        self.procs[i] = subprocess.Popen(cmd, stdout=self.logs[i], stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def kill_member(self, i):
        p = self.procs[i]
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(timeout=10)

    def ctl(self, *args, endpoints=None):
        cmd = [ETCDCTL, "--endpoints", endpoints or self.urls, "--command-timeout", "5s"]
        if self.tls:
            cmd += ["--cacert", self.tls["ca.crt"], "--cert", self.tls["client.crt"],
                    "--key", self.tls["client.key"]]
        env = dict(os.environ, ETCDCTL_API="3")
        return subprocess.run(cmd + list(args), capture_output=True, text=True, env=env,
                              timeout=20)

    def get(self, key):
        """The key's value ("" when absent); None when etcd does not answer."""
        if all(p is None or p.poll() is not None for p in self.procs):
            fail(f"every etcd member exited; see the logs under {self.root}")
        p = self.ctl("get", "--print-value-only", key)
        return p.stdout.strip() if p.returncode == 0 else None

    def stop(self):
        for i, p in enumerate(self.procs):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
        for log in self.logs:
            if log is not None:
                log.close()
