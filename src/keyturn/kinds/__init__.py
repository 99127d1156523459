"""One module per credential kind: the tasks its job runs, what its rotation replaces (its
`RotationTarget`), and what apps read.

- `api_key` (`keyturn.kinds.api_key`): rotation, and `republish` (forced only).
- `oauth_client` (`keyturn.kinds.oauth_client`): the token refresh, then a client-secret
  rotation when `rotation` is configured.

Each module has one `job(credential, client, rotator, inputs, deps)`. Adding a kind is one
new module here plus one `case` in `keyturn.jobs.build.build_job`.
"""
