"""The metastore trusts nobody by default (issue 14), shown on a real 3-process Raft cluster on loopback that
serves HTTPS with a CA and certificate this test creates: callers without a token or with the wrong role change
nothing, readers are held to their tenants, a pickle sent to a Raft port runs nothing, a client with the wrong CA
is refused, a catastrophic selector neither hangs the query nor the node, and the status page opens over HTTPS in
Chromium through its login form while a cross-site form post from another page changes nothing (issue 27)."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import os
import pickle
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tests.integration.browser import Browser
from tests.unit.metastore.helpers import meta
from tests.waiting import eventually

from shale.dev.metastore import MetastoreCluster, TlsFiles
from shale.errors import AccessDeniedError, MetastoreUnavailableError, QueryTimeoutError, ServiceStartError
from shale.metastore import AddBlocks, MetastoreClient
from shale.metastore.api.client import tls_verify
from shale.metastore.raft import raftwire

TENANTS = ("acme", "beta")


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_ca(directory: Path, name: str) -> tuple[Path, ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    path = directory / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path, key, cert


def _tls_files(directory: Path) -> TlsFiles:
    """A CA of this test and a server certificate it signs for 127.0.0.1 and localhost."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_path, ca_key, ca_cert = _write_ca(directory, "shale-test-ca")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name("shale-metastore")).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    cert_path, key_path = directory / "server.pem", directory / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return TlsFiles(cert_path, key_path, ca_path)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MetastoreCluster, dict[str, str]]]:
    root = tmp_path_factory.mktemp("secured")
    cluster = MetastoreCluster(root / "cluster", 3, tls=_tls_files(root / "tls"),
                               extra=["metastore.query_timeout=1s", "metastore.request_timeout=30s"])
    tokens = {"reader-acme": cluster.issue_token("reader-acme", "reader", tenants=["acme"]),
              "reader-all": cluster.issue_token("reader-all", "reader", tenants=["*"])}
    cluster.start()
    client = cluster.client()
    for tenant in TENANTS:
        assert client.submit(AddBlocks(blocks=[meta(tenant=tenant, start=0)])).ok
    client.close()
    yield cluster, tokens
    cluster.stop()


def _settled_hashes(cluster: MetastoreCluster) -> list[str]:
    """Every node's hash of the index content once the replicas agree (followers apply an entry shortly after the
    leader). The content leaves out the applied index, which a leader election's no-op entry moves: on two
    loaded cores an election can happen while Chromium starts, and it changes nothing a caller could."""
    def agreed() -> list[str]:
        hashes = cluster.state_hashes()
        return cluster.content_hashes() if len(set(hashes)) == 1 and len(hashes) == cluster.size else []

    return eventually(agreed, 60, "the replicas to converge")


def _mutating_calls() -> list[tuple[str, str, bytes]]:
    block = meta(tenant="beta", start=100, end=110)
    return [
        ("POST", "/v1/commands", AddBlocks(blocks=[block]).model_dump_json().encode()),
        ("POST", "/v1/commands", b'{"kind": "CommitIngestBatch", "group": "backup", "ranges": [{"topic": "app", '
                                 b'"partition": 0, "start": 999, "end": 1000}], "blocks": []}'),
        ("POST", "/v1/commands", b'{"kind": "ReplaceBlocks", "tenant": "acme", "sources": ["x"], "blocks": []}'),
        ("POST", "/v1/commands", b'{"kind": "DeleteTombstones", "block_ids": ["x"]}'),
        ("POST", "/v1/commands", b'{"kind": "SetActiveGeneration", "tenant": "acme", "topic": "app", '
                                 b'"generation": 9, "start": 0, "end": 1, "retire": true}'),
        ("POST", "/v1/commands", b'{"kind": "SetCompactionFailureLimit", "limit": 99}'),
        ("POST", "/v1/commands", b'{"kind": "Noop"}'),
        ("POST", "/v1/compaction/poll", b'{"worker": "intruder", "capacity": 256}'),
        ("POST", "/v1/raft/barrier", b""),
        ("GET", "/v1/snapshot", b""),
    ]


