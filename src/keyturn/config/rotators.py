"""Loading `[[rotators]]` and each credential's `rotation` table.

A rotator is chosen by `type`, and each type has its own keys (a key of another type is an
unknown key, as with `[vault].auth`'s methods):

    [[rotators]]                     [[rotators]]                [[rotators]]
    name = "acme-keys"               name = "vendor-script"      name = "by-hand"
    type = "http"                    type = "exec"               type = "manual"
    provider = "acme"                command = ["/usr/local/bin/rotate"]
    auth = "env:ACME_ADMIN_TOKEN"    timeout = "30s"
    create = { path = "/keys", body = '{"name": "{key_name}"}', value = "/key", id = "/id" }
    revoke = { path = "/keys/{key_id}" }

Templates and pointers are checked here, at load: placeholders are known, a body is JSON once
they are filled, pointers are RFC 6901. A rotation names a rotator that exists, and only one
that can serve the credential's kind.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from keyturn.config.fields import (
    DAY,
    HTTP_PATH,
    MAX_TIMEOUT,
    NAME,
    Field,
    Invalid,
    choice,
    describe,
    duration,
    http_path_problem,
    integer,
    kind_of,
    secret_reference,
    text,
)
from keyturn.config.reader import Table
from keyturn.config.schema import (
    CredentialKind,
    ExecRotatorConfig,
    HttpCall,
    HttpFind,
    HttpMethod,
    HttpRotatorConfig,
    ManualRotatorConfig,
    RotationPolicy,
    RotatorConfig,
    RotatorType,
)
from keyturn.config.templates import (
    REQUEST_PLACEHOLDERS,
    REVOKE_PLACEHOLDERS,
    body_problem,
    placeholders,
    pointer_tokens,
    stray_brace,
)

ROTATOR_TYPES: tuple[RotatorType, ...] = ("http", "exec", "manual")
HTTP_METHODS: tuple[HttpMethod, ...] = ("GET", "POST", "PUT", "PATCH", "DELETE")

# Prototypes whose field defaults are the configuration's defaults.
_ROTATION = RotationPolicy(max_age=1.0, rotator="-")
_CREATE = HttpCall(path="/")
_REVOKE_METHOD: HttpMethod = "DELETE"
_EXEC = ExecRotatorConfig(name="-", command=("-",))
_HTTP = HttpRotatorConfig(name="-", provider="-", create=_CREATE, revoke=_CREATE)
_FIND_METHOD: HttpMethod = "GET"

_METHOD = choice(HTTP_METHODS)
_AUTH = secret_reference('auth = "env:SANDBOX_ADMIN_TOKEN"')
_AUTH_SCHEME = text(
    'an HTTP auth scheme, e.g. "Bearer" or "Token"',
    re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}"),
)
_EXEC_TIMEOUT = duration(positive=True, maximum=MAX_TIMEOUT)
# A key may live up to ten years; the old one stays valid for at most a year after.
_MAX_AGE = duration(minimum=1.0, maximum=3650 * DAY)
_GRACE = duration()
_VERIFY_ATTEMPTS = integer(1, 100)
_CALL_EXAMPLE = {
    "create": 'create = { path = "/keys", body = \'{"name": "{key_name}"}\', value = "/key", '
    'id = "/key_id" }',
    "revoke": 'revoke = { path = "/keys/{key_id}" }',
}


def _listing(names: tuple[str, ...]) -> str:
    return ", ".join(f"{{{n}}}" for n in names)


def _placeholder_problem(template: str, allowed: tuple[str, ...]) -> str | None:
    for name in placeholders(template):
        if name in allowed:
            continue
        if name == "key_id":
            return (
                f"{{key_id}} is known only to revoke; expected placeholders among "
                f"{_listing(allowed)}"
            )
        return f"unknown placeholder {{{name}}}; expected placeholders among {_listing(allowed)}"
    return None


def path_template(allowed: tuple[str, ...]) -> Field[str]:
    """An HTTP path whose `{placeholders}` are among `allowed`."""
    expected = f"{HTTP_PATH.expected}; it may use {_listing(allowed)}"

    def convert(value: object, from_env: bool) -> str:
        try:
            path = HTTP_PATH.convert(value, from_env)
        except Invalid:
            reason = http_path_problem(value) if isinstance(value, str) else None
            raise Invalid(f"got {describe(value)}{reason or ''}; expected {expected}") from None
        if stray_brace(path):
            raise Invalid(
                f'got {describe(path)}, which has a "{{" or "}}" outside a {{placeholder}}; '
                f"expected {expected}"
            )
        problem = _placeholder_problem(path, allowed)
        if problem is not None:
            raise Invalid(problem)
        return path

    return Field(expected, convert)


def body_template(allowed: tuple[str, ...]) -> Field[str]:
    """A JSON text with `{placeholders}` among `allowed` inside its strings (never echoed)."""
    expected = f'a JSON text, e.g. \'{{"name": "{{key_name}}"}}\'; it may use {_listing(allowed)}'

    def convert(value: object, _env: bool) -> str:
        if not isinstance(value, str) or not value.strip():
            shown = "an empty string" if isinstance(value, str) else kind_of(value)
            raise Invalid(f"got {shown}; expected {expected}")
        problem = _placeholder_problem(value, allowed)
        if problem is not None:
            raise Invalid(problem)
        problem = body_problem(value)
        if problem is not None:
            raise Invalid(f"{problem}; expected {expected}")
        return value

    return Field(expected, convert)


def json_pointer(*, allow_root: bool, to: str = 'such as "/key" or "/data/0/id"') -> Field[str]:
    """An RFC 6901 JSON pointer; "" (the whole response) only if `allow_root`."""
    root = ', or "" for the whole response' if allow_root else ""
    expected = f"a JSON pointer (RFC 6901) {to}{root}"

    def convert(value: object, _env: bool) -> str:
        if not isinstance(value, str) or (value == "" and not allow_root):
            shown = "an empty string" if value == "" else describe(value)
            raise Invalid(f"got {shown}; expected {expected}")
        try:
            pointer_tokens(value)
        except ValueError as exc:
            raise Invalid(f"got {describe(value)} ({exc}); expected {expected}") from None
        return value

    return Field(expected, convert)


_VALUE = json_pointer(allow_root=False, to='to the new key\'s value, e.g. "/key"')
_CREATE_ID = json_pointer(
    allow_root=False, to='to the new key\'s id, e.g. "/key_id" (revoke needs it)'
)
_ITEMS = json_pointer(allow_root=True, to='to the array of keys, e.g. "/api_keys"')
_ITEM_NAME = json_pointer(allow_root=False, to='to a key\'s name inside one item, e.g. "/name"')
_ITEM_ID = json_pointer(allow_root=False, to='to a key\'s id inside one item, e.g. "/key_id"')


def _from_env_json(value: object, from_env: bool) -> object:
    if from_env and isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _statuses(value: object, from_env: bool) -> tuple[int, ...]:
    expected = STATUSES.expected
    if from_env and isinstance(value, str) and re.fullmatch(r"[\d\s,]+", value):
        value = [int(part) for part in value.split(",") if part.strip()]
    value = _from_env_json(value, from_env)
    if not isinstance(value, list) or not value:
        raise Invalid(f"got {describe(value)}; expected {expected}")
    result: list[int] = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or not 100 <= item <= 599:
            raise Invalid(f"got {describe(item)} in the array; expected {expected}")
        if item not in result:
            result.append(item)
    return tuple(result)


STATUSES: Field[tuple[int, ...]] = Field(
    'a non-empty array of HTTP statuses (100-599), e.g. [200, 201] (in the environment "200,201")',
    _statuses,
)


def command_field(example: str, *, from_env: bool = True) -> Field[tuple[str, ...]]:
    """A command as argv (run without a shell): a non-empty array of strings, the program an
    absolute path or a name looked up in PATH. `from_env`: the key can be overridden, with a
    JSON array."""
    expected = (
        "a non-empty array of strings, the program first: an absolute path or a name looked up "
        f"in PATH, e.g. {example}" + (" (in the environment a JSON array)" if from_env else "")
    )

    def convert(value: object, env: bool) -> tuple[str, ...]:
        value = _from_env_json(value, env)
        if not isinstance(value, list) or not value:
            raise Invalid(f"got {describe(value)}; expected {expected}")
        for item in value:
            if not isinstance(item, str) or not item or "\x00" in item:
                shown = describe(item)
                if item == "":
                    shown = "an empty string"
                elif isinstance(item, str):
                    shown = "a string with a NUL character"
                raise Invalid(f"got {shown} in the array; expected {expected}")
        program = value[0]
        if "/" in program and not program.startswith("/"):
            raise Invalid(
                f"got {describe(program)} as the program, a relative path; expected {expected}"
            )
        return tuple(value)

    return Field(expected, convert)


COMMAND = command_field('["/usr/local/bin/rotate-key", "--vendor", "acme"]')


@dataclass(frozen=True, slots=True)
class RotatorIndex:
    """What a credential's rotation may name: the valid rotators, and every declared name
    with its type (None if the type is wrong). `declared` is None when some entry has no
    valid name: then "no such rotator" would be a guess."""

    configs: Mapping[str, RotatorConfig]
    declared: Mapping[str, RotatorType | None] | None


def load_rotators(root: Table, providers: list[str] | None) -> RotatorIndex:
    """The `[[rotators]]` entries."""
    tables = root.entries("rotators", "rotator")
    configs: dict[str, RotatorConfig] = {}
    declared: dict[str, RotatorType | None] | None = {} if tables is not None else None
    for entry in tables or []:
        rotator_type, rotator = _rotator(entry, providers)
        if rotator is not None:
            configs[rotator.name] = rotator
        if declared is not None:
            if entry.declared_name is None:
                declared = None
            else:
                declared.setdefault(entry.declared_name, rotator_type)
    return RotatorIndex(configs, declared)


def _rotator(
    t: Table, providers: list[str] | None
) -> tuple[RotatorType | None, RotatorConfig | None]:
    rotator_type = t.require("type", choice(ROTATOR_TYPES))
    if rotator_type is None:
        return None, None  # which keys are valid depends on the type: no unknown-key check
    result: RotatorConfig | None
    name = t.name or "-"
    if rotator_type == "http":
        result = _http(t, name, providers)
    elif rotator_type == "exec":
        command = t.require("command", COMMAND)
        timeout = t.get("timeout", _EXEC_TIMEOUT, _EXEC.timeout)
        result = ExecRotatorConfig(name, command, timeout) if command is not None else None
    else:
        result = ManualRotatorConfig(name)
    t.finish(f' for type "{rotator_type}"')
    return rotator_type, result if t.name is not None else None


def _http(t: Table, name: str, providers: list[str] | None) -> HttpRotatorConfig | None:
    provider = t.require("provider", NAME)
    if provider is not None and providers is not None and provider not in providers:
        known = ", ".join(f'"{p}"' for p in providers) or "none (add a [[providers]] entry)"
        t.problem("provider", f'no provider is named "{provider}"; expected one of: {known}')
    auth = t.optional("auth", _AUTH)
    auth_scheme = t.get("auth_scheme", _AUTH_SCHEME, _HTTP.auth_scheme)
    create = _call(t, "create")
    revoke = _call(t, "revoke")
    find_table = t.table("find", 'a table, e.g. find = { path = "/keys", items = "/keys", ... }')
    find = _find(find_table) if find_table is not None and t.present("find") else None
    if provider is None or create is None or revoke is None:
        return None
    return HttpRotatorConfig(
        name=name,
        provider=provider,
        auth=auth,
        auth_scheme=auth_scheme,
        create=create,
        revoke=revoke,
        find=find,
    )


def _call(parent: Table, which: str) -> HttpCall | None:
    example = _CALL_EXAMPLE[which]
    t = parent.table(which, f"a table, e.g. {example}")
    if t is None:
        return None
    if not parent.present(which):
        parent.problem(which, f"missing; expected a table, e.g. {example}")
        return None
    revoke = which == "revoke"
    allowed = REVOKE_PLACEHOLDERS if revoke else REQUEST_PLACEHOLDERS
    method = t.get("method", _METHOD, _REVOKE_METHOD if revoke else _CREATE.method)
    path = t.require("path", path_template(allowed))
    body = t.optional("body", body_template(allowed))
    value = key_id = None
    if not revoke:
        value = t.require("value", _VALUE)
        key_id = t.require("id", _CREATE_ID)
    ok_status = t.get("ok_status", STATUSES, _CREATE.ok_status)
    named = placeholders(path or "") + placeholders(body or "")
    if revoke and path is not None and "key_id" not in named:
        t.problem(
            "path",
            "names no key; expected {key_id} in revoke's path or body (the id of the key "
            "to revoke)",
        )
    t.finish(f" for {which}")
    if path is None or (not revoke and (value is None or key_id is None)):
        return None
    return HttpCall(
        path=path, method=method, body=body, value=value, id=key_id, ok_status=ok_status
    )


def _find(t: Table) -> HttpFind | None:
    method = t.get("method", _METHOD, _FIND_METHOD)
    path = t.require("path", path_template(REQUEST_PLACEHOLDERS))
    items = t.require("items", _ITEMS)
    name = t.require("name", _ITEM_NAME)
    key_id = t.require("id", _ITEM_ID)
    t.finish(" for find")
    if path is None or items is None or name is None or key_id is None:
        return None
    return HttpFind(path=path, items=items, name=name, id=key_id, method=method)


def uses_client_id(rotator: RotatorConfig) -> bool:
    """Whether an http rotator's templates need `{client_id}` (which an api_key lacks)."""
    if not isinstance(rotator, HttpRotatorConfig):
        return False
    texts = [rotator.create.path, rotator.create.body, rotator.revoke.path, rotator.revoke.body]
    if rotator.find is not None:
        texts.append(rotator.find.path)
    return any("client_id" in placeholders(t) for t in texts if t)


