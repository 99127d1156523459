"""`Secret`: a string that never shows itself.

Every credential value keyturn handles (client secrets, refresh and access tokens, API keys,
Vault tokens) travels as a `Secret`. Its repr, str, format and structlog form are a
placeholder, so a value that reaches a log line, an exception message or a status table by
accident prints as `**********`. The only way to the value is `reveal()`, which is easy to grep.
"""

from __future__ import annotations

import hmac
from typing import Any, NoReturn, final

PLACEHOLDER = "**********"


@final
class Secret:
    """An opaque secret string; compare with `==` (constant time), read with `reveal()`."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"Secret wraps a str, not {type(value).__name__}")
        self._value = value

    def reveal(self) -> str:
        """The value itself: only for the wire (HTTP body, header, Vault write)."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret('{PLACEHOLDER}')"

    def __str__(self) -> str:
        return PLACEHOLDER

    def __format__(self, spec: str) -> str:
        return PLACEHOLDER

    def __structlog__(self) -> str:
        return PLACEHOLDER

    def __bool__(self) -> bool:
        return bool(self._value)

    def __len__(self) -> int:
        return len(self._value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash((Secret, self._value))

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Secret cannot be pickled")

    def __copy__(self) -> Secret:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Secret:
        return self
