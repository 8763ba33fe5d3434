"""RELIABILITY 14 — TLS and token auth, tested both ways.

A fleet of no-op pools runs with mutual TLS (a throwaway CA made here with ``cryptography``)
and a bearer token on every service. With the right CA, client certificate and token a request
succeeds; every RPC but health — on the scheduler, on a pool, and the pool-to-pool transfer
method — refuses a call without the token or with a wrong one (UNAUTHENTICATED); plaintext,
a client that trusts another CA, and a client certificate from another CA are all refused at
the handshake. Token auth without TLS is checked on an in-process server; the other fleets in
this suite run with both off (the default).
"""
from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fastvideo3.client import FleetClient, make_channel
from fastvideo3.errors import Unauthenticated
from fastvideo3.v1 import pool_pb2, pool_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from tests.fleet_fixture import running
from tests.reliability.helpers import BUDGETS, SMALL

TOKEN = "s3cret-token-for-tests"

from cryptography import x509  # noqa: E402  (a dev dependency)


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec
    return ec.generate_private_key(ec.SECP256R1())


def _pem(obj) -> bytes:
    from cryptography.hazmat.primitives import serialization
    if hasattr(obj, "private_bytes"):
        return obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())
    return obj.public_bytes(serialization.Encoding.PEM)


def _cert(subject: str, key, issuer_name, issuer_key, *, ca: bool):
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .issuer_name(issuer_name or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                         x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                            critical=False)
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                            critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _pki(tmp: Path, name: str) -> dict[str, Path]:
    ca_key = _key()
    ca = _cert(f"{name} test CA", ca_key, None, ca_key, ca=True)
    key = _key()
    cert = _cert(f"{name} service", key, ca.subject, ca_key, ca=False)
    out = {"ca": tmp / f"{name}-ca.pem", "cert": tmp / f"{name}.pem", "key": tmp / f"{name}.key"}
    out["ca"].write_bytes(_pem(ca))
    out["cert"].write_bytes(_pem(cert))
    out["key"].write_bytes(_pem(key))
    return out


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pki")
    token = tmp / "token"
    token.write_text(TOKEN + "\n")
    return {"good": _pki(tmp, "good"), "evil": _pki(tmp, "evil"), "token": token}


@pytest.fixture(scope="module")
def fleet(pki, tmp_path_factory):
    from fleet.launcher import LocalFleet
    from services.common.auth import Security
    g = pki["good"]
    sec = Security(str(g["cert"]), str(g["key"]), str(g["ca"]), str(pki["token"]))
    f = LocalFleet("wan-tiny-seeded", fake=True, roles=("encoder", "denoiser", "decoder"), security=sec,
                   scheduler_args=BUDGETS, log_dir=tmp_path_factory.mktemp("tls-fleet-logs"))
    with running(f, timeout_s=240):
        yield f


def _creds(pki, trust="good", client="good", token: str | None = TOKEN) -> dict:
    return dict(root_certificates=pki[trust]["ca"].read_bytes(), private_key=pki[client]["key"].read_bytes(),
                certificate_chain=pki[client]["cert"].read_bytes(), token=token)


def _code(fn, *args, **kw) -> str:
    try:
        fn(*args, **kw)
    except grpc.RpcError as err:
        return err.code().name
    return "OK"