def load_rotation(
    t: Table, kind: CredentialKind | None, rotators: RotatorIndex
) -> RotationPolicy | None:
    """A credential's `rotation` table."""
    max_age = t.require("max_age", _MAX_AGE)
    grace = t.get("grace", _GRACE, _ROTATION.grace)
    rotator = t.require("rotator", NAME)
    attempts = t.get("verify_attempts", _VERIFY_ATTEMPTS, _ROTATION.verify_attempts)
    if max_age is not None and grace >= max_age:
        t.problem(
            "grace",
            f"is not shorter than max_age ({max_age:g}s); expected a grace shorter than max_age, "
            "so that at most two keys are live at once",
        )
    if rotator is not None:
        _check_rotator(t, rotator, kind, rotators)
    t.finish()
    if max_age is None or rotator is None:
        return None
    return RotationPolicy(max_age=max_age, rotator=rotator, grace=grace, verify_attempts=attempts)


def _check_rotator(
    t: Table, name: str, kind: CredentialKind | None, rotators: RotatorIndex
) -> None:
    declared = rotators.declared
    if declared is not None and name not in declared:
        known = ", ".join(f'"{r}"' for r in declared) or "none (add a [[rotators]] entry)"
        t.problem("rotator", f'no rotator is named "{name}"; expected one of: {known}')
        return
    rotator_type = declared.get(name) if declared is not None else None
    if kind == "oauth_client" and rotator_type == "manual":
        t.problem(
            "rotator",
            f'"{name}" is a manual rotator, which cannot rotate an oauth_client\'s secret; '
            'expected an "http" or "exec" rotator',
        )
    config = rotators.configs.get(name)
    if kind == "api_key" and config is not None and uses_client_id(config):
        t.problem(
            "rotator",
            f'"{name}" uses {{client_id}}, which an api_key credential does not have; '
            "expected a rotator whose templates do not use {client_id}",
        )
