"""Audit entries recorded from a real OpenBao (v2.7.2) `file` audit device, verbatim.

The unit tests of keyturn.usage parse these, and `keyturn_devkit.dev.audit` builds its
synthetic entries in their shape. `json.dumps(entry, separators=(",", ":"))` gives back the
exact line OpenBao wrote (Go's encoder writes compact JSON in this key order). The secret
values are HMAC'd as in every default audit log; the identities are throwaway dev-server ones.

How they were made: `bao server -dev` with a file audit device; a KV v2 value written twice
at `secret/apps/app1/acme` by the root token; an AppRole `app1` with a policy allowing
`read` on `secret/data/apps/app1/acme`, logged in and reading it (version 2), then trying
`secret/data/keyturn/state/app1` (refused); a token created with `display_name=ci-runner`
reading the value; the root token reading its metadata and writing version 3.
"""

# ruff: noqa: E501

from __future__ import annotations

from typing import Any

APPROLE_READ_REQUEST: dict[str, Any] = {
    "time": "2026-11-24T01:27:08.54566651Z",
    "type": "request",
    "auth": {
        "client_token": "hmac-sha256:14e078c4608ec0d6bfd22c626d6cdefb9fd5aaeca30d5c4d9bd0a0a1230fa407",
        "accessor": "hmac-sha256:558f7d3fcef93b1e9d1d6ac0347f6016ac4b54853f99c4f5873d7af751a69f73",
        "display_name": "approle",
        "policies": ["app1", "default"],
        "token_policies": ["app1", "default"],
        "policy_results": {
            "allowed": True,
            "granting_policies": [{"name": "app1", "namespace_id": "root", "type": "acl"}],
        },
        "metadata": {"role_name": "app1"},
        "entity_id": "1f3065db-51ab-3b1d-2597-9ba7ec575bb8",
        "token_type": "service",
        "token_ttl": 2764800,
        "token_issue_time": "2026-11-24T01:27:08Z",
    },
    "request": {
        "id": "1220b88b-d888-9199-dfe8-f94872df958b",
        "client_id": "1f3065db-51ab-3b1d-2597-9ba7ec575bb8",
        "operation": "read",
        "mount_point": "secret/",
        "mount_type": "kv",
        "mount_running_version": "v2.7.2+builtin.bao",
        "mount_class": "secret",
        "client_token": "hmac-sha256:14e078c4608ec0d6bfd22c626d6cdefb9fd5aaeca30d5c4d9bd0a0a1230fa407",
        "client_token_accessor": "hmac-sha256:558f7d3fcef93b1e9d1d6ac0347f6016ac4b54853f99c4f5873d7af751a69f73",
        "namespace": {"id": "root"},
        "path": "secret/data/apps/app1/acme",
        "remote_address": "127.0.0.1",
        "remote_port": 50200,
    },
}

