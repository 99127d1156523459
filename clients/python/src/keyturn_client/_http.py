"""What the HTTP integrations share: which answers a new value could fix."""

from __future__ import annotations

REJECTED = frozenset({401, 403})


def worth_a_new_value(status: int, challenge: str | None) -> bool:
    """A 401 or 403 that the credential's next value could fix.

    RFC 6750's `insufficient_scope` is not one: the credential was accepted but lacks a
    permission, and the next value keyturn publishes lacks it too.
    """
    if status not in REJECTED:
        return False
    return challenge is None or "insufficient_scope" not in challenge
