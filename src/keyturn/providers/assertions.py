"""Signed JWTs that stand in for a client secret (RFC 7523).

A `SigningKey` is a private key (PEM, held as a `Secret`) checked once against its algorithm;
`client_assertion` makes the `private_key_jwt` client authentication of one token request
(RFC 7523 §2.2, OpenID Connect Core §9) and `bearer_assertion` the JWT bearer grant's
assertion (§2.1, Google-style service accounts). PyJWT signs (docs/providers.md says why);
nothing here quotes key material in an error.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, get_args

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from keyturn.errors import KeyMaterialError
from keyturn.secret import Secret

Algorithm = Literal["RS256", "PS256", "ES256", "EdDSA"]
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)
MIN_RSA_BITS = 2048
# RFC 7523 §3 leaves the lifetime to the server; a minute is what Keycloak, Okta and Entra
# accept and keeps a captured assertion short-lived.
CLIENT_ASSERTION_LIFETIME = 60.0
# Google refuses a bearer assertion that lives more than an hour.
BEARER_ASSERTION_LIFETIME = 3600.0
CLIENT_ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
JWT_BEARER_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"

PrivateKey = (
    rsa.RSAPrivateKey
    | ec.EllipticCurvePrivateKey
    | ed25519.Ed25519PrivateKey
    | ed448.Ed448PrivateKey
)
_EXPECTED = {
    "RS256": f"an RSA key of at least {MIN_RSA_BITS} bits",
    "PS256": f"an RSA key of at least {MIN_RSA_BITS} bits",
    "ES256": "an EC key on P-256",
    "EdDSA": "an Ed25519 or Ed448 key",
}


@dataclass(frozen=True, slots=True, repr=False)
class SigningKey:
    """A private key that signs as `alg`, published under `kid`; `x5t_s256` is the SHA-256
    thumbprint of its certificate (RFC 7515 `x5t#S256`), for servers that identify a
    certificate credential (Entra ID)."""

    pem: Secret
    alg: Algorithm
    kid: str
    x5t_s256: str | None = None
    _key: PrivateKey = field(default=None, compare=False)  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SigningKey(alg={self.alg!r}, kid={self.kid!r})"

    def public_jwk(self) -> dict[str, Any]:
        """The public half as a JWK (RFC 7517) with `kid`, `alg` and `use`, for a JWKS."""
        jwk = _public_jwk(self._key.public_key())
        jwk.update(kid=self.kid, alg=self.alg, use="sig")
        if self.x5t_s256 is not None:
            jwk["x5t#S256"] = self.x5t_s256
        return jwk

    def sign(self, claims: dict[str, Any]) -> Secret:
        headers: dict[str, Any] = {"kid": self.kid, "typ": "JWT"}
        if self.x5t_s256 is not None:
            headers["x5t#S256"] = self.x5t_s256
        return Secret(jwt.encode(claims, self._key, algorithm=self.alg, headers=headers))


def load_signing_key(
    credential: str,
    pem: Secret,
    *,
    alg: Algorithm | None,
    kid: str | None = None,
    certificate: str | None = None,
    now: float | None = None,
    field: str = "private_key",
    certificate_field: str = "certificate",
) -> SigningKey:
    """Parse and check `pem` for `alg` (its type, an RSA key's size); with a `certificate`
    (PEM), check that it holds this key's public half and is valid at `now`. `kid` defaults to
    the key's RFC 7638 JWK thumbprint; `alg` None: RS256, ES256 or EdDSA as the key's type
    says. Errors name `credential` and the field."""
    key = _private_key(credential, pem, field)
    if alg is None:
        alg = _default_alg(key)
    problem = _mismatch(key, alg)
    if problem is not None:
        raise KeyMaterialError(
            f"{problem}; expected {_EXPECTED[alg]} for alg {alg}",
            field=field,
            credential=credential,
        )
    thumbprint = None
    if certificate is not None:
        cert = load_certificate(credential, certificate, now=now, field=certificate_field)
        if _spki(cert.public_key()) != _spki(key.public_key()):
            raise KeyMaterialError(
                f"is not the certificate of {field}; expected the certificate of the same key",
                field=certificate_field,
                credential=credential,
            )
        thumbprint = certificate_thumbprint(cert)
    if kid is None:
        kid = jwk_thumbprint(_public_jwk(key.public_key()))
    return SigningKey(pem, alg, kid, thumbprint, key)


def load_certificate(
    credential: str, pem: str, *, now: float | None, field: str = "certificate"
) -> x509.Certificate:
    """The first certificate of `pem`, refused when unparseable, or (with `now`) expired or not
    yet valid."""
    try:
        cert = x509.load_pem_x509_certificates(pem.encode())[0]
    except (ValueError, IndexError, UnicodeError):
        raise KeyMaterialError(
            'is not a PEM certificate; expected one or more "-----BEGIN CERTIFICATE-----" blocks',
            field=field,
            credential=credential,
        ) from None
    if now is not None:
        moment = datetime.fromtimestamp(now, tz=UTC)
        if moment >= cert.not_valid_after_utc:
            when = cert.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")
            raise KeyMaterialError(
                f"expired at {when}; expected a certificate valid now",
                field=field,
                credential=credential,
            )
        if moment < cert.not_valid_before_utc:
            when = cert.not_valid_before_utc.strftime("%Y-%m-%dT%H:%M:%SZ")
            raise KeyMaterialError(
                f"is not valid before {when}; expected a certificate valid now (or a clock "
                "that is right)",
                field=field,
                credential=credential,
            )
    return cert


def client_assertion(
    key: SigningKey,
    *,
    client_id: str,
    audience: str,
    now: float,
    lifetime: float = CLIENT_ASSERTION_LIFETIME,
) -> Secret:
    """RFC 7523 §3 for client authentication: iss = sub = client_id, a unique jti."""
    return key.sign(
        {
            "iss": client_id,
            "sub": client_id,
            "aud": audience,
            "jti": secrets.token_urlsafe(24),
            "iat": int(now),
            "exp": int(now + lifetime),
        }
    )


def bearer_assertion(
    key: SigningKey,
    *,
    issuer: str,
    audience: str,
    now: float,
    subject: str | None = None,
    scope: str | None = None,
    lifetime: float = BEARER_ASSERTION_LIFETIME,
) -> Secret:
    """RFC 7523 §2.1/§3 for the JWT bearer grant; `scope` is a claim as Google reads it, and
    `sub` only when the account acts for someone (domain-wide delegation)."""
    claims: dict[str, Any] = {
        "iss": issuer,
        "aud": audience,
        "jti": secrets.token_urlsafe(24),
        "iat": int(now),
        "exp": int(now + lifetime),
    }
    if subject is not None:
        claims["sub"] = subject
    if scope:
        claims["scope"] = scope
    return key.sign(claims)


@dataclass(frozen=True, slots=True)
class ServiceAccount:
    """What a Google service-account key file says: who signs, with which key, for where."""

    client_email: str
    token_uri: str
    key: SigningKey


def load_service_account(credential: str, text: Secret, *, field: str) -> ServiceAccount:
    """A Google service-account key file (JSON, `"type": "service_account"`): its RSA key,
    `private_key_id` as kid, `client_email` and `token_uri`."""
    try:
        document = json.loads(text.reveal())
    except ValueError:
        document = None
    names = ("private_key", "private_key_id", "client_email", "token_uri")
    if not isinstance(document, dict) or document.get("type") != "service_account":
        raise KeyMaterialError(
            'is not a service-account key file; expected Google\'s JSON with "type": '
            f'"service_account" and {", ".join(names)}',
            field=field,
            credential=credential,
        )
    missing = [name for name in names if not isinstance(document.get(name), str)]
    if missing:
        raise KeyMaterialError(
            f"has no {', '.join(missing)}; expected a complete service-account key file",
            field=field,
            credential=credential,
        )
    key = load_signing_key(
        credential,
        Secret(document["private_key"]),
        alg="RS256",
        kid=document["private_key_id"],
        field=f"{field}.private_key",
    )
    return ServiceAccount(document["client_email"], document["token_uri"], key)


def jwk_thumbprint(jwk: dict[str, Any]) -> str:
    """RFC 7638: SHA-256 over the required members, sorted, without whitespace."""
    required = {
        "RSA": ("e", "kty", "n"),
        "EC": ("crv", "kty", "x", "y"),
        "OKP": ("crv", "kty", "x"),
    }
    members = {name: jwk[name] for name in required[jwk["kty"]]}
    canonical = json.dumps(members, separators=(",", ":"), sort_keys=True)
    return _b64(hashlib.sha256(canonical.encode()).digest())


def certificate_thumbprint(cert: x509.Certificate) -> str:
    """RFC 8705 §3.1 `x5t#S256`: what a certificate-bound token's `cnf` names."""
    return _b64(cert.fingerprint(hashes.SHA256()))


def _private_key(credential: str, pem: Secret, field: str) -> PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem.reveal().encode(), password=None)
    except (ValueError, TypeError, UnicodeError):
        # cryptography's message can describe the data: never chained.
        raise KeyMaterialError(
            'cannot be read; expected an unencrypted PEM private key ("-----BEGIN PRIVATE KEY'
            '-----", PKCS#8 or the RSA/EC forms)',
            field=field,
            credential=credential,
        ) from None
    except Exception:
        raise KeyMaterialError(
            "is a private key of an unsupported type; expected RSA, EC P-256, Ed25519 or Ed448",
            field=field,
            credential=credential,
        ) from None
    if not isinstance(key, PrivateKey):
        raise KeyMaterialError(
            f"is {_kind(key)}; expected RSA, EC P-256, Ed25519 or Ed448",
            field=field,
            credential=credential,
        )
    return key


