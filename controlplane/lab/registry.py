"""Real discovery daemons for tests and benchmarks: dnsmasq and etcd, each started inside one
namespace of a Net (listening on that namespace's loopback only) and stopped by its pid.

Dnsmasq serves A records from a hosts file (rewritten + SIGHUP to change them), SRV records
and host records from its config (rewritten + restart), and REFUSED for a name it has no
server for. Etcd keeps its data in a temporary directory, so a restart resumes the same
revision history; keys are written over etcd's JSON gateway from inside the namespace.
"""

from __future__ import annotations

import base64
import http.client
import json
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Sequence

from controlplane.lab.procs import stop_process
from controlplane.lab.topo import Ns


def _wait_port(
    ns: Ns, port: int, proc: subprocess.Popen, udp: bool, timeout_s: float, what: str, host: str = "127.0.0.1"
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with ns.enter():
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if udp else socket.SOCK_STREAM)
        try:
            if udp:  # a bind that fails means dnsmasq holds the port
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    return
            else:
                s.settimeout(0.2)
                if s.connect_ex((host, port)) == 0:
                    return
        finally:
            s.close()
        time.sleep(0.05)  # poll interval while the daemon starts
    raise TimeoutError(f"{what} did not listen on {host}:{port} within {timeout_s} s")


