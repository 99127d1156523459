"""The metrics contract as data: every name, type, label set and help text of docs/metrics.md.

Help texts are the doc's "meaning" cells verbatim, so `tests/unit/test_metrics_contract.py` can
compare what the registry exposes with the tables and the two cannot drift apart. The bounded
sets of label words live here too: a word outside its set is exposed as `other`, so a caller's
bug can never turn a label into an unbounded (or secret) value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from keyturn import kinds
from keyturn.events import NO_ANSWER
from keyturn.providers.tokens import KNOWN_OAUTH_ERRORS
from keyturn.vault.client import VAULT_OPERATIONS, VAULT_RESULTS

MetricType = Literal["gauge", "counter", "histogram"]
CREDENTIAL_LABELS = ("credential", "provider", "kind")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str  # as exposed; counters end in _total
    type: MetricType
    labels: tuple[str, ...]
    help: str
    buckets: tuple[float, ...] = ()


def _gauge(name: str, help_text: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, "gauge", labels, help_text)


def _counter(name: str, labels: tuple[str, ...], help_text: str) -> MetricSpec:
    return MetricSpec(name, "counter", labels, help_text)


# -- per credential (labels credential, provider, kind) ------------------------------------------
EXPIRY = _gauge(
    "keyturn_credential_expiry_timestamp_seconds",
    "when the published access token expires (OAuth) or the key is due for rotation (API key)",
    CREDENTIAL_LABELS,
)
ISSUED = _gauge(
    "keyturn_credential_issued_timestamp_seconds",
    "when the published value was issued",
    CREDENTIAL_LABELS,
)
NEXT_SCHEDULED = _gauge(
    "keyturn_credential_next_scheduled_timestamp_seconds",
    "when keyturn next runs this credential's job",
    CREDENTIAL_LABELS,
)
LAST_SUCCESS = _gauge(
    "keyturn_credential_last_success_timestamp_seconds",
    "the last successful refresh or rotation",
    CREDENTIAL_LABELS,
)
READY = _gauge(
    "keyturn_credential_ready", "1 while apps can read a valid value, else 0", CREDENTIAL_LABELS
)
FAILURES = _gauge(
    "keyturn_credential_consecutive_failures",
    "failed runs since the last success",
    CREDENTIAL_LABELS,
)
ROTATE_AFTER = _gauge(
    "keyturn_credential_rotate_after_timestamp_seconds",
    "when the current key or client secret is due for rotation (only with `rotation`)",
    CREDENTIAL_LABELS,
)
REFRESH_TOKEN_EXPIRY = _gauge(
    "keyturn_refresh_token_expiry_timestamp_seconds",
    "when the refresh token keyturn holds stops working at the latest: its `refresh_expires_in` "
    "or its family's `refresh_token_max_lifetime`, whichever ends first (only when known)",
    CREDENTIAL_LABELS,
)

# -- counters --------------------------------------------------------------------------------------
TOKEN_REQUESTS = _counter(
    "keyturn_token_requests_total",
    ("credential", "provider", "grant_type", "outcome"),
    "token endpoint calls; `grant_type` is `client_credentials`, `refresh_token` or "
    '`jwt_bearer` (RFC 7523 §2.1, `grant = "jwt_bearer"`); `outcome` is `success`, an RFC 6749 '
    "error code (`invalid_grant`, `invalid_client`, …, or `other`), `http_5xx`, `network`, "
    "`rate_limited` or `malformed`",
)
PROBE_REQUESTS = _counter(
    "keyturn_probe_requests_total",
    ("credential", "provider", "result"),
    "probes of new credentials: `success`, `unauthorized` (401), `forbidden` (403), "
    "`no_answer` (a network error, time-out, 5xx or 429), `other`",
)
UNVERIFIED_PUBLICATIONS = _counter(
    "keyturn_unverified_publications_total",
    ("credential", "provider"),
    "tokens published although their probe got no answer, because the token apps read would "
    "have expired before another try (probed again later)",
)
RETRY_AFTER = _counter(
    "keyturn_retry_after_total",
    ("credential", "provider", "outcome"),
    "a provider's Retry-After met a credential's retry plan: `honoured`, `shortened` (to the "
    "published token's last planned refresh) or `overridden` (past that point, or expired: the "
    "`after_expiry` cadence instead)",
)
ROTATIONS = _counter(
    "keyturn_rotations_total",
    ("credential", "provider", "kind", "result"),
    "rotation steps: `started`, `adopted`, `created`, `verified`, `published`, `retired`, "
    "`failed`, `verification_failed`, `awaiting_manual`",
)
VAULT_OPERATIONS_TOTAL = _counter(
    "keyturn_vault_operations_total",
    ("operation", "result"),
    "Vault calls: `operation` is `read`, `write`, `read_metadata`, `list`, `delete`, `read_field`, "
    "`capabilities`, `login`, `renew`, `lookup`; `result` is `success`, `cas_conflict`, "
    "`permission_denied`, `unavailable`, `auth_error`, `not_found`, `error`",
)
SUSPICIOUS = _counter(
    "keyturn_suspicious_events_total",
    ("credential", "provider", "detector", "severity"),
    "see the detectors below",
)
ALERT_DELIVERIES = _counter(
    "keyturn_alert_deliveries_total",
    ("hook", "result"),
    "`success`, `failed`, `dropped` (rate-limited or queue full)",
)
SINK_WRITES = _counter(
    "keyturn_sink_writes_total",
    ("credential", "result"),
    "local sink files brought up to date, one per sink and attempt: `written` (and its "
    "`on_publish` command, if any, exited 0), `hook_failed` (written; the command failed or "
    "timed out), `write_failed`, `invalid_record` (the published record lacks a field), "
    "`read_failed` (Vault)",
)

# -- histograms ------------------------------------------------------------------------------------
TOKEN_REQUEST_DURATION = MetricSpec(
    "keyturn_token_request_duration_seconds",
    "histogram",
    ("provider", "grant_type"),
    "token endpoint latency",
    (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
VAULT_OPERATION_DURATION = MetricSpec(
    "keyturn_vault_operation_duration_seconds",
    "histogram",
    ("operation",),
    "Vault latency",
    (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
ROTATION_DURATION = MetricSpec(
    "keyturn_rotation_duration_seconds",
    "histogram",
    ("provider", "kind"),
    "from a rotation's start to its new key being published",
    # a verified http/exec rotation takes seconds; a manual one waits for a person (hours)
    (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 86400.0),
)
SCHEDULE_LATENESS = MetricSpec(
    "keyturn_schedule_lateness_seconds",
    "histogram",
    (),
    "how late each job ran against its planned time",
    (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0),
)

# -- process ---------------------------------------------------------------------------------------
BUILD_INFO = _gauge("keyturn_build_info", "labels `version`, `python`", ("version", "python"))
VAULT_TOKEN_EXPIRY = _gauge(
    "keyturn_vault_token_expiry_timestamp_seconds",
    "when keyturn's own Vault token expires (absent for tokens that never expire)",
)
VAULT_AUTHENTICATED = _gauge(
    "keyturn_vault_authenticated", "1 while keyturn holds a working Vault token, else 0"
)
HEARTBEAT = _gauge(
    "keyturn_scheduler_heartbeat_timestamp_seconds",
    "updated every few seconds by the event loop; stale means the loop is stalled",
)
CREDENTIALS = _gauge("keyturn_credentials", "credentials configured")
INSTANCES = _gauge(
    "keyturn_instances", "keyturn instances this one counts as alive, itself included"
)
CREDENTIALS_OWNED = _gauge(
    "keyturn_credentials_owned", "credentials in this instance's share (all of them when alone)"
)

# -- usage (with [usage]: keyturn.usage.metrics.UsageCollector, computed at scrape time) -------
CONSUMER_READS = _counter(
    "keyturn_consumer_reads_total",
    ("credential", "consumer"),
    "reads of the credential's published path by each consumer, from Vault's audit log",
)
CONSUMER_LAST_READ = _gauge(
    "keyturn_consumer_last_read_timestamp_seconds",
    "when the consumer last read the credential's published path",
    ("credential", "consumer"),
)
CONSUMERS = _gauge(
    "keyturn_consumers",
    "distinct identities seen reading the credential's published path",
    ("credential",),
)
USAGE_LINES_SKIPPED = _counter(
    "keyturn_usage_lines_skipped_total", ("reason",), "audit lines not counted, by reason"
)
USAGE_SOURCE_UP = _gauge(
    "keyturn_usage_source_up", "1 while every configured audit source can be read, else 0"
)
USAGE: tuple[MetricSpec, ...] = (
    CONSUMER_READS,
    CONSUMER_LAST_READ,
    CONSUMERS,
    USAGE_LINES_SKIPPED,
    USAGE_SOURCE_UP,
)

# What `PrometheusObserver` exposes (the usage metrics above come from their own collector).
ALL: tuple[MetricSpec, ...] = (
    EXPIRY,
    ISSUED,
    NEXT_SCHEDULED,
    LAST_SUCCESS,
    READY,
    FAILURES,
    ROTATE_AFTER,
    TOKEN_REQUESTS,
    PROBE_REQUESTS,
    UNVERIFIED_PUBLICATIONS,
    RETRY_AFTER,
    ROTATIONS,
    VAULT_OPERATIONS_TOTAL,
    SUSPICIOUS,
    ALERT_DELIVERIES,
    SINK_WRITES,
    TOKEN_REQUEST_DURATION,
    VAULT_OPERATION_DURATION,
    ROTATION_DURATION,
    SCHEDULE_LATENESS,
    BUILD_INFO,
    VAULT_TOKEN_EXPIRY,
    VAULT_AUTHENTICATED,
    HEARTBEAT,
    CREDENTIALS,
)

# -- bounded label words ---------------------------------------------------------------------------
OTHER = "other"
TOKEN_OUTCOMES = frozenset(
    {"success", OTHER, "http_5xx", "network", "rate_limited", "malformed", *KNOWN_OAUTH_ERRORS}
)
GRANT_TYPES = frozenset({"client_credentials", "refresh_token", "jwt_bearer"})
KINDS = frozenset(kinds.KINDS)  # every registered credential kind
PROBE_RESULTS = frozenset({"success", "unauthorized", "forbidden", "no_answer", OTHER})
RETRY_AFTER_OUTCOMES = frozenset({"honoured", "shortened", "overridden"})
ROTATION_RESULTS = frozenset(
    {
        "started",
        "adopted",
        "created",
        "verified",
        "published",
        "retired",
        "failed",
        "verification_failed",
        "awaiting_manual",
    }
)
OPERATIONS = frozenset(VAULT_OPERATIONS)
OPERATION_RESULTS = frozenset(VAULT_RESULTS)
DETECTORS = frozenset(
    {
        "published_secret_changed",
        "refresh_token_rejected",
        "client_rejected",
        "fresh_credential_rejected",
        "grant_drift",
        "vault_token_expiring",
        "alert_hook_failing",
        "loop_stalled",
        # from Vault's audit log (keyturn.usage), and a rotation waiting for consumers
        "unexpected_reader",
        "unusual_usage",
        "private_state_read",
        "published_path_written",
        "usage_source_down",
        "consumers_not_moved",
        "instance_membership",
        # a signing key's registration (keyturn.kinds.signing_key.registration)
        "registration_refused",
        "registration_dropped_key",
    }
)
SEVERITIES = frozenset({"info", "warning", "critical"})
ALERT_RESULTS = frozenset({"success", "failed", "dropped"})
SINK_RESULTS = frozenset(
    {"written", "hook_failed", "write_failed", "invalid_record", "read_failed"}
)


def bounded(word: str, allowed: frozenset[str]) -> str:
    """`word` if it is one of `allowed`, else `other`."""
    return word if word in allowed else OTHER


def probe_result(status: int) -> str:
    """The `result` word of a probe's HTTP status (`keyturn.events.NO_ANSWER`: none)."""
    if status == NO_ANSWER:
        return "no_answer"
    if 200 <= status < 300:
        return "success"
    return {401: "unauthorized", 403: "forbidden"}.get(status, OTHER)
