"""Certificates for TLS tests against servers on 127.0.0.1: a local certificate authority and
what it signs, and a self-signed certificate, each written to files as servers load them."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Certificates:
    ca: str
    """The local authority's certificate (a client that trusts it: :meth:`trusting_ca`)."""
    localhost: tuple[str, str]
    """(certificate, key) for 127.0.0.1, signed by the authority."""
    wrong_host: tuple[str, str]
    """(certificate, key) for ``elsewhere.example``, signed by the authority."""
    self_signed: tuple[str, str]
    """(certificate, key) for 127.0.0.1, signed by itself."""

    def trusting_ca(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca)

    @staticmethod
    def server(pair: tuple[str, str]) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*pair)
        return context


def make_certificates(folder: Path) -> Certificates:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("local test authority")
    ca = _builder(ca_name, ca_name, ca_key).add_extension(
        x509.BasicConstraints(ca=True, path_length=0), critical=True
    )
    ca_cert = ca.sign(ca_key, hashes.SHA256())
    localhost = _leaf(folder, "localhost", ca_cert, ca_key, x509.IPAddress(_LOCAL))
    wrong = _leaf(folder, "wrong", ca_cert, ca_key, x509.DNSName("elsewhere.example"))
    self_signed = _leaf(folder, "self", None, None, x509.IPAddress(_LOCAL))
    ca_path = folder / "ca.pem"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    return Certificates(str(ca_path), localhost, wrong, self_signed)


_LOCAL = ipaddress.ip_address("127.0.0.1")


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey):
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
    )


def _leaf(
    folder: Path,
    stem: str,
    ca: x509.Certificate | None,
    ca_key: ec.EllipticCurvePrivateKey | None,
    alt_name: x509.GeneralName,
) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _name(stem)
    builder = _builder(subject, ca.subject if ca is not None else subject, key)
    builder = builder.add_extension(x509.SubjectAlternativeName([alt_name]), critical=False)
    if ca is None:  # self-signed: its own authority
        builder = builder.add_extension(
            x509.BasicConstraints(ca=True, path_length=None), critical=True
        )
    cert = builder.sign(ca_key or key, hashes.SHA256())
    cert_path, key_path = folder / f"{stem}.pem", folder / f"{stem}-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path)