def test_callers_without_the_right_token_change_nothing(secured: tuple[MetastoreCluster, dict[str, str]]) -> None:
    cluster, tokens = secured
    before = _settled_hashes(cluster)
    verify = tls_verify(str(cluster.tls.ca)) if cluster.tls else True
    for address in cluster.addresses:  # the leader and both followers
        with httpx.Client(base_url=address, verify=verify, timeout=30,
                          headers={"content-type": "application/json"}) as http:
            for method, path, body in _mutating_calls():
                anonymous = http.request(method, path, content=body)
                assert anonymous.status_code == 401, (address, path, anonymous.text)
                assert anonymous.json()["error"] == "unauthenticated"
                forged = http.request(method, path, content=body, headers={"authorization": "Bearer shale_forged"})
                assert forged.status_code == 401, (address, path, forged.text)
                reader = http.request(method, path, content=body,
                                      headers={"authorization": f"Bearer {tokens['reader-all']}"})
                assert reader.status_code == 403, (address, path, reader.text)
                assert reader.json()["needed"]["role"] in ("admin", "ingest", "compactor", "peer")
    assert _settled_hashes(cluster) == before, "a refused call changed the state"


def test_a_tenant_scoped_reader_gets_403_on_another_tenant(
        secured: tuple[MetastoreCluster, dict[str, str]]) -> None:
    cluster, tokens = secured
    reader = cluster.client(token=tokens["reader-acme"], deadline=10)
    try:
        assert [m.tenant for m in reader.query_blocks(["acme"], 0, 2**62)] == ["acme"]
        assert reader.tenants() == ["acme"]
        with pytest.raises(AccessDeniedError, match="needs role reader for tenant beta") as info:
            reader.query_blocks(["beta"], 0, 2**62)
        assert info.value.status == 403
        with pytest.raises(AccessDeniedError, match="needs role reader for tenants acme, beta"):
            reader.label_names(["acme", "beta"], 0, 2**62)
    finally:
        reader.close()


def _frame(payload: bytes) -> bytes:
    """One pysyncobj frame: a native 4-byte length, then the (here unsealed or sealed) compressed pickle."""
    return struct.pack("i", len(payload)) + payload


class _CreatesFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.path}",))


def test_a_pickle_sent_to_a_raft_port_runs_nothing_and_the_cluster_keeps_serving(
        secured: tuple[MetastoreCluster, dict[str, str]], tmp_path: Path) -> None:
    cluster, _ = secured
    # The payload is live: plain pickle would run it (shown on another path, in this process).
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(_CreatesFile(control), protocol=2))
    assert control.exists()

    marker = tmp_path / "pwned"
    attack = zlib.compress(pickle.dumps(_CreatesFile(marker), protocol=2))
    assert cluster.secret
    frames = [_frame(attack),  # an outsider: no secret
              _frame(raftwire.cluster_encryptor("a-guessed-secret").encrypt(attack)),
              # Even sealed with the real secret (an insider), the unpickler refuses os.system.
              _frame(raftwire.cluster_encryptor(cluster.secret).encrypt(attack))]
    for port in cluster.raft_ports:
        for frame in frames:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(frame)
                sock.settimeout(30)
                try:
                    while sock.recv(4096):  # the node answers nothing and drops the connection
                        pass
                except ConnectionResetError:
                    pass
    assert not marker.exists(), "a pickle from the network ran code in a metastore node"
    client = cluster.client()
    try:
        before = client.status()["applied_index"]
        assert client.submit(AddBlocks(blocks=[meta(tenant="acme", start=500, end=510)])).ok
        assert client.status()["applied_index"] > before
        _settled_hashes(cluster)
    finally:
        client.close()
    assert all(p is not None and p.alive() for p in cluster.processes)


def test_https_clients_verify_the_nodes_against_the_configured_ca(
        secured: tuple[MetastoreCluster, dict[str, str]], tmp_path: Path) -> None:
    cluster, tokens = secured
    assert all(a.startswith("https://") for a in cluster.addresses)
    good = cluster.client(token=tokens["reader-all"])
    try:
        assert good.status()["leader_http"].startswith("https://")
        # A follower's linearizable read asks the leader for a read index: a peer call over HTTPS too.
        leader = cluster.wait_leader()
        follower = MetastoreClient([cluster.addresses[(leader + 1) % 3]], token=tokens["reader-all"],
                                   ca_file=str(cluster.tls.ca) if cluster.tls else "")
        assert follower.query_blocks(["acme"], 0, 2**62)
        follower.close()
    finally:
        good.close()
    wrong_ca, _, _ = _write_ca(tmp_path, "someone-elses-ca")
    for ca in (str(wrong_ca), ""):  # another CA, and the system's CAs: neither vouches for this certificate
        stranger = MetastoreClient(cluster.addresses, token=cluster.admin_token, ca_file=ca, deadline=2)
        with pytest.raises(MetastoreUnavailableError, match="CERTIFICATE_VERIFY_FAILED"):
            stranger.status()
        stranger.close()
    with pytest.raises(httpx.HTTPError):
        httpx.get(cluster.addresses[0].replace("https://", "http://") + "/healthz", timeout=5)


