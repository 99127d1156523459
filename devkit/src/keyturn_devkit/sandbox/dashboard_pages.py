"""The dashboard's HTML: server-rendered pages, every value escaped, no inline script or style.

Every interpolated value goes through `_e` (html.escape, quotes too), so a name such as
`<script>` is shown as text. The stylesheet and the copy button's script are served from
/dashboard/static/, which lets the Content-Security-Policy forbid inline code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape
from typing import Any

from keyturn_devkit.sandbox import snippets

STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f5f6f8; }
header { background: #1d2330; color: #fff; padding: .7em 1.5em; display: flex; gap: 1.5em;
  align-items: center; }
header a { color: #cfe0ff; } header .brand { font-weight: 600; margin-right: auto; }
main { max-width: 1000px; margin: 1.5em auto; padding: 0 1.5em; }
section { background: #fff; border: 1px solid #dde1e8; border-radius: 6px; padding: 1em 1.5em;
  margin-bottom: 1.5em; }
table { border-collapse: collapse; width: 100%; } td, th { text-align: left; padding: .35em .6em;
  border-bottom: 1px solid #e8eaef; vertical-align: top; }
form.inline { display: inline; } label { display: block; margin: .5em 0 .2em; font-weight: 500; }
input[type=text], input[type=password], input[type=url] { width: 100%; max-width: 32em;
  padding: .4em; box-sizing: border-box; }
button { padding: .4em .9em; margin-top: .6em; cursor: pointer; }
form:not(.inline) button[type=submit] { display: block; }
form.inline + form.inline { margin-left: .6em; }
button.danger { color: #a40000; }
pre { background: #1d2330; color: #e8eef8; padding: 1em; overflow-x: auto; border-radius: 4px; }
.once { border: 2px solid #d08a00; background: #fff8e6; padding: .8em 1em; border-radius: 6px;
  margin-bottom: 1.5em; }
.once code { font-size: 1.05em; word-break: break-all; }
.problems { color: #a40000; } .notice { color: #1b6e2a; }
.status-revoked, .status-expired { color: #a40000; } .status-expiring { color: #a06000; }
"""

SCRIPT = """
document.querySelectorAll("button[data-copy]").forEach((button) => {
  button.addEventListener("click", async () => {
    const source = document.getElementById(button.dataset.copy);
    try {
      await navigator.clipboard.writeText(source.textContent);
      button.textContent = "Copied";
    } catch (error) {
      window.getSelection().selectAllChildren(source);
      button.textContent = "Selected: press Ctrl-C";
    }
  });
});
document.querySelectorAll("form[data-confirm]").forEach((form) => {
  form.addEventListener("submit", (event) => {
    if (!window.confirm(form.dataset.confirm)) event.preventDefault();
  });
});
"""


def _e(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def _csrf(token: str) -> str:
    return f'<input type="hidden" name="csrf" value="{_e(token)}">'


def _form(action: str, csrf: str, button: str, *, confirm: str = "", danger: bool = False) -> str:
    confirm_attr = f' data-confirm="{_e(confirm)}"' if confirm else ""
    css = ' class="danger"' if danger else ""
    return (
        f'<form class="inline" method="post" action="{_e(action)}"{confirm_attr}>'
        f'{_csrf(csrf)}<button type="submit"{css}>{_e(button)}</button></form>'
    )


def _table(headings: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    """Cells are HTML already (escaped by the caller)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headings)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _record(rows: Iterable[tuple[str, str]]) -> str:
    """One object's fields: a label (text) and a value (HTML, escaped by the caller)."""
    body = "".join(
        f'<tr><th scope="row">{_e(label)}</th><td>{value}</td></tr>' for label, value in rows
    )
    return f"<table><tbody>{body}</tbody></table>"


def _status(status: str) -> str:
    return f'<span class="status-{_e(status)}">{_e(status)}</span>'


def _problems(lines: Iterable[str]) -> str:
    items = "".join(f"<li>{_e(line)}</li>" for line in lines)
    return f'<ul class="problems" role="alert">{items}</ul>' if items else ""


def layout(title: str, main: str, *, csrf: str | None = None, notice: str = "") -> str:
    """A whole page; `csrf` given means signed in (navigation and the sign-out button)."""
    nav = ""
    if csrf is not None:
        nav = (
            '<a href="/dashboard#api-keys">API Keys</a>'
            '<a href="/dashboard#oauth-apps">OAuth Applications</a>'
            + _form("/dashboard/sign-out", csrf, "Sign out")
        )
    shown = f'<p class="notice" id="notice" role="status">{_e(notice)}</p>' if notice else ""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)} · keyturn sandbox</title>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="stylesheet" href="/dashboard/static/dashboard.css"></head><body>'
        f'<header><span class="brand">keyturn sandbox · dashboard</span>{nav}</header>'
        f"<main><h1>{_e(title)}</h1>{shown}{main}</main>"
        '<script src="/dashboard/static/dashboard.js"></script></body></html>'
    )


