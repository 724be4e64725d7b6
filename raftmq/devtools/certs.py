"""A local certificate authority and the certificates it signs, made with ``cryptography``:
what ``raftmq dev --secure`` and the tests need to run TLS on this machine without an
operator's PKI.

Keys are ECDSA P-256 (fast to make, and every TLS stack here takes them). A certificate
names its hosts as subject alternative names (IP addresses as IP entries, as clients
check them), and is good for both server and client authentication, so that a broker's
one certificate serves its listeners and its dials to its peers. The tests also make the
certificates a client must refuse: expired, self-signed, for another host.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOCAL_HOSTS = ("127.0.0.1", "localhost")
VALID_DAYS = 365


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as PEM files (``ca`` for a CA's own)."""

    cert_file: Path
    key_file: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "raftmq local"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _san(hosts: tuple[str, ...]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _write(
    folder: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> Issued:
    """Write the pair as STEM.pem and STEM-key.pem (the key readable by its owner only).
    Each file is replaced in one rename, so a reader never sees half of one."""
    folder.mkdir(parents=True, exist_ok=True)
    out = Issued(folder / f"{stem}.pem", folder / f"{stem}-key.pem")
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    for path, data, mode in (
        (out.key_file, key_pem, 0o600),
        (out.cert_file, cert.public_bytes(serialization.Encoding.PEM), 0o644),
    ):
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.chmod(mode)
        tmp.replace(path)
    return out


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    start: datetime.datetime,
    end: datetime.datetime,
) -> x509.CertificateBuilder:
    """The fields every certificate here has: names, public key, serial and validity."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
    )


def make_ca(folder: Path, *, stem: str = "ca", common_name: str = "raftmq local CA") -> Issued:
    """A self-signed CA certificate and key under ``folder``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = _name(common_name)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=VALID_DAYS * 10)
    cert = (
        _builder(name, name, key, start, end)
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
    return _write(folder, stem, cert, key)


def issue(
    ca: Issued | None,
    folder: Path,
    stem: str,
    *,
    common_name: str | None = None,
    hosts: tuple[str, ...] = LOCAL_HOSTS,
    valid_days: float = VALID_DAYS,
    expired: bool = False,
) -> Issued:
    """A certificate for ``hosts`` signed by ``ca`` (None: self-signed), good for server
    and client authentication, written as STEM.pem and STEM-key.pem under ``folder``.
    ``expired``: its validity ended yesterday (what a client must refuse)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    if expired:
        start, end = now - datetime.timedelta(days=30), now - datetime.timedelta(days=1)
    else:
        start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=valid_days)
    subject = _name(common_name or stem)
    if ca is None:
        issuer_name, signer = subject, key
    else:
        ca_cert = x509.load_pem_x509_certificate(ca.cert_file.read_bytes())
        loaded = serialization.load_pem_private_key(ca.key_file.read_bytes(), password=None)
        assert isinstance(loaded, ec.EllipticCurvePrivateKey), "make_ca makes EC keys"
        issuer_name, signer = ca_cert.subject, loaded
    cert = (
        _builder(subject, issuer_name, key, start, end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_san(hosts), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(signer, hashes.SHA256())
    )
    return _write(folder, stem, cert, key)


def principal(issued: Issued) -> str:
    """The principal a broker sees for a client presenting this certificate over mutual
    TLS: ``User:`` and its subject's common name (what a broker without authentication
    logs, and what ``raftmq dev --secure``'s mapping rule makes of it:
    raftmq.devtools.dev_credentials.CN_RULE)."""
    cert = x509.load_pem_x509_certificate(issued.cert_file.read_bytes())
    (name,) = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return f"User:{name.value!s}"


@dataclass(frozen=True)
class LocalPki:
    """What ``raftmq dev --secure`` makes: a CA, one certificate every broker presents
    (to clients and to its peers), and one for clients."""

    ca: Issued
    broker: Issued
    client: Issued


def local_pki(folder: Path) -> LocalPki:
    """The CA and certificates under ``folder``, made once: a restart of the cluster
    reuses them (clients configured for it keep working)."""
    ca = Issued(folder / "ca.pem", folder / "ca-key.pem")
    broker = Issued(folder / "broker.pem", folder / "broker-key.pem")
    client = Issued(folder / "client.pem", folder / "client-key.pem")
    made = (ca, broker, client)
    if all(p.cert_file.exists() and p.key_file.exists() for p in made):
        return LocalPki(*made)
    ca = make_ca(folder)
    return LocalPki(
        ca,
        issue(ca, folder, "broker", common_name="raftmq broker"),
        issue(ca, folder, "client", common_name="raftmq client"),
    )
