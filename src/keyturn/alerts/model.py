"""The `Alert` value object: what a hook is told, and nothing secret.

An alert is one condition (detector, credential, provider); its `fingerprint` hashes that so
the dispatcher and receivers can deduplicate and match `resolved` to `firing`. Fields must be
plain bounded `str` (a `Secret` is refused) and `scrub_text` blanks anything that looks like
a value: docs/alerts.md#no-secrets.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace
from typing import Literal
from urllib.parse import urlsplit

from keyturn.clock import rfc3339
from keyturn.logs import SENSITIVE_KEYS
from keyturn.secret import PLACEHOLDER

Severity = Literal["info", "warning", "critical"]
Status = Literal["firing", "resolved"]

SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")
SEVERITY_RANK: dict[str, int] = {s: i for i, s in enumerate(SEVERITIES)}
MAX_FIELD = 1000
# Where alerts point when a hook has no `runbook_base`: the runbook's path in keyturn's own
# source tree, not a web address (keyturn has none to promise). A hook's `runbook_base` names
# the URL of the team's own copy, and then alerts carry a link people can click.
DEFAULT_RUNBOOK_BASE = "docs/runbook.md"

# Every detector an alert can be about (docs/metrics.md and docs/alerts.md). The
# configuration's `detectors` filter accepts only these names, so a typo cannot silently
# filter everything out: a new detector is added here.
DETECTORS: tuple[str, ...] = (
    "published_secret_changed",
    "refresh_token_rejected",
    "client_rejected",
    "fresh_credential_rejected",
    "grant_drift",
    "unusual_usage",
    "unexpected_reader",
    "vault_token_expiring",
    "alert_hook_failing",
    "loop_stalled",
    "credential_failing",
    "manual_rotation_due",
    # from Vault's audit log, with [usage] (keyturn.usage.detectors)
    "private_state_read",
    "published_path_written",
    "usage_source_down",
    # a previous key revoked at max_grace while consumers still read it (keyturn.jobs.rotation)
    "consumers_not_moved",
    # several instances (keyturn.members): a shared instance_id, a skewed clock, no heartbeat
    "instance_membership",
    # a signing key's registration: a registration access token a person must replace, a
    # server that dropped the key in use (keyturn.kinds.signing_key.registration)
    "registration_refused",
    "registration_dropped_key",
)

_SECRET_WORDS = "|".join(
    re.escape(k) for k in sorted(SENSITIVE_KEYS | {"routing_key"}, key=len, reverse=True)
)
# A known secret name and what follows it: `token=abc`, `"client_secret": "abc"`,
# `api_key: abc` — but also keyturn's own `/oauth/token: HTTP 503` and
# `access_token: missing or not a non-empty string`. `_is_value` tells them apart.
_NAMED = re.compile(
    rf"""(?i)(?<![A-Za-z0-9_-])(?P<open>["']?)(?P<name>{_SECRET_WORDS})(?P=open)"""
    r"""(?P<sep>\s*[=:])(?P<space>\s*)"""
    r"""(?:(?P<quote>["'])(?P<quoted>[^"'\r\n]*)|(?P<bare>[^\s"',;&}\])]+))"""
)
# `Bearer abc`, `Basic abc` (an Authorization value).
_AUTH_VALUE = re.compile(r"(?i)\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]+")
# `Authorization: <another scheme> <value>`.
_AUTH_HEADER = re.compile(
    r"""(?i)(?<![A-Za-z0-9_-])((?:proxy-)?authorization["']?\s*[:=]\s*["']?[A-Za-z][\w-]*\s+)"""
    r"""([^\s"',;]+)"""
)
# A word of a sentence: `missing`, `RemoteProtocolError`, `HTTP`, `non-empty`.
_WORD = re.compile(r"[A-Za-z]+(?:-[A-Za-z]+)*")
# What a generated value looks like: 8+ characters mixing letters and digits, not a path.
_GENERATED = re.compile(r"(?=\S*[0-9])(?=\S*[A-Za-z])[^/\s]\S{7,}")
# The sentence goes on after the first token: `3 consecutive …`, `/oauth/token: HTTP 503`.
_GOES_ON = re.compile(r"[ \t]+[\w/(]")


def _is_value(match: re.Match[str]) -> bool:
    """Whether what follows a secret's name in `match` is a value (not keyturn's prose).

    Query, form, JSON and compact forms (`token=x`, `"token": "x"`, `token:x`) always hold a
    value. keyturn writes `<field or path>: <reason>` with a space after the colon; there, a
    word (`missing`, `HTTP`, `RemoteProtocolError`) is prose, and so is a number or a path
    that a sentence goes on after (`3 consecutive failed runs`). A single token that ends the
    clause, or one that looks generated, is a value.
    """
    if match["open"] or match["quote"] is not None or "=" in match["sep"]:
        return True
    if not match["space"]:
        return True
    token = match["bare"]
    if _WORD.fullmatch(token):
        return False
    if _GOES_ON.match(match.string, match.end()):
        return _GENERATED.fullmatch(token) is not None
    return True


def _blank_named_values(text: str) -> str:
    parts: list[str] = []
    position = 0
    while (match := _NAMED.search(text, position)) is not None:
        group = "bare" if match["quote"] is None else "quoted"
        start, end = match.span(group)
        parts.append(text[position:start])
        if _is_value(match):
            parts.append(PLACEHOLDER)
            position = end
        else:
            position = start  # the words after the name are read again for names of their own
    parts.append(text[position:])
    return "".join(parts)


def _blank_auth_header(match: re.Match[str]) -> str:
    value = match[2]
    return match[0] if _WORD.fullmatch(value) else f"{match[1]}{PLACEHOLDER}"


def scrub_text(text: str) -> str:
    """`text` with secret values replaced by a placeholder, and its words left alone.

    Blanked: what follows `Bearer`/`Basic` and an Authorization header's scheme; the value in
    `token=x`, `"client_secret": "x"`, `api_key:x`, and a lone or generated-looking token in
    `api_key: x`. Kept: keyturn's `<field or path>: <reason>`, e.g. `/oauth/token: HTTP 503`
    or `access_token: missing or not a non-empty string`. A net under keyturn's messages
    (which never carry values), not a reason to log values. Scrubbing twice changes nothing.
    """
    text = _AUTH_VALUE.sub(lambda m: f"{m[1]} {PLACEHOLDER}", text)
    text = _AUTH_HEADER.sub(_blank_auth_header, text)
    return _blank_named_values(text)


def clip(text: str, limit: int = MAX_FIELD) -> str:
    """`text` cut to `limit` characters (with "…" when cut)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def alert_name(detector: str) -> str:
    """`refresh_token_rejected` → `KeyturnRefreshTokenRejected` (the Alertmanager alertname)."""
    return "Keyturn" + "".join(part.capitalize() for part in detector.split("_"))


def runbook_url(base: str, name: str) -> str:
    """The runbook section of alert `name`: `<base>#<name in lower case>`, the anchor GitHub
    (and most Markdown renderers) give a `## KeyturnRefreshTokenRejected` heading."""
    return f"{base.rstrip('#')}#{name.lower()}"


def is_web_link(url: str) -> bool:
    """Whether `url` is an absolute http(s) URL a receiver can render as a link (the default
    runbook reference, `docs/runbook.md#…`, is a path in keyturn's source, not one)."""
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def fingerprint(detector: str, credential: str, provider: str, hook: str = "") -> str:
    """Stable id of a condition: the same inputs give the same 16 hex digits in every process."""
    material = "\x00".join((detector, credential, provider, hook)).encode()
    return hashlib.sha256(material).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert. Times are epoch seconds; `ends_at` is set when resolved.

    credential/provider are "" for alerts about keyturn itself (e.g. `loop_stalled`); `hook`
    names the hook an `alert_hook_failing` alert is about ("" otherwise).
    """

    name: str
    detector: str
    severity: Severity
    summary: str
    credential: str
    provider: str
    runbook_url: str
    starts_at: float
    status: Status = "firing"
    ends_at: float | None = None
    hook: str = ""
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        for name in ("name", "detector", "summary", "credential", "provider", "runbook_url"):
            value = getattr(self, name)
            if type(value) is not str:  # a Secret (or anything else) is refused, not rendered
                raise TypeError(f"Alert.{name} must be a str, not {type(value).__name__}")
            if len(value) > MAX_FIELD:
                raise ValueError(f"Alert.{name} is longer than {MAX_FIELD} characters")
        if type(self.hook) is not str or len(self.hook) > MAX_FIELD:
            raise TypeError("Alert.hook must be a short str")
        if self.severity not in SEVERITY_RANK:
            raise ValueError(f"Alert.severity must be one of {', '.join(SEVERITIES)}")
        if self.status not in ("firing", "resolved"):
            raise ValueError("Alert.status must be firing or resolved")
        if not self.detector:
            raise ValueError("Alert.detector must not be empty")
        key = fingerprint(self.detector, self.credential, self.provider, self.hook)
        object.__setattr__(self, "fingerprint", key)

    @classmethod
    def make(
        cls,
        detector: str,
        severity: Severity,
        summary: str,
        *,
        credential: str = "",
        provider: str = "",
        starts_at: float,
        runbook_base: str = DEFAULT_RUNBOOK_BASE,
        hook: str = "",
    ) -> Alert:
        """An alert named after its detector, its summary scrubbed and clipped."""
        name = alert_name(detector)
        return cls(
            name=name,
            detector=detector,
            severity=severity,
            summary=clip(scrub_text(summary)),
            credential=credential,
            provider=provider,
            runbook_url=runbook_url(runbook_base, name),
            starts_at=starts_at,
            hook=hook,
        )

    @property
    def firing(self) -> bool:
        return self.status == "firing"

    def resolve(self, at: float) -> Alert:
        """The same alert, resolved at `at`."""
        return replace(self, status="resolved", ends_at=max(at, self.starts_at))

    def with_runbook_base(self, base: str) -> Alert:
        """The same alert whose runbook link points into another copy of the runbook."""
        return replace(self, runbook_url=runbook_url(base, self.name))

    def to_dict(self) -> dict[str, object]:
        """Every field, times in RFC 3339 (the generic webhook's `alert` object)."""
        return {
            "name": self.name,
            "fingerprint": self.fingerprint,
            "status": self.status,
            "severity": self.severity,
            "detector": self.detector,
            "credential": self.credential,
            "provider": self.provider,
            "hook": self.hook or None,
            "summary": self.summary,
            "runbook_url": self.runbook_url,
            "starts_at": rfc3339(self.starts_at),
            "ends_at": None if self.ends_at is None else rfc3339(self.ends_at),
        }