class Dnsmasq:
    """dnsmasq on 127.0.0.1:port of ns, answering for names under `domain` from files in workdir."""

    def __init__(self, ns: Ns, workdir: Path, port: int = 53, ttl_s: int = 1):
        self.ns, self.workdir, self.port, self.ttl_s = ns, workdir, port, ttl_s
        self.hosts = workdir / "hosts"
        self.conf = workdir / "dnsmasq.conf"
        self.proc: Optional[subprocess.Popen] = None
        self.hosts.write_text("")
        self.set_records()

    def set_hosts(self, entries: Sequence[tuple[str, str]], reload: bool = True) -> None:
        """A records: (address, name) lines; SIGHUP makes dnsmasq re-read them."""
        self.hosts.write_text("".join(f"{a} {n}\n" for a, n in entries))
        if reload and self.proc is not None:
            self.proc.send_signal(signal.SIGHUP)

    def set_records(
        self,
        srv: Sequence[tuple[str, str, int, int, int]] = (),
        host_records: Sequence[tuple[str, str]] = (),
        refused: Sequence[str] = (),
    ) -> None:
        """SRV (name, target, port, priority, weight), host records (name, address), and domains
        answered REFUSED; takes effect at the next start()."""
        # user=root: it reads the hosts file again on SIGHUP, and tests keep it in a private directory
        lines = [
            f"port={self.port}",
            "user=root",
            "listen-address=127.0.0.1",
            "bind-interfaces",
            "no-resolv",
            "no-hosts",
            f"addn-hosts={self.hosts}",
            f"local-ttl={self.ttl_s}",
            f"auth-ttl={self.ttl_s}",
        ]
        lines += [f"srv-host={n},{t},{p},{prio},{w}" for n, t, p, prio, w in srv]
        lines += [f"host-record={n},{a}" for n, a in host_records]
        lines += [f"server=/{d}/#" for d in refused]
        self.conf.write_text("\n".join(lines) + "\n")

    def start(self, timeout_s: float = 5.0) -> "Dnsmasq":
        self.proc = self.ns.popen(
            ["dnsmasq", "--keep-in-foreground", f"--conf-file={self.conf}", "--pid-file=", "--log-facility=-"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_port(self.ns, self.port, self.proc, True, timeout_s, "dnsmasq")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


class Etcd:
    """etcd on host:client_port of ns (loopback unless host names another address of ns; the
    peer port beside it on loopback), data in workdir/data."""

    def __init__(self, ns: Ns, workdir: Path, client_port: int = 2379, peer_port: int = 2380, host: str = "127.0.0.1"):
        self.ns, self.workdir, self.host = ns, workdir, host
        self.client_port, self.peer_port = client_port, peer_port
        self.proc: Optional[subprocess.Popen] = None
        self.log = workdir / "etcd.log"
        self.token = ""  # with auth on: root's, for put and delete

    def start(self, timeout_s: float = 20.0) -> "Etcd":
        c, p = f"http://{self.host}:{self.client_port}", f"http://127.0.0.1:{self.peer_port}"
        argv = [
            "etcd",
            "--name",
            "edge-test",
            "--data-dir",
            str(self.workdir / "data"),
            "--listen-client-urls",
            c,
            "--advertise-client-urls",
            c,
            "--listen-peer-urls",
            p,
            "--initial-advertise-peer-urls",
            p,
            "--initial-cluster",
            f"edge-test={p}",
        ]
        with open(self.log, "ab") as log:
            self.proc = self.ns.popen(argv, stdout=log, stderr=subprocess.STDOUT)
        _wait_port(self.ns, self.client_port, self.proc, False, timeout_s, "etcd", self.host)
        self._call("/v3/kv/range", {"key": _b64("/")}, timeout_s)  # serving, not only listening
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout_s=10.0)
            self.proc = None

    def _call(self, path: str, body: dict, timeout_s: float = 5.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            with self.ns.enter():
                conn = http.client.HTTPConnection(self.host, self.client_port, timeout=2.0)
                try:
                    conn.connect()
                except OSError:
                    conn.close()
                    conn = None
            if conn is not None:
                headers = {"Content-Type": "application/json"}
                if self.token:
                    headers["Authorization"] = self.token
                try:
                    conn.request("POST", path, json.dumps(body), headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    if resp.status == 200:
                        return json.loads(data)
                finally:
                    conn.close()
            if time.monotonic() > deadline:
                raise TimeoutError(f"etcd {path} failed")
            time.sleep(0.1)  # etcd still electing itself leader

    def grant(self, user: str, password: str, perms: Sequence[tuple[str, str, bool]]) -> None:
        """A user with a role of its own (named after it) holding perms: (permission READ, WRITE
        or READWRITE, key, whether key is a prefix)."""
        self._call("/v3/auth/role/add", {"name": user})
        for perm, key, prefix in perms:
            grant = {"permType": perm, "key": _b64(key)}
            if prefix:
                grant["range_end"] = _b64(key[:-1] + chr(ord(key[-1]) + 1))
            self._call("/v3/auth/role/grant", {"name": user, "perm": grant})
        self._call("/v3/auth/user/add", {"name": user, "password": password})
        self._call("/v3/auth/user/grant", {"user": user, "role": user})

    def enable_auth(self, root_password: str) -> None:
        """Turns etcd's auth on (root with the root role first, as etcd requires); put and delete
        then act as root."""
        self._call("/v3/auth/user/add", {"name": "root", "password": root_password})
        self._call("/v3/auth/user/grant", {"user": "root", "role": "root"})
        self._call("/v3/auth/enable", {})
        self.token = self._call("/v3/auth/authenticate", {"name": "root", "password": root_password})["token"]

    def put(self, key: str, value: str | bytes | dict) -> None:
        if isinstance(value, dict):
            value = json.dumps(value)
        self._call("/v3/kv/put", {"key": _b64(key), "value": _b64(value)})

    def delete(self, key: str) -> None:
        self._call("/v3/kv/deleterange", {"key": _b64(key)})

    def delete_prefix(self, prefix: str) -> None:
        """Every key under prefix, in one revision."""
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        self._call("/v3/kv/deleterange", {"key": _b64(prefix), "range_end": _b64(end)})


class Loopback:
    """The test process's own namespace, for a daemon on its loopback that code in the test
    process talks to directly (an Etcd(Loopback(), ..., free_port(), free_port())): the rules
    allow loopback peers, and gRPC's threads cannot be moved into another namespace."""

    name = role = "loopback"

    def popen(self, argv: Sequence[str], **kw) -> subprocess.Popen:
        kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.Popen(list(map(str, argv)), **kw)

    @contextmanager
    def enter(self) -> Iterator["Loopback"]:
        yield self


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()
