"""A client that proves itself without a shared secret: a signed assertion (`private_key_jwt`,
RFC 7523 §2.2), a client certificate (RFC 8705 `tls_client_auth`,
`self_signed_tls_client_auth`), or a JWT bearer grant (RFC 7523 §2.1).

`ClientKey` is what a credential's inputs resolve to instead of a client secret; the token
client asks it for the request's fields (`fields_for`) and, for mutual TLS, for the TLS
context that presents the certificate (`tls_context`). `describe_refusal` words a refused
assertion so that an operator sees what was sent (iss, aud, alg, kid), never a key.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import httpx

from keyturn.config import CredentialConfig

# keyturn.providers.assertions (PyJWT, cryptography: a tenth of a second to import) is imported
# where a keyless client is used, not by every keyturn process.
if TYPE_CHECKING:
    from keyturn.providers.assertions import Algorithm, SigningKey
from keyturn.references import SecretRef
from keyturn.secret import Secret

ResolveAll = Callable[[Sequence[SecretRef]], Awaitable[list[Secret]]]
Method = Literal["private_key_jwt", "tls_client_auth", "self_signed_tls_client_auth"]


@dataclass(frozen=True, slots=True)
class TlsIdentity:
    """A client certificate (PEM, public) and its private key (a `Secret`)."""

    certificate: str
    key: Secret
    thumbprint: str  # RFC 8705 x5t#S256, what a bound token's `cnf` names


@dataclass(frozen=True, slots=True)
class BearerClaims:
    """The JWT bearer grant's assertion claims (`aud` None: the provider's token URL)."""

    issuer: str
    subject: str | None = None
    audience: str | None = None
    scope: str | None = None


@dataclass(frozen=True, slots=True)
class ClientKey:
    """A credential's client authentication without a client secret. `method` None: no client
    authentication at all (a JWT bearer grant that proves itself)."""

    method: Method | None
    signing_key: SigningKey | None = None
    tls: TlsIdentity | None = None
    bearer: BearerClaims | None = None
    _context: list[ssl.SSLContext] = field(default_factory=list, compare=False, repr=False)

    def fields_for(
        self, fields: dict[str, str | list[str]], client_id: str, *, audience: str, now: float
    ) -> Secret | None:
        """Add this client's authentication to a request's `fields` (and, for a JWT bearer
        grant, its grant); returns the assertion sent, if any, so an error never quotes it."""
        from keyturn.providers import assertions  # noqa: PLC0415 - see the imports

        sent = None
        if self.bearer is not None and fields.get("grant_type") == "client_credentials":
            assert self.signing_key is not None
            claims = self.bearer
            sent = assertions.bearer_assertion(
                self.signing_key,
                issuer=claims.issuer,
                subject=claims.subject,
                audience=claims.audience or audience,
                scope=claims.scope,
                now=now,
            )
            fields["grant_type"] = assertions.JWT_BEARER_GRANT
            fields["assertion"] = sent.reveal()
            fields.pop("scope", None)  # the assertion carries it (as Google reads it)
        if self.method == "private_key_jwt":
            assert self.signing_key is not None
            sent = assertions.client_assertion(
                self.signing_key, client_id=client_id, audience=audience, now=now
            )
            fields["client_assertion_type"] = assertions.CLIENT_ASSERTION_TYPE
            fields["client_assertion"] = sent.reveal()
        if self.method is not None:
            fields["client_id"] = client_id
        return sent

    def tls_context(self) -> ssl.SSLContext | None:
        """A TLS context presenting the client certificate (mutual TLS), built once, trusting
        what httpx trusts (certifi, or SSL_CERT_FILE); None without a certificate to present."""
        if self.tls is None:
            return None
        if not self._context:
            context = httpx.create_ssl_context()
            with _key_files(self.tls) as (cert_path, key_path):
                context.load_cert_chain(cert_path, key_path)
            self._context.append(context)
        return self._context[0]


def keyless_client(
    credential: str,
    method: Method | None,
    *,
    key: Secret | None,
    alg: Algorithm | None,
    kid: str | None,
    certificate: Secret | None,
    now: float,
    bearer: BearerClaims | None = None,
) -> ClientKey:
    """Check the key and certificate once and build the credential's `ClientKey`."""
    from keyturn.providers.assertions import load_certificate, load_signing_key  # noqa: PLC0415

    cert_pem = None if certificate is None else certificate.reveal()
    signing_key = None
    if key is not None:
        signing_key = load_signing_key(
            credential,
            key,
            alg=alg,
            kid=kid,
            certificate=cert_pem,
            now=now,
            field="client_key",
            certificate_field="client_certificate",
        )
    tls = None
    if method in ("tls_client_auth", "self_signed_tls_client_auth"):
        assert key is not None
        assert cert_pem is not None
        assert signing_key is not None
        assert signing_key.x5t_s256 is not None
        tls = TlsIdentity(cert_pem, key, signing_key.x5t_s256)
    elif cert_pem is not None:
        load_certificate(credential, cert_pem, now=now, field="client_certificate")
    return ClientKey(method, signing_key, tls, bearer)