@pytest.mark.timeout(120)
def test_authenticated_mutual_tls_client_gets_its_video(fleet, pki):
    with FleetClient(fleet.target, **_creds(pki)) as c:
        video = c.generate("over TLS", output_format="npy", num_inference_steps=2, **SMALL)
    assert video.frames.shape == (1, 2, 2, 3)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_every_rpc_but_health_refuses_a_missing_or_wrong_token(fleet, pki, token):
    with FleetClient(fleet.target, **_creds(pki, token=token)) as c:
        with pytest.raises(Unauthenticated) as e:
            c.generate("no token", output_format="npy", num_inference_steps=2, **SMALL)
        assert e.value.field == "authorization"
        for call in (lambda: c.describe(), lambda: c.get("x"), lambda: c.cancel("x")):
            with pytest.raises(Unauthenticated):
                call()
    pool = fleet.pools["denoiser"][0].target
    for target in (fleet.target, pool):
        ch = make_channel(target, **_creds(pki, token=token))
        try:
            status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            assert status.status == health_pb2.HealthCheckResponse.SERVING  # probes need no token
            if target == pool:
                stub = pool_pb2_grpc.RolePoolStub(ch)
                for method, msg in ((stub.Execute, pool_pb2.ExecuteRequest()),
                                    (stub.Describe, pool_pb2.DescribePoolRequest()),
                                    (stub.Release, pool_pb2.ReleaseRequest(request_id="x")),
                                    (stub.Snapshot, pool_pb2.SnapshotRequest(request_id="x")),
                                    (stub.Restore, pool_pb2.StateSnapshot(request_id="x"))):
                    assert _code(method, msg, timeout=10) == "UNAUTHENTICATED", method
                fetch = ch.unary_stream("/fastvideo3.v1.TensorTransfer/Fetch", request_serializer=None,
                                        response_deserializer=None)
                assert _code(lambda: list(fetch(b"owner\nbuffer", timeout=10))) == "UNAUTHENTICATED"
            else:
                stub = scheduler_pb2_grpc.SchedulerStub(ch)
                assert _code(stub.Describe, scheduler_pb2.DescribeSchedulerRequest(), timeout=10) == "UNAUTHENTICATED"
        finally:
            ch.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["plaintext", "trusts another CA", "certificate from another CA"])
def test_tls_refuses_plaintext_and_the_wrong_ca(fleet, pki, how):
    pool = fleet.pools["encoder"][0].target
    for target in (fleet.target, pool):
        if how == "plaintext":
            ch = make_channel(target, token=TOKEN)
        elif how == "trusts another CA":
            ch = make_channel(target, **_creds(pki, trust="evil", client="good"))
        else:
            ch = make_channel(target, **_creds(pki, trust="good", client="evil"))
        try:
            code = _code(health_pb2_grpc.HealthStub(ch).Check, health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert code == "UNAVAILABLE", (how, target, code)  # not even health: the handshake fails
            code = _code(pool_pb2_grpc.RolePoolStub(ch).Describe, pool_pb2.DescribePoolRequest(), timeout=5)
            assert code == "UNAVAILABLE", (how, target, code)
        finally:
            ch.close()


@pytest.mark.timeout(60)
def test_token_auth_without_tls_and_both_off_by_default(tmp_path):
    from services.common.auth import Security
    from services.common.server import ServiceHost
    token = tmp_path / "token"
    token.write_text(TOKEN)
    for security, expect_without in ((Security(auth_token_file=str(token)), "UNAUTHENTICATED"), (None, "OK")):
        host = ServiceHost(["fastvideo3.v1.RolePool"], "127.0.0.1", 0, security=security)

        class Pool(pool_pb2_grpc.RolePoolServicer):
            def Describe(self, request, context):  # noqa: N802
                return pool_pb2.PoolDescription(role="probe")

        pool_pb2_grpc.add_RolePoolServicer_to_server(Pool(), host.server)
        port = host.start()
        host.set_serving(True)
        try:
            target = f"127.0.0.1:{port}"
            for tok, want in ((None, expect_without), ("wrong", expect_without), (TOKEN, "OK")):
                ch = make_channel(target, token=tok)
                try:
                    assert _code(pool_pb2_grpc.RolePoolStub(ch).Describe, pool_pb2.DescribePoolRequest(),
                                 timeout=5) == want, (security, tok)
                    assert _code(health_pb2_grpc.HealthStub(ch).Check, health_pb2.HealthCheckRequest(service=""),
                                 timeout=5) == "OK"
                finally:
                    ch.close()
        finally:
            host.request_stop()
            host.wait_and_drain(1.0)
