"""A signing key's key pairs: made with `cryptography`, checked and used as
`keyturn.providers.assertions.SigningKey` (whose `kid` is the RFC 7638 thumbprint, so one key
always has one id), and kept in keyturn's private state as one secret JSON value: the private
key as PKCS #8 PEM, its `kid` and `alg`.
"""

from __future__ import annotations

import json

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from keyturn.config.credentials import DEFAULT_RSA_BITS, RSA_ALGORITHMS
from keyturn.errors import KeyMaterialError
from keyturn.providers.assertions import Algorithm, SigningKey, load_signing_key
from keyturn.secret import Secret

__all__ = ["SigningKey", "generate", "load", "stored"]


def generate(credential: str, alg: Algorithm, rsa_bits: int | None = None) -> SigningKey:
    """A new key pair for `alg` (RS256/PS256: RSA of `rsa_bits`, ES256: P-256, EdDSA:
    Ed25519)."""
    private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
    if alg in RSA_ALGORITHMS:
        private = rsa.generate_private_key(65537, rsa_bits or DEFAULT_RSA_BITS)
    elif alg == "ES256":
        private = ec.generate_private_key(ec.SECP256R1())
    else:
        private = ed25519.Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return load_signing_key(credential, Secret(pem.decode()), alg=alg)


def stored(key: SigningKey) -> Secret:
    """What keyturn's private state keeps of `key`: `{"alg", "kid", "pem"}` as JSON."""
    value = {"kid": key.kid, "alg": key.alg, "pem": key.pem.reveal()}
    return Secret(json.dumps(value, sort_keys=True))


def load(value: Secret, *, credential: str) -> SigningKey:
    """A key pair from keyturn's private state (`stored`), checked again."""
    try:
        kept = json.loads(value.reveal())
        pem, alg, kid = kept["pem"], kept["alg"], kept["kid"]
    except (ValueError, KeyError, TypeError):
        # No detail: a decoder's text could quote the key.
        raise KeyMaterialError(
            "is not a signing key as keyturn stores it", field="key", credential=credential
        ) from None
    return load_signing_key(credential, Secret(pem), alg=alg, kid=kid, field="key")