def _default_alg(key: PrivateKey) -> Algorithm:
    if isinstance(key, rsa.RSAPrivateKey):
        return "RS256"
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return "ES256"
    return "EdDSA"


def _mismatch(key: PrivateKey, alg: Algorithm) -> str | None:
    """What is wrong with `key` for `alg`, or None."""
    if alg in ("RS256", "PS256"):
        if not isinstance(key, rsa.RSAPrivateKey):
            return f"is {_kind(key)}"
        if key.key_size < MIN_RSA_BITS:
            return f"is {_kind(key)}"
        return None
    if alg == "ES256":
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            return f"is {_kind(key)}"
        if not isinstance(key.curve, ec.SECP256R1):
            return f"is {_kind(key)}"
        return None
    if not isinstance(key, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey):
        return f"is {_kind(key)}"
    return None


def _kind(key: object) -> str:
    """What `key` is, in words that never quote it."""
    if isinstance(key, rsa.RSAPrivateKey):
        return f"an RSA key of {key.key_size} bits"
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return f"an EC key on {key.curve.name}"
    if isinstance(key, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey):
        return "an EdDSA key"
    return f"a {type(key).__name__.removeprefix('_').removesuffix('PrivateKey')} key"


def _public_jwk(public: Any) -> dict[str, Any]:
    if isinstance(public, rsa.RSAPublicKey):
        return RSAAlgorithm.to_jwk(public, as_dict=True)
    if isinstance(public, ec.EllipticCurvePublicKey):
        return ECAlgorithm.to_jwk(public, as_dict=True)
    return OKPAlgorithm.to_jwk(public, as_dict=True)


def _spki(public: Any) -> bytes:
    return bytes(
        public.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