APPROLE_READ_RESPONSE: dict[str, Any] = {
    "time": "2026-11-24T01:27:08.545920166Z",
    "type": "response",
    "auth": {
        "client_token": "hmac-sha256:14e078c4608ec0d6bfd22c626d6cdefb9fd5aaeca30d5c4d9bd0a0a1230fa407",
        "accessor": "hmac-sha256:558f7d3fcef93b1e9d1d6ac0347f6016ac4b54853f99c4f5873d7af751a69f73",
        "display_name": "approle",
        "policies": ["app1", "default"],
        "token_policies": ["app1", "default"],
        "policy_results": {
            "allowed": True,
            "granting_policies": [{"name": "app1", "namespace_id": "root", "type": "acl"}],
        },
        "metadata": {"role_name": "app1"},
        "entity_id": "1f3065db-51ab-3b1d-2597-9ba7ec575bb8",
        "token_type": "service",
        "token_ttl": 2764800,
        "token_issue_time": "2026-11-24T01:27:08Z",
    },
    "request": {
        "id": "1220b88b-d888-9199-dfe8-f94872df958b",
        "client_id": "1f3065db-51ab-3b1d-2597-9ba7ec575bb8",
        "operation": "read",
        "mount_point": "secret/",
        "mount_type": "kv",
        "mount_accessor": "kv_d057b241",
        "mount_running_version": "v2.7.2+builtin.bao",
        "mount_class": "secret",
        "client_token": "hmac-sha256:14e078c4608ec0d6bfd22c626d6cdefb9fd5aaeca30d5c4d9bd0a0a1230fa407",
        "client_token_accessor": "hmac-sha256:558f7d3fcef93b1e9d1d6ac0347f6016ac4b54853f99c4f5873d7af751a69f73",
        "namespace": {"id": "root"},
        "path": "secret/data/apps/app1/acme",
        "remote_address": "127.0.0.1",
        "remote_port": 50200,
    },
    "response": {
        "mount_point": "secret/",
        "mount_type": "kv",
        "mount_accessor": "kv_d057b241",
        "mount_running_plugin_version": "v2.7.2+builtin.bao",
        "mount_class": "secret",
        "data": {
            "data": {
                "api_key": "hmac-sha256:2641af2277dc4b216e2a61dffdeb2af3edb05beb1c94a4758fb6fc6be5cec33c",
                "authorization": "hmac-sha256:5ee421b0feced7f3d73c98b2209b531a5f38fa9e87a799dbd5b0c8246ef95eec",
            },
            "metadata": {
                "created_time": "2026-11-24T01:27:08.52653752Z",
                "custom_metadata": None,
                "deletion_time": "hmac-sha256:6876934d223b82039c73358285f7db34ff5223530d9c14f5625bb1a64c40f937",
                "destroyed": False,
                "version": 2,
            },
        },
    },
}

DENIED_STATE_READ_RESPONSE: dict[str, Any] = {
    "time": "2026-11-24T01:27:08.549397095Z",
    "type": "response",
    "auth": {
        "client_token": "hmac-sha256:14e078c4608ec0d6bfd22c626d6cdefb9fd5aaeca30d5c4d9bd0a0a1230fa407",
        "accessor": "hmac-sha256:558f7d3fcef93b1e9d1d6ac0347f6016ac4b54853f99c4f5873d7af751a69f73",
        "display_name": "approle",
        "policies": ["app1", "default"],
        "token_policies": ["app1", "default"],
        "policy_results": {"allowed": False},
        "metadata": {"role_name": "app1"},
        "entity_id": "1f3065db-51ab-3b1d-2597-9ba7ec575bb8",
        "token_type": "service",
        "token_ttl": 2764800,
        "token_issue_time": "2026-11-24T01:27:08Z",
    },
    "request": {
        "id": "3b758c2a-7551-d1a9-b36a-61de27dda093",
        "client_id": "1f3065db-51ab-3b1d-2597-9ba7ec575bb8",
        "operation": "read",
        "mount_point": "secret/",
        "mount_type": "kv",
        "mount_running_version": "v2.7.2+builtin.bao",
        "mount_class": "secret",
        "client_token": "hmac-sha256:14e078c4608ec0d6bfd22c626d6cdefb9fd5aaeca30d5c4d9bd0a0a1230fa407",
        "client_token_accessor": "hmac-sha256:558f7d3fcef93b1e9d1d6ac0347f6016ac4b54853f99c4f5873d7af751a69f73",
        "namespace": {"id": "root"},
        "path": "secret/data/keyturn/state/app1",
        "remote_address": "127.0.0.1",
        "remote_port": 50200,
    },
    "response": {
        "mount_point": "secret/",
        "mount_type": "kv",
        "mount_running_plugin_version": "v2.7.2+builtin.bao",
        "mount_class": "secret",
        "data": {
            "error": "hmac-sha256:8d2371260feab50a9110c988bbf278e0e58e62316ffb90566ed884450876f16d"
        },
    },
    "error": "1 error occurred:\n\t* permission denied\n\n",
}

