"""Throwaway client keys and certificates for the tests of keyless client authentication.

    pem = private_key_pem("ES256")                       # PKCS#8 PEM, as keyturn reads one
    cert = self_signed_certificate(pem, days=2)          # for self_signed_tls_client_auth
    jwks = public_jwks(pem)                              # what a client registers
    account = service_account_json(pem, "sa@x.iam...", "https://.../token")

Never use them for anything but a test.
"""

from __future__ import annotations

import base64
import datetime
import json
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID

from keyturn.providers.assertions import Algorithm, load_signing_key
from keyturn.secret import Secret

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


def generate(alg: Algorithm | str, *, rsa_bits: int = 2048) -> PrivateKey:
    if alg in ("RS256", "PS256", "RSA"):
        return rsa.generate_private_key(public_exponent=65537, key_size=rsa_bits)
    if alg in ("ES256", "EC"):
        return ec.generate_private_key(ec.SECP256R1())
    if alg == "P-384":
        return ec.generate_private_key(ec.SECP384R1())
    return ed25519.Ed25519PrivateKey.generate()


def pem_of(key: PrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def private_key_pem(alg: Algorithm | str, *, rsa_bits: int = 2048) -> str:
    """A new key for `alg` ("RS256", "PS256", "ES256", "EdDSA"; "P-384" for a wrong curve)."""
    return pem_of(generate(alg, rsa_bits=rsa_bits))


def self_signed_certificate(
    key_pem: str,
    *,
    days: float = 2,
    starts_in: float = -60,
    common_name: str = "keyturn test client",
) -> str:
    """A self-signed certificate of `key_pem`'s key, valid from now + `starts_in` seconds for
    `days` days (a negative total makes an expired one)."""
    key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    now = datetime.datetime.now(datetime.UTC)
    start = now + datetime.timedelta(seconds=starts_in)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=days))
    )
    digest = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    cert = builder.sign(key, digest)  # type: ignore[arg-type]
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def ca_signed_certificate(
    key_pem: str, ca_cert: Path, ca_key: Path, *, common_name: str, days: float = 2
) -> str:
    """A client certificate for `key_pem`'s key, signed by a CA (tls_client_auth, RFC 8705
    §2.1), with `common_name` as its subject."""
    key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    issuer = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    signer = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(issuer.subject)
        .public_key(key.public_key())  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(signer, hashes.SHA256())  # type: ignore[arg-type]
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def public_jwks(*keys: tuple[str, Algorithm], certificate: str | None = None) -> dict[str, Any]:
    """A JWKS of the public halves of `keys` ((pem, alg) pairs), as a client registers it;
    with a `certificate`, its `x5c` and `x5t#S256` on every key (self_signed_tls_client_auth)."""
    entries = []
    for pem, alg in keys:
        key = load_signing_key("test", Secret(pem), alg=alg, certificate=certificate)
        jwk = key.public_jwk()
        if certificate is not None:
            der = x509.load_pem_x509_certificate(certificate.encode()).public_bytes(
                serialization.Encoding.DER
            )
            jwk["x5c"] = [base64.b64encode(der).decode()]
        entries.append(jwk)
    return {"keys": entries}


def service_account_json(key_pem: str, client_email: str, token_uri: str) -> str:
    """A key file in Google's service-account format."""
    return json.dumps(
        {
            "type": "service_account",
            "project_id": "keyturn-test",
            "private_key_id": "0123456789abcdef",
            "private_key": key_pem,
            "client_email": client_email,
            "client_id": "100000000000000000001",
            "token_uri": token_uri,
        }
    )