def test_a_catastrophic_selector_cannot_pin_the_metastore(secured: tuple[MetastoreCluster, dict[str, str]]) -> None:
    cluster, _ = secured
    client = cluster.client(deadline=120)
    value = "a" * 1_000_000  # RE2 matches (a+)+$ in linear time; a backtracking engine would never finish
    for i in range(16):
        assert client.submit(AddBlocks(blocks=[meta(tenant="regex", start=i * 10, end=i * 10 + 10,
                                                    labels=[{"message": value}, {"message": value + "b"}])])).ok
    outcome: dict[str, object] = {}

    def query() -> None:
        started = time.monotonic()
        try:
            outcome["blocks"] = len(client.query_blocks(["regex"], 0, 2**62, '{message=~"(a+)+$"}'))
        except QueryTimeoutError as exc:
            outcome["error"] = str(exc)
        outcome["seconds"] = time.monotonic() - started

    status_client = cluster.client(deadline=30)
    worker = threading.Thread(target=query)
    worker.start()
    latencies, during = [], []
    while worker.is_alive():
        started = time.monotonic()
        status = status_client.status()
        latencies.append(time.monotonic() - started)
        during.append(worker.is_alive())
        assert status["role"] in ("leader", "follower")
    worker.join()
    status_client.close()
    client.close()
    print(f"selector query: {outcome}; status calls during it: {len(latencies)}, slowest "
          f"{max(latencies, default=0):.3f}s")
    assert "blocks" in outcome or "metastore.query_timeout" in str(outcome.get("error"))
    assert any(during), "no status call was answered while the query ran"


def test_a_multi_node_metastore_without_a_secret_refuses_to_start(tmp_path: Path) -> None:
    cluster = MetastoreCluster(tmp_path, 3, secret="")
    with pytest.raises(ServiceStartError) as info:
        cluster.start()
    cluster.stop()
    assert "metastore.secret is required for a multi-node metastore" in str(info.value)


def _spki_pin(cert: Path) -> str:
    """The base64 SHA-256 of a certificate's public key: Chromium trusts the test's server certificate by it."""
    key = x509.load_pem_x509_certificate(cert.read_bytes()).public_key()
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    digest = hashes.Hash(hashes.SHA256())
    digest.update(der)
    return base64.b64encode(digest.finalize()).decode()


def test_the_status_page_over_https_in_chromium_and_a_cross_site_post_changes_nothing(
        secured: tuple[MetastoreCluster, dict[str, str]], tmp_path: Path) -> None:
    cluster, tokens = secured
    assert cluster.tls is not None
    address = cluster.addresses[0]
    assert address.startswith("https://")
    before = _settled_hashes(cluster)
    with Browser(tmp_path / "chrome", f"--ignore-certificate-errors-spki-list={_spki_pin(cluster.tls.cert)}") as chrome:
        # A page of another site posts a JSON body as text/plain (a form needs no preflight) to the API.
        attack = (f'<form id="f" method="post" enctype="text/plain" action="{address}/v1/commands">'
                  '<input name=\'{"kind": "SetCompactionFailureLimit", "limit": 99, "x": "\' value=\'"}\'></form>'
                  "<script>document.getElementById('f').submit()</script>")
        chrome.call("Page.navigate", url="data:text/html," + attack)
        chrome.wait_for("/v1/commands")
        refused = chrome.evaluate("document.body.innerText")
        assert "cross_site" in refused or "unsupported_media_type" in refused, refused
        assert _settled_hashes(cluster) == before, "the cross-site post changed the state"
        # The operator logs in with the form; the session cookie is all the browser keeps.
        chrome.log_in(address, tokens["reader-all"])
        dom = chrome.dom()
        assert "<h1>Shale status</h1>" in dom
        assert all(f'<td class="l">{tenant}</td>' in dom for tenant in TENANTS)
        chrome.screenshot(tmp_path / "status.png")
        assert (tmp_path / "status.png").stat().st_size > 10_000
        session = [c for c in chrome.cookies() if c["name"] == "shale_session"]
        assert len(session) == 1
        assert session[0]["httpOnly"] is True
        assert session[0]["secure"] is True
        assert session[0]["sameSite"] == "Strict"
        assert tokens["reader-all"] not in session[0]["value"]
        # Even logged in, the cookie opens no API call a page could make.
        chrome.call("Page.navigate", url=address + "/v1/tenants")
        chrome.wait_for("/v1/tenants")
        assert "unauthenticated" in chrome.evaluate("document.body.innerText")