TOKEN_READ_RESPONSE: dict[str, Any] = {
    "time": "2026-11-24T01:27:08.553866155Z",
    "type": "response",
    "auth": {
        "client_token": "hmac-sha256:df2b59458292ebc02db1d6b72f70c2915fe20317232cc72eb6538729047ec7f8",
        "accessor": "hmac-sha256:f1617b3ba49ffcc08f3fb915eb3c02f6cdb7efe42f64510851b35d8b0c494968",
        "display_name": "token-ci-runner",
        "policies": ["app1", "default"],
        "token_policies": ["app1", "default"],
        "policy_results": {
            "allowed": True,
            "granting_policies": [{"name": "app1", "namespace_id": "root", "type": "acl"}],
        },
        "metadata": {"team": "x"},
        "token_type": "service",
        "token_ttl": 2764800,
        "token_issue_time": "2026-11-24T01:27:08Z",
    },
    "request": {
        "id": "935e9b93-8a80-bb3f-c83a-ce628c8de19b",
        "client_id": "Ijj5CuPzwt/5yOfCSFYB2izQMeKMf/6RvhGiMZQ0JB4=",
        "operation": "read",
        "mount_point": "secret/",
        "mount_type": "kv",
        "mount_accessor": "kv_d057b241",
        "mount_running_version": "v2.7.2+builtin.bao",
        "mount_class": "secret",
        "client_token": "hmac-sha256:df2b59458292ebc02db1d6b72f70c2915fe20317232cc72eb6538729047ec7f8",
        "client_token_accessor": "hmac-sha256:f1617b3ba49ffcc08f3fb915eb3c02f6cdb7efe42f64510851b35d8b0c494968",
        "namespace": {"id": "root"},
        "path": "secret/data/apps/app1/acme",
        "remote_address": "127.0.0.1",
        "remote_port": 50208,
    },
    "response": {
        "mount_point": "secret/",
        "mount_type": "kv",
        "mount_accessor": "kv_d057b241",
        "mount_running_plugin_version": "v2.7.2+builtin.bao",
        "mount_class": "secret",
        "data": {
            "data": {
                "api_key": "hmac-sha256:2641af2277dc4b216e2a61dffdeb2af3edb05beb1c94a4758fb6fc6be5cec33c",
                "authorization": "hmac-sha256:5ee421b0feced7f3d73c98b2209b531a5f38fa9e87a799dbd5b0c8246ef95eec",
            },
            "metadata": {
                "created_time": "2026-11-24T01:27:08.52653752Z",
                "custom_metadata": None,
                "deletion_time": "hmac-sha256:6876934d223b82039c73358285f7db34ff5223530d9c14f5625bb1a64c40f937",
                "destroyed": False,
                "version": 2,
            },
        },
    },
}