async def resolve_keyless(
    credential: CredentialConfig, resolve_all: ResolveAll, now: float
) -> tuple[str, ClientKey]:
    """client_id and a key, certificate or service-account file, read and checked (a
    KeyMaterialError names the field: an operator must replace it)."""
    assert credential.client_id is not None
    refs = [credential.client_id]
    for ref in (
        credential.client_key,
        credential.client_certificate,
        credential.service_account,
    ):
        if ref is not None:
            refs.append(ref)
    values = iter(await resolve_all(refs))
    client_id = next(values).reveal()
    key = next(values) if credential.client_key is not None else None
    certificate = next(values) if credential.client_certificate is not None else None
    account = next(values) if credential.service_account is not None else None
    method = None if credential.client_auth == "client_secret" else credential.client_auth
    alg, kid, bearer = credential.client_key_alg, credential.client_key_id, None
    if credential.grant == "jwt_bearer":
        issuer, audience = client_id, credential.assertion_audience
        if account is not None:
            from keyturn.providers.assertions import load_service_account  # noqa: PLC0415

            loaded = load_service_account(credential.name, account, field="service_account")
            key, alg, kid = loaded.key.pem, loaded.key.alg, kid or loaded.key.kid
            issuer, audience = loaded.client_email, audience or loaded.token_uri
        bearer = BearerClaims(issuer, credential.assertion_subject, audience, credential.scope)
    return client_id, keyless_client(
        credential.name,
        method,
        key=key,
        alg=alg,
        kid=kid,
        certificate=certificate,
        now=now,
        bearer=bearer,
    )


def describe_refusal(client: ClientKey, client_id: str, audience: str) -> str:
    """What keyturn sent, for the line of a refused authentication (no key, no assertion)."""
    if client.bearer is not None and client.signing_key is not None:
        claims = client.bearer
        key = client.signing_key
        return (
            f"jwt-bearer assertion iss={claims.issuer} sub={claims.subject or '-'} "
            f"aud={claims.audience or audience} alg={key.alg} kid={key.kid}"
        )
    if client.method == "private_key_jwt" and client.signing_key is not None:
        key = client.signing_key
        return f"client assertion iss=sub={client_id} aud={audience} alg={key.alg} kid={key.kid}"
    if client.tls is not None:
        return f"{client.method} with the certificate x5t#S256={client.tls.thumbprint}"
    return "no client authentication"


@contextlib.contextmanager
def _key_files(identity: TlsIdentity) -> Iterator[tuple[str, str]]:
    """The certificate and key as paths for `load_cert_chain` (it reads only files): in memory
    (memfd) where Linux offers it, else in a private temporary directory, removed at once."""
    if hasattr(os, "memfd_create"):
        cert_fd = os.memfd_create("keyturn-client-cert")
        key_fd = os.memfd_create("keyturn-client-key")
        try:
            os.write(cert_fd, identity.certificate.encode())
            os.write(key_fd, identity.key.reveal().encode())
            yield f"/proc/self/fd/{cert_fd}", f"/proc/self/fd/{key_fd}"
        finally:
            os.close(cert_fd)
            os.close(key_fd)
        return
    with tempfile.TemporaryDirectory(prefix="keyturn-tls-") as directory:  # pragma: no cover
        cert_path, key_path = f"{directory}/cert.pem", f"{directory}/key.pem"
        for path, text in ((cert_path, identity.certificate), (key_path, identity.key.reveal())):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as handle:
                handle.write(text)
        yield cert_path, key_path