def sign_in(csrf: str, problem: str = "") -> str:
    main = (
        _problems([problem] if problem else [])
        + '<section><form method="post" action="/dashboard/sign-in">'
        + _csrf(csrf)
        + '<label for="admin_token">Admin token</label>'
        '<input type="password" id="admin_token" name="admin_token" autocomplete="off" required>'
        "<p>The sandbox printed it at start (<code>admin_token</code> in its bootstrap file;"
        " <code>$SANDBOX_ADMIN_TOKEN</code> in the demo's env.sh).</p>"
        '<button type="submit">Sign in</button></form></section>'
    )
    return layout("Sign in", main)


def _field(
    name: str, label: str, form: Mapping[str, str], ident: str, *, kind: str = "text"
) -> str:
    required = " required" if name in ("name", "redirect_uri") else ""
    return (
        f'<label for="{ident}">{_e(label)}</label>'
        f'<input type="{kind}" id="{ident}" name="{name}" '
        f'value="{_e(form.get(name, ""))}"{required}>'
    )


def _listing_row(page: str, item_id: str, name: str) -> list[str]:
    """The first two cells of a listing: the name, linking to its page, and the id."""
    return [f'<a href="{page}/{_e(item_id)}">{_e(name)}</a>', f"<code>{_e(item_id)}</code>"]


def _section(
    words: tuple[str, str, str, str, str],
    headings: list[str],
    rows: list[list[str]],
    csrf: str,
    problems: list[str],
    fields: list[str],
) -> str:
    """A listing and its creation form; `words`: id, title, form title, form action, button."""
    ident, title, creation, action, button = words
    return (
        f'<section id="{ident}"><h2>{_e(title)}</h2>'
        + _table(headings, rows)
        + f"<h3>{_e(creation)}</h3>"
        + _problems(problems)
        + f'<form method="post" action="{action}">{_csrf(csrf)}'
        + "".join(fields)
        + f'<button type="submit">{_e(button)}</button></form></section>'
    )


def overview(
    keys: list[dict[str, Any]],
    apps: list[dict[str, Any]],
    csrf: str,
    *,
    problems: Mapping[str, list[str]] | None = None,
    forms: Mapping[str, Mapping[str, str]] | None = None,
    notice: str = "",
) -> str:
    """Both sections: a listing and a creation form each."""
    problems, forms = problems or {}, forms or {}
    key_form, app_form = forms.get("api_key", {}), forms.get("oauth_app", {})
    keys_section = _section(
        ("api-keys", "API Keys", "Create an API key", "/dashboard/api-keys", "Create API key"),
        ["Name", "Key ID", "Description", "Status", "Created"],
        [
            [
                *_listing_row("/dashboard/api-keys", k["key_id"], k["name"]),
                _e(k["description"]),
                _status(k["status"]),
                _e(k["created_at"]),
            ]
            for k in keys
        ],
        csrf,
        problems.get("api_key", []),
        [
            _field("name", "Name", key_form, "key_name"),
            _field("description", "Description", key_form, "key_description"),
            _field("scope", "Scope (optional; default: every scope)", key_form, "key_scope"),
        ],
    )
    apps_section = _section(
        (
            "oauth-apps",
            "OAuth Applications",
            "Register an application",
            "/dashboard/oauth-apps",
            "Register application",
        ),
        ["Name", "Client ID", "Redirect URI", "Live secrets", "Created"],
        [
            [
                *_listing_row("/dashboard/oauth-apps", a["client_id"], a["name"]),
                _e(a["redirect_uri"]),
                _e(sum(s["status"] in ("active", "expiring") for s in a["secrets"])),
                _e(a["created_at"]),
            ]
            for a in apps
        ],
        csrf,
        problems.get("oauth_app", []),
        [
            _field("name", "Application name", app_form, "app_name"),
            _field("redirect_uri", "Redirect URI", app_form, "app_redirect_uri", kind="url"),
            _field(
                "scope",
                "Scope (optional; default: the sandbox's default_scope)",
                app_form,
                "app_scope",
            ),
        ],
    )
    main = keys_section + apps_section
    return layout("Dashboard", main, csrf=csrf, notice=notice)


