"""The interception CA, its leaves and the sans-IO terminator (issue 25), with real TLS between
in-process OpenSSL endpoints over memory buffers: certificate properties, key file modes, the
per-host memo, Python's strict verification, ALPN, a client that does not trust the CA, and a
second ClientHello after a HelloRetryRequest that names another host."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from gateway.errors import ErrorCode, GatewayError
from gateway.inspect.authority import (
    LEAF_VALIDITY_S,
    CertificateAuthority,
    create_authority,
    load_authority,
    mint_leaf,
    private_directory,
    write_authority,
)
from gateway.inspect.leaves import LeafContexts
from gateway.inspect.terminator import TlsTerminator, check_offered_alpn
from tests.harness.tls_records import CHANGE_CIPHER_SPEC, client_hello, without_key_shares

HOST = "api.example.org"


@pytest.fixture(scope="module")
def authority() -> CertificateAuthority:
    return create_authority()


@pytest.fixture
def leaves(authority: CertificateAuthority, tmp_path: Path) -> LeafContexts:
    return LeafContexts(authority, tmp_path / "leaves", max_hosts=4)


def _client(authority: CertificateAuthority, tmp_path: Path, *, alpn: list[str], trust: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if trust:
        ca = tmp_path / "ca.pem"
        ca.write_bytes(authority.pem)
        context = ssl.create_default_context(cafile=str(ca))
    # What Python 3.13 sets by default: a leaf without an AKI (or with a wrong one) fails here.
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    context.set_alpn_protocols(alpn)
    return context


def _handshake(
    client: ssl.SSLObject, client_in: ssl.MemoryBIO, client_out: ssl.MemoryBIO, server: TlsTerminator
) -> None:
    for _ in range(10):
        try:
            client.do_handshake()
            return
        except ssl.SSLWantReadError:
            pass
        server.feed(client_out.read())
        try:
            server.handshake()
        finally:
            client_in.write(server.outgoing())
    raise AssertionError("the handshake did not finish")


def test_ca_has_the_properties_the_issue_fixes(authority: CertificateAuthority) -> None:
    cert = authority.certificate
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert isinstance(cert.public_key().curve, ec.SECP256R1)  # type: ignore[union-attr]
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value.ca
    assert constraints.value.path_length == 0
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical
    assert usage.value.key_cert_sign
    assert usage.value.crl_sign
    assert not usage.value.digital_signature
    assert cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value == authority.key_identifier


@pytest.mark.parametrize(
    ("host", "san"),
    [(HOST, x509.DNSName(HOST)), ("192.0.2.7", x509.IPAddress(ipaddress.ip_address("192.0.2.7")))],
    ids=["name", "ip-literal"],
)
def test_leaf_properties(authority: CertificateAuthority, host: str, san: x509.GeneralName) -> None:
    leaf = x509.load_pem_x509_certificates(mint_leaf(authority, host).cert_pem)[0]
    assert isinstance(leaf.public_key().curve, ec.SECP256R1)  # type: ignore[union-attr]
    assert list(leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value) == [san]
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    aki = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier == authority.key_identifier.digest
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    now = datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(minutes=59) < now - leaf.not_valid_before_utc < datetime.timedelta(minutes=61)
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc <= datetime.timedelta(seconds=LEAF_VALIDITY_S + 3600)
    assert leaf.not_valid_after_utc - now <= datetime.timedelta(seconds=LEAF_VALIDITY_S)
    assert leaf.not_valid_after_utc <= authority.certificate.not_valid_after_utc


def test_leaf_never_outlives_its_ca() -> None:
    short = create_authority(days=2)
    leaf = x509.load_pem_x509_certificates(mint_leaf(short, HOST).cert_pem)[0]
    assert leaf.not_valid_after_utc == short.certificate.not_valid_after_utc


def test_ca_init_writes_the_key_0600_in_a_0700_directory_and_never_overwrites(tmp_path: Path) -> None:
    cert_path, key_path = tmp_path / "ca.pem", tmp_path / "private" / "ca-key.pem"
    write_authority(create_authority(), cert_path, key_path)
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_path.parent.stat().st_mode) == 0o700
    loaded = load_authority(cert_path, key_path)
    assert loaded.certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    with pytest.raises(GatewayError, match="already exists"):
        write_authority(create_authority(), cert_path, key_path)


def test_a_key_that_does_not_match_the_certificate_is_refused(tmp_path: Path) -> None:
    one, other = tmp_path / "one", tmp_path / "other"
    write_authority(create_authority(), one / "ca.pem", one / "key.pem")
    write_authority(create_authority(), other / "ca.pem", other / "key.pem")
    with pytest.raises(GatewayError, match="does not match"):
        load_authority(one / "ca.pem", other / "key.pem")
    with pytest.raises(GatewayError, match="cannot be loaded"):
        load_authority(one / "missing.pem", one / "key.pem")


def test_a_leaf_directory_another_uid_could_enter_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(GatewayError, match="mode 0700"):
        private_directory(shared)


def test_leaf_files_do_not_outlive_loading_and_contexts_are_memoised(leaves: LeafContexts) -> None:
    first = leaves.context_for(HOST)
    assert leaves.context_for(HOST) is first
    assert os.listdir(leaves.directory) == []  # written 0600, loaded, unlinked at once
    assert stat.S_IMODE(leaves.directory.stat().st_mode) == 0o700
    for index in range(6):
        leaves.context_for(f"h{index}.example.org")
    assert len(leaves) <= 4  # bounded


def test_strict_client_completes_a_handshake_and_speaks_http11(
    authority: CertificateAuthority, leaves: LeafContexts, tmp_path: Path
) -> None:
    context = _client(authority, tmp_path, alpn=["h2", "http/1.1"])
    client_in, client_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(client_in, client_out, server_hostname=HOST)
    server = TlsTerminator(leaves.context_for(HOST), HOST)
    _handshake(client, client_in, client_out, server)
    assert client.selected_alpn_protocol() == "http/1.1"
    client.write(b"GET / HTTP/1.1\r\nHost: api.example.org\r\n\r\n")
    server.feed(client_out.read())
    assert server.read().startswith(b"GET / HTTP/1.1")
    client_in.write(server.write(b"HTTP/1.1 204 No Content\r\n\r\n"))
    assert client.read(100) == b"HTTP/1.1 204 No Content\r\n\r\n"


def test_a_client_that_does_not_trust_the_ca_is_tls_untrusted(
    authority: CertificateAuthority, leaves: LeafContexts, tmp_path: Path
) -> None:
    context = _client(authority, tmp_path, alpn=["http/1.1"], trust=False)
    client_in, client_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(client_in, client_out, server_hostname=HOST)
    server = TlsTerminator(leaves.context_for(HOST), HOST)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(client, client_in, client_out, server)
    server.feed(client_out.read())  # the client's alert
    with pytest.raises(GatewayError) as caught:
        server.handshake()
    assert caught.value.code == ErrorCode.TLS_UNTRUSTED
    assert "SSL_CERT_FILE" in caught.value.message
    assert "NODE_EXTRA_CA_CERTS" in caught.value.message


@pytest.mark.parametrize(
    ("offered", "refused"),
    [(("h2",), True), (("h2", "http/1.1"), False), (None, False), (("grpc-exp", "h2"), True)],
    ids=["h2-only", "h2-and-http11", "no-alpn", "grpc"],
)
def test_h2_only_client_hello_is_inspection_unsupported(offered: tuple[str, ...] | None, refused: bool) -> None:
    if refused:
        with pytest.raises(GatewayError) as caught:
            check_offered_alpn(HOST, offered)
        assert caught.value.code == ErrorCode.INSPECTION_UNSUPPORTED
        assert "HTTP/1.1 only" in caught.value.message
    else:
        check_offered_alpn(HOST, offered)


def test_a_client_hello_naming_another_host_is_host_mismatch(leaves: LeafContexts) -> None:
    server = TlsTerminator(leaves.context_for(HOST), HOST)
    server.feed(client_hello("other.example.org"))
    with pytest.raises(GatewayError) as caught:
        server.handshake()
    assert caught.value.code == ErrorCode.HOST_MISMATCH


@pytest.mark.parametrize(("second", "refused"), [(HOST, False), ("other.example.org", True)], ids=["same", "other"])
def test_second_client_hello_after_hello_retry_must_name_the_same_host(
    leaves: LeafContexts, second: str, refused: bool
) -> None:
    server = TlsTerminator(leaves.context_for(HOST), HOST)
    server.feed(without_key_shares(client_hello(HOST)))
    assert server.handshake() is False
    retry = server.outgoing()
    assert retry[5] == 0x02  # a ServerHello record: the HelloRetryRequest
    server.feed(CHANGE_CIPHER_SPEC + client_hello(second))
    if refused:
        with pytest.raises(GatewayError) as caught:
            server.handshake()
        assert caught.value.code == ErrorCode.HOST_MISMATCH
    else:
        assert server.handshake() is False  # waiting for the client's Finished
        assert server.outgoing()
