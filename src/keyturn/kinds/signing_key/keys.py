"""A signing key pair: made with `cryptography`, kept as one secret JSON value (the private key
as PKCS #8 PEM, its `kid` and `alg`), and its public half as a JWK (RFC 7517) whose `kid` is
its RFC 7638 thumbprint, so the same key always has the same id.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from keyturn.config.credentials import DEFAULT_RSA_BITS, RSA_ALGORITHMS
from keyturn.errors import KeyturnError
from keyturn.secret import Secret

# The weakest RSA key keyturn makes or accepts (RFC 7518 §3.3: 2048 bits or larger).
MIN_RSA_BITS = 2048

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


class KeyRefused(KeyturnError):
    """A key keyturn will not use: the wrong type for the algorithm, or too weak."""


@dataclass(frozen=True, slots=True)
class SigningKey:
    """One key pair. Its text forms never hold the private key (`secret()` does, as a
    `Secret`)."""

    kid: str
    alg: str
    private: PrivateKey

    def __repr__(self) -> str:
        return f"SigningKey(kid={self.kid!r}, alg={self.alg!r})"

    def public_jwk(self) -> dict[str, str]:
        """The public key as a JWK with `kid`, `alg` and `use`."""
        return {**_public_members(self.private), "kid": self.kid, "alg": self.alg, "use": "sig"}

    def private_pem(self) -> Secret:
        pem = self.private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return Secret(pem.decode())

    def secret(self) -> Secret:
        """What keyturn's private state keeps: `{"kid", "alg", "pem"}` as JSON."""
        value = {"kid": self.kid, "alg": self.alg, "pem": self.private_pem().reveal()}
        return Secret(json.dumps(value, sort_keys=True))


def generate(alg: str, rsa_bits: int | None = None) -> SigningKey:
    """A new key pair for `alg` (RS256/PS256: RSA of `rsa_bits`, ES256: P-256, EdDSA: Ed25519)."""
    private: PrivateKey
    if alg in RSA_ALGORITHMS:
        private = rsa.generate_private_key(65537, rsa_bits or DEFAULT_RSA_BITS)
    elif alg == "ES256":
        private = ec.generate_private_key(ec.SECP256R1())
    elif alg == "EdDSA":
        private = ed25519.Ed25519PrivateKey.generate()
    else:
        raise KeyRefused(f"algorithm {alg!r} is not one keyturn signs with")
    return from_private(private, alg)


def from_private(private: PrivateKey, alg: str, *, credential: str | None = None) -> SigningKey:
    """A key pair for `alg`, refused (`KeyRefused`, naming the field `key`) if it does not fit
    `alg` or is too weak."""
    problem = strength_problem(private, alg)
    if problem is not None:
        raise KeyRefused(f"key: {problem}", credential=credential)
    return SigningKey(thumbprint(_public_members(private)), alg, private)


def strength_problem(private: object, alg: str) -> str | None:
    """Why `private` cannot sign `alg` (None if it can)."""
    if alg in RSA_ALGORITHMS:
        if not isinstance(private, rsa.RSAPrivateKey):
            return f"is not an RSA key; {alg} needs one"
        if private.key_size < MIN_RSA_BITS:
            return f"is an RSA key of {private.key_size} bits; expected at least {MIN_RSA_BITS}"
        return None
    if alg == "ES256":
        if not isinstance(private, ec.EllipticCurvePrivateKey) or not isinstance(
            private.curve, ec.SECP256R1
        ):
            return "is not an EC key on P-256; ES256 needs one"
        return None
    if alg == "EdDSA":
        if not isinstance(private, ed25519.Ed25519PrivateKey):
            return "is not an Ed25519 key; EdDSA (as keyturn signs it) needs one"
        return None
    return f"algorithm {alg!r} is not one keyturn signs with"


def load(value: Secret, *, credential: str) -> SigningKey:
    """A key pair from keyturn's private state (`SigningKey.secret`)."""
    try:
        stored = json.loads(value.reveal())
        pem = stored["pem"].encode()
        alg = stored["alg"]
        private = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, KeyError, TypeError, AttributeError):
        # No detail: the text could quote the key.
        raise KeyRefused(
            "the signing key in the private state is not readable", credential=credential
        ) from None
    if not isinstance(
        private, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
    ):
        raise KeyRefused(
            "the signing key in the private state is of an unknown type", credential=credential
        )
    return from_private(private, alg, credential=credential)


def load_pem(pem: Secret, alg: str, *, credential: str) -> SigningKey:
    """A key pair handed over as PKCS #8 (or traditional) PEM, for `alg`."""
    try:
        private = serialization.load_pem_private_key(pem.reveal().encode(), password=None)
    except (ValueError, TypeError):
        raise KeyRefused("key: not an unencrypted PEM private key", credential=credential) from None
    if not isinstance(
        private, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
    ):
        raise KeyRefused(f"key: of a type {alg} cannot use", credential=credential)
    return from_private(private, alg, credential=credential)


def thumbprint(members: dict[str, str]) -> str:
    """RFC 7638: SHA-256 over the required members, sorted, without spaces; base64url."""
    required = {
        "RSA": ("e", "kty", "n"),
        "EC": ("crv", "kty", "x", "y"),
        "OKP": ("crv", "kty", "x"),
    }
    canonical = {name: members[name] for name in required[members["kty"]]}
    digest = hashlib.sha256(json.dumps(canonical, separators=(",", ":"), sort_keys=True).encode())
    return _b64(digest.digest())


def _public_members(private: PrivateKey) -> dict[str, str]:
    if isinstance(private, rsa.RSAPrivateKey):
        numbers = private.public_key().public_numbers()
        return {"kty": "RSA", "n": _b64_int(numbers.n), "e": _b64_int(numbers.e)}
    if isinstance(private, ec.EllipticCurvePrivateKey):
        point = private.public_key().public_numbers()
        size = (private.curve.key_size + 7) // 8
        return {
            "kty": "EC",
            "crv": "P-256",
            "x": _b64(point.x.to_bytes(size, "big")),
            "y": _b64(point.y.to_bytes(size, "big")),
        }
    raw = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return {"kty": "OKP", "crv": "Ed25519", "x": _b64(raw)}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64_int(value: int) -> str:
    return _b64(value.to_bytes((value.bit_length() + 7) // 8, "big"))
