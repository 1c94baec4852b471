"""controlplane.api over TCP with mutual TLS: a client needs a certificate from the configured
CA; no certificate, another CA's, or no TLS at all is refused, and edgectl gets in with one.
Real server, client, certificates (openssl) and sockets on 127.0.0.1; the daemon is
apistage.py's stand-in.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2

from controlplane.api import server
from controlplane.api.client import Client, Tls
from controlplane.config import ApiTls, Node
from controlplane.errors import ConfigError, NotRunning
from controlplane.tests.apistage import CALL_TIMEOUT_S, FakeDaemon, Served, edgectl, serving

# ---------------------------------------------------------------- mutual TLS over TCP


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=20)


def _make_ca(d: Path, name: str) -> None:
    _openssl(
        "req",
        "-x509",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-subj",
        f"/CN=edge test {name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=d,
    )


def _make_cert(d: Path, name: str, ca: str, ext: str, serial: int) -> None:
    (d / f"{name}.ext").write_text(ext)
    _openssl(
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN=edge test {name}",
        cwd=d,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.pem",
        "-CAkey",
        f"{ca}.key",
        "-set_serial",
        str(serial),
        "-days",
        "2",
        "-out",
        f"{name}.pem",
        "-extfile",
        f"{name}.ext",
        cwd=d,
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """ca signs server and client; other-ca signs stranger."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    d = tmp_path_factory.mktemp("pki")
    _make_ca(d, "ca")
    _make_ca(d, "other-ca")
    _make_cert(d, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n", 2)
    _make_cert(d, "client", "ca", "extendedKeyUsage=clientAuth\n", 3)
    _make_cert(d, "stranger", "other-ca", "extendedKeyUsage=clientAuth\n", 4)
    return d


@pytest.fixture
def tls_edged(lt, pki, sockdir) -> Iterator[tuple[Served, str]]:
    tls = ApiTls(cert=str(pki / "server.pem"), key=str(pki / "server.key"), client_ca=str(pki / "ca.pem"))
    node = Node(api_socket=os.path.join(sockdir, "edged.sock"), api_listen="127.0.0.1:0", api_tls=tls)
    with serving(lt, node, unix=False) as served:
        yield served, f"127.0.0.1:{served.handle.tcp_port}"


def _health_over(channel: grpc.Channel) -> grpc.StatusCode:
    from grpc_health.v1 import health_pb2_grpc

    try:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT_S)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()
    finally:
        channel.close()


def test_tcp_client_with_a_certificate_from_the_ca_gets_in(tls_edged, pki):
    served, target = tls_edged
    with Client(
        api=target,
        tls=Tls(str(pki / "client.pem"), str(pki / "client.key"), str(pki / "ca.pem")),
        timeout_s=CALL_TIMEOUT_S,
    ) as c:
        assert c.health() == "SERVING"
        c.drain("chat", "b1")
        assert c.status()["iface"] == "eth-test"
    assert ("drain", "chat", "b1") in served.daemon.calls


def test_tcp_client_without_a_certificate_is_refused(tls_edged, pki):
    _, target = tls_edged
    creds = grpc.ssl_channel_credentials(root_certificates=(pki / "ca.pem").read_bytes())
    assert _health_over(grpc.secure_channel(target, creds)) == grpc.StatusCode.UNAVAILABLE


def test_tcp_client_with_a_certificate_from_another_ca_is_refused(tls_edged, pki):
    served, target = tls_edged
    with (
        Client(
            api=target,
            tls=Tls(str(pki / "stranger.pem"), str(pki / "stranger.key"), str(pki / "ca.pem")),
            timeout_s=CALL_TIMEOUT_S,
        ) as c,
        pytest.raises(NotRunning, match=f"^cannot reach edged at {target}: "),
    ):
        c.drain("chat", "b1")
    assert served.daemon.calls == []


def test_tcp_client_without_tls_is_refused(tls_edged):
    _, target = tls_edged
    assert _health_over(grpc.insecure_channel(target)) == grpc.StatusCode.UNAVAILABLE


def test_tcp_without_tls_is_refused_by_the_server_too(lt, sockdir):
    node = Node(api_socket=os.path.join(sockdir, "edged.sock"), api_listen="127.0.0.1:0")
    with pytest.raises(ConfigError, match=r"^node.api_listen: TCP is served only with mutual TLS; set node.api_tls$"):
        lt.run(server.start(FakeDaemon(), node))


def test_unreadable_tls_file_names_its_key(lt, pki, sockdir):
    tls = ApiTls(cert=str(pki / "server.pem"), key=str(pki / "missing.key"), client_ca=str(pki / "ca.pem"))
    node = Node(api_socket=os.path.join(sockdir, "edged.sock"), api_listen="127.0.0.1:0", api_tls=tls)
    with pytest.raises(ConfigError, match=r"^node.api_tls.key: cannot read .*missing.key: No such file or directory$"):
        lt.run(server.start(FakeDaemon(), node))


def test_edgectl_over_tcp_with_mutual_tls(tls_edged, pki):
    served, target = tls_edged
    out = edgectl(
        "weight",
        "chat",
        "b0",
        "7",
        "--api",
        target,
        "--cert",
        str(pki / "client.pem"),
        "--key",
        str(pki / "client.key"),
        "--ca",
        str(pki / "ca.pem"),
    )
    assert (out.returncode, out.stdout, out.stderr) == (
        0,
        "chat/b0: weight pinned at 7 (233% of the best backend's 3)\n",
        "",
    )
    assert served.daemon.calls == [("snapshot", False), ("set_override", "chat", "b0", 7)]  # the scale, then the pin
    out = edgectl("drain", "chat", "b0", "--api", target, "--cert", str(pki / "client.pem"))
    assert (out.returncode, out.stderr) == (
        2,
        "edgectl: --api needs --key, --ca (edged serves TCP with mutual TLS only)\n",
    )