def _shown_once(what: str, value: str | None, command: str) -> str:
    """The box with a new value, on the one page that shows it; nothing on any other."""
    if value is None:
        return ""
    return (
        f'<div class="once" role="alert"><p><strong>{_e(what)}, shown only this once.</strong>'
        " Copy it now: the sandbox keeps only its digest.</p>"
        f'<p><code id="shown-once">{_e(value)}</code> '
        '<button type="button" data-copy="shown-once">Copy</button></p>'
        f"<p>Keep it where the configuration below reads it (the value on stdin):"
        f" <code>{_e(command)}</code></p></div>"
    )


def _configuration(toml: str) -> str:
    return (
        '<section id="keyturn-configuration"><h2>keyturn configuration</h2>'
        "<p>These entries serve it; add a <code>[vault]</code> table"
        " (docs/configuration.md) and run <code>keyturn check -c keyturn.toml</code>,"
        f" then <code>keyturn run</code>, with <code>${snippets.ADMIN_TOKEN_VARIABLE}</code>"
        " set for the rotator.</p>"
        f'<pre id="keyturn-toml">{_e(toml)}</pre>'
        '<button type="button" data-copy="keyturn-toml">Copy configuration</button></section>'
    )


def api_key_page(key: dict[str, Any], csrf: str, toml: str, shown_once: str | None) -> str:
    store = snippets.vault_command(snippets.credential_name(key["name"], "api-key"), "api_key")
    once = _shown_once("The API key", shown_once, store)
    usage = key["usage"]
    rows = [
        ("Name", _e(key["name"])),
        ("Key ID", f"<code>{_e(key['key_id'])}</code>"),
        ("Description", _e(key["description"])),
        ("Scope", _e(key["scope"] or "every scope")),
        ("Status", _status(key["status"])),
        ("Created", _e(key["created_at"])),
        ("Revoked", _e(key["revoked_at"] or "")),
        ("Requests", _e(f"{usage['request_count']} accepted, {usage['rejected_count']} refused")),
        ("Last used", _e(usage["last_used_at"] or "never")),
    ]
    revoke = ""
    if key["status"] == "active":
        revoke = _form(
            f"/dashboard/api-keys/{key['key_id']}/revoke",
            csrf,
            "Revoke this key",
            confirm="Revoke this API key? Every caller using it is refused from now on.",
            danger=True,
        )
    main = once + f"<section>{_record(rows)}{revoke}</section>" + _configuration(toml)
    return layout(f"API key {key['name']}", main, csrf=csrf)


def app_page(app: dict[str, Any], csrf: str, toml: str, shown_once: str | None) -> str:
    name = snippets.credential_name(app["name"], "oauth-app")
    once = _shown_once(
        "The client secret", shown_once, snippets.vault_command(name, "client_secret")
    )
    rows = [
        ("Application name", _e(app["name"])),
        ("Client ID", f'<code id="client-id">{_e(app["client_id"])}</code>'),
        ("Redirect URI", _e(app["redirect_uri"])),
        ("Scope", _e(app["scope"] or "the sandbox's default_scope")),
        ("Created", _e(app["created_at"])),
    ]
    secrets = _table(
        ["Secret ID", "Status", "Created", "Expires"],
        (
            [
                f"<code>{_e(s['secret_id'])}</code>",
                _status(s["status"]),
                _e(s["created_at"]),
                _e(s["expires_at"] or ""),
            ]
            for s in app["secrets"]
        ),
    )
    client_id = app["client_id"]
    rotate = (
        f'<form method="post" action="/dashboard/oauth-apps/{_e(client_id)}/rotate-secret">'
        + _csrf(csrf)
        + '<label for="overlap_seconds">Older secrets stay valid for (seconds; empty:'
        " the sandbox's client_secret_overlap)</label>"
        '<input type="text" id="overlap_seconds" name="overlap_seconds" inputmode="numeric">'
        '<button type="submit">Rotate client secret</button></form>'
    )
    delete = _form(
        f"/dashboard/oauth-apps/{client_id}/delete",
        csrf,
        "Delete this application",
        confirm="Delete this application? Its secrets and every token it holds stop working.",
        danger=True,
    )
    main = (
        once
        + f"<section>{_record(rows)}</section>"
        + f"<section><h2>Client secrets</h2>{secrets}{rotate}{delete}</section>"
        + _configuration(toml)
    )
    return layout(f"OAuth application {app['name']}", main, csrf=csrf)


def error_page(title: str, message: str, *, csrf: str | None = None) -> str:
    return layout(
        title, f'<section><p>{_e(message)}</p><a href="/dashboard">Back</a></section>', csrf=csrf
    )