METADATA_READ_RESPONSE: dict[str, Any] = {
    "time": "2026-11-24T01:27:08.555678924Z",
    "type": "response",
    "auth": {
        "client_token": "hmac-sha256:22541a69152693d35d02a2e59da42bd211f880453df703b43688129dc2d312e1",
        "accessor": "hmac-sha256:21e2602f3613d99fdc406588c9f0058a07201a989a44bc51326c0a854d98020b",
        "display_name": "token",
        "policies": ["root"],
        "token_policies": ["root"],
        "policy_results": {
            "allowed": True,
            "granting_policies": [{"name": "root", "namespace_id": "root", "type": "acl"}],
        },
        "token_type": "service",
        "token_issue_time": "2026-11-24T01:27:08Z",
    },
    "request": {
        "id": "7c5840af-f70d-fa27-45f0-de21edc036e7",
        "client_id": "0DHqvq2D77kL2/JTPSZkTMJbkFVmUu0TzMi0jiXcFy8=",
        "operation": "read",
        "mount_point": "secret/",
        "mount_type": "kv",
        "mount_accessor": "kv_d057b241",
        "mount_running_version": "v2.7.2+builtin.bao",
        "mount_class": "secret",
        "client_token": "hmac-sha256:22541a69152693d35d02a2e59da42bd211f880453df703b43688129dc2d312e1",
        "client_token_accessor": "hmac-sha256:21e2602f3613d99fdc406588c9f0058a07201a989a44bc51326c0a854d98020b",
        "namespace": {"id": "root"},
        "path": "secret/metadata/apps/app1/acme",
        "remote_address": "127.0.0.1",
        "remote_port": 50196,
    },
    "response": {
        "mount_point": "secret/",
        "mount_type": "kv",
        "mount_accessor": "kv_d057b241",
        "mount_running_plugin_version": "v2.7.2+builtin.bao",
        "mount_class": "secret",
        "data": {
            "cas_required": False,
            "created_time": "2026-11-24T01:27:08.521102269Z",
            "current_metadata_version": 0,
            "current_version": 2,
            "custom_metadata": None,
            "delete_version_after": "hmac-sha256:324d6a79dc4ad06d6bed36bd91f4edec517f287739e375aaf0003aadd59f160b",
            "max_versions": 0,
            "metadata_cas_required": False,
            "oldest_version": 0,
            "updated_time": "2026-11-24T01:27:08.52653752Z",
            "versions": {
                "1": {
                    "created_time": "2026-11-24T01:27:08.521102269Z",
                    "deletion_time": "hmac-sha256:6876934d223b82039c73358285f7db34ff5223530d9c14f5625bb1a64c40f937",
                    "destroyed": False,
                },
                "2": {
                    "created_time": "2026-11-24T01:27:08.52653752Z",
                    "deletion_time": "hmac-sha256:6876934d223b82039c73358285f7db34ff5223530d9c14f5625bb1a64c40f937",
                    "destroyed": False,
                },
            },
        },
    },
}

ROOT_WRITE_RESPONSE: dict[str, Any] = {
    "time": "2026-11-24T01:27:08.557375516Z",
    "type": "response",
    "auth": {
        "client_token": "hmac-sha256:22541a69152693d35d02a2e59da42bd211f880453df703b43688129dc2d312e1",
        "accessor": "hmac-sha256:21e2602f3613d99fdc406588c9f0058a07201a989a44bc51326c0a854d98020b",
        "display_name": "token",
        "policies": ["root"],
        "token_policies": ["root"],
        "policy_results": {
            "allowed": True,
            "granting_policies": [{"name": "root", "namespace_id": "root", "type": "acl"}],
        },
        "token_type": "service",
        "token_issue_time": "2026-11-24T01:27:08Z",
    },
    "request": {
        "id": "125a85cb-109b-decd-d50c-a2eec763aa6b",
        "client_id": "0DHqvq2D77kL2/JTPSZkTMJbkFVmUu0TzMi0jiXcFy8=",
        "operation": "update",
        "mount_point": "secret/",
        "mount_type": "kv",
        "mount_accessor": "kv_d057b241",
        "mount_running_version": "v2.7.2+builtin.bao",
        "mount_class": "secret",
        "client_token": "hmac-sha256:22541a69152693d35d02a2e59da42bd211f880453df703b43688129dc2d312e1",
        "client_token_accessor": "hmac-sha256:21e2602f3613d99fdc406588c9f0058a07201a989a44bc51326c0a854d98020b",
        "namespace": {"id": "root"},
        "path": "secret/data/apps/app1/acme",
        "data": {
            "data": {
                "api_key": "hmac-sha256:525a3c2aea13f4b7a4bd0a56ccc2d04152585d23cefb3c407209f88d95c0d37f"
            },
            "options": {},
        },
        "remote_address": "127.0.0.1",
        "remote_port": 50196,
    },
    "response": {
        "mount_point": "secret/",
        "mount_type": "kv",
        "mount_accessor": "kv_d057b241",
        "mount_running_plugin_version": "v2.7.2+builtin.bao",
        "mount_class": "secret",
        "data": {
            "created_time": "2026-11-24T01:27:08.557211618Z",
            "custom_metadata": None,
            "deletion_time": "hmac-sha256:6876934d223b82039c73358285f7db34ff5223530d9c14f5625bb1a64c40f937",
            "destroyed": False,
            "version": 3,
        },
    },
}
