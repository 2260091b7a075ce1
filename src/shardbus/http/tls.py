"""TLS material for the HTTPS side of the listener: a local CA and a server certificate, or the user's own.

On first start ``ensure_certificates`` creates, under ``<data-dir>/tls/``:

    ca.pem          the local CA certificate: what clients trust (``connection_verify=<ca.pem>``)
    ca-key.pem      its private key (mode 0600)
    server.pem      the server certificate, signed by the CA, for localhost, 127.0.0.1, ::1 and the host names
                    the broker is configured with
    server-key.pem  its private key (mode 0600)
    server.json     the server certificate's host names and expiry, so that a restart need not parse it

Later starts reuse the CA, and the server certificate too while it still covers every host name and is not about
to expire; otherwise a new one is signed by the same CA, so clients that trust ``ca.pem`` keep working. The
``cryptography`` package is imported only when something must be created or checked (it costs start-up time).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
CA_VALIDITY = datetime.timedelta(days=3650)
SERVER_VALIDITY = datetime.timedelta(days=825)
RENEW_BEFORE = datetime.timedelta(days=30)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Where the server's certificate chain and key are; ``ca`` is None when the user brought their own."""

    cert: Path
    key: Path
    ca: Path | None = None

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        context.set_alpn_protocols(["http/1.1"])
        return context


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write_private(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` atomically with ``mode`` set before any byte is written."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _san(hosts: list[str]) -> list[x509.GeneralName]:
    from cryptography import x509

    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _create_ca(tls_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shardbus local CA")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(tls_dir / "ca-key.pem", _key_pem(key), 0o600)
    _write_private(tls_dir / "ca.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert, key


def _load_ca(tls_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    cert_path, key_path = tls_dir / "ca.pem", tls_dir / "ca-key.pem"
    if not (cert_path.exists() and key_path.exists()):
        return None
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or cert.not_valid_after_utc < _now() + RENEW_BEFORE:
        return None
    return cert, key


def _server_cert_fits(cert_path: Path, ca: x509.Certificate, hosts: list[str]) -> bool:
    if not cert_path.exists() or not cert_path.with_name("server-key.pem").exists():
        return False
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        cert.verify_directly_issued_by(ca)
        covered = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except (ValueError, TypeError, x509.ExtensionNotFound, x509.InvalidSignature):
        return False
    return set(_san(hosts)) <= covered and cert.not_valid_after_utc > _now() + RENEW_BEFORE


def _create_server_cert(
    tls_dir: Path, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, hosts: list[str]
) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(min(now + SERVER_VALIDITY, ca.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName(_san(hosts)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_private(tls_dir / "server-key.pem", _key_pem(key), 0o600)
    _write_private(tls_dir / "server.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644)
    stamp = {"hosts": hosts, "not_after": cert.not_valid_after_utc.timestamp()}
    _write_private(tls_dir / "server.json", json.dumps(stamp).encode(), 0o644)


def _stamp_fits(tls_dir: Path, hosts: list[str]) -> bool:
    """Do the files of an earlier start cover ``hosts`` for long enough (no parsing of certificates)?"""
    names = ("ca.pem", "ca-key.pem", "server.pem", "server-key.pem")
    if not all((tls_dir / name).exists() for name in names):
        return False
    try:
        stamp = json.loads((tls_dir / "server.json").read_text())
        return set(hosts) <= set(stamp["hosts"]) and stamp["not_after"] > (_now() + RENEW_BEFORE).timestamp()
    except (OSError, ValueError, KeyError, TypeError):
        return False


def ensure_certificates(data_dir: Path | str, hosts: list[str] | tuple[str, ...] = ()) -> TlsFiles:
    """The local CA and a server certificate for localhost, 127.0.0.1, ::1 and ``hosts``: created on first use,
    reused afterwards (see the module docstring)."""
    tls_dir = Path(data_dir) / "tls"
    tls_dir.mkdir(parents=True, exist_ok=True)
    wanted = list(dict.fromkeys([*DEFAULT_HOSTS, *(h for h in hosts if h and h not in ("0.0.0.0", "::"))]))
    cert_path = tls_dir / "server.pem"
    if _stamp_fits(tls_dir, wanted):
        return TlsFiles(cert=cert_path, key=tls_dir / "server-key.pem", ca=tls_dir / "ca.pem")
    loaded = _load_ca(tls_dir)
    ca, ca_key = loaded if loaded is not None else _create_ca(tls_dir)
    if loaded is None or not _server_cert_fits(cert_path, ca, wanted):
        _create_server_cert(tls_dir, ca, ca_key, wanted)
    return TlsFiles(cert=cert_path, key=tls_dir / "server-key.pem", ca=tls_dir / "ca.pem")


def own_certificate(cert: Path | str, key: Path | str) -> TlsFiles:
    """The user's certificate chain and key (checked now, so a bad pair stops the broker at start)."""
    files = TlsFiles(cert=Path(cert), key=Path(key))
    try:
        files.server_context()
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot use the TLS certificate {cert} with key {key}: {exc}") from exc
    return files
