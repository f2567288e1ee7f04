"""Real etcd members for Python tests (tests/support/etcd.h's twin): 1 or 3
members on 127.0.0.1 at random ports below the ephemeral range, each with
its data and log in a temp dir; started again elsewhere when a port is
taken; killed with the object."""
import os
import random
import shutil
import subprocess
import tempfile
import time
import urllib.request


class EtcdCluster:
    def __init__(self, members=3):
        etcd = os.environ.get("TIDE_ETCD") or shutil.which("etcd")
        if not etcd:
            raise RuntimeError("no etcd in PATH; install etcd-server (scripts/setup.sh)")
        for _ in range(8):
            self.dir = tempfile.mkdtemp(prefix="tide_etcd_")
            ports = random.sample(range(20000, 32000), 2 * members)
            self.clients = ports[0::2]
            peers = ports[1::2]
            cluster = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, p in enumerate(peers))
            token = f"tide-test-{random.getrandbits(32)}"
            self.procs = []
            for i in range(members):
                client, peer = f"http://127.0.0.1:{self.clients[i]}", f"http://127.0.0.1:{peers[i]}"
                out = open(os.path.join(self.dir, f"m{i}.out"), "w")
                self.procs.append(subprocess.Popen(
                    [etcd, f"--name=m{i}", f"--data-dir={self.dir}/m{i}.data",
                     f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
                     f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                     f"--initial-cluster={cluster}", f"--initial-cluster-token={token}",
                     "--initial-cluster-state=new", "--logger=zap",
                     f"--log-outputs={self.dir}/m{i}.log", "--pre-vote",
                     "--heartbeat-interval=100", "--election-timeout=1000"],
                    stdout=out, stderr=out))
                out.close()
            if self._healthy():
                return
            self.stop()
        raise RuntimeError("EtcdCluster: no free ports after 8 attempts")

    def _healthy(self):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                logs = "".join(open(os.path.join(self.dir, f)).read()
                               for f in os.listdir(self.dir) if f.endswith((".log", ".out")))
                if "address already in use" in logs:
                    return False
                raise RuntimeError("EtcdCluster: a member exited at start:\n" + logs[-3000:])
            try:
                if all(b'"health":"true"' in urllib.request.urlopen(
                        f"http://127.0.0.1:{c}/health", timeout=1).read() for c in self.clients):
                    return True
            except OSError:
                pass
            time.sleep(0.02)  # polling an external process's readiness
        raise RuntimeError("EtcdCluster: members not healthy within 30 s")

    def endpoints(self):
        return ",".join(f"127.0.0.1:{c}" for c in self.clients)

    def kill(self, i):
        if self.procs[i].poll() is None:
            self.procs[i].kill()
            self.procs[i].wait()

    def stop(self):
        for i in range(len(self.procs)):
            self.kill(i)
        shutil.rmtree(self.dir, ignore_errors=True)
