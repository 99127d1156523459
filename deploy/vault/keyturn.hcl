# Vault / OpenBao policy for keyturn, for the default layout:
#   KV v2 mount "secret" ([vault] mount), inputs under keyturn/inputs/, private state under
#   keyturn/state/ ([keyturn] state_prefix), every publish_to under apps/.
# With another mount, state_prefix or publish_to prefix, change the paths below to match;
# `keyturn check -c FILE` then names every path whose capabilities fall short.
#
#   bao policy write keyturn deploy/vault/keyturn.hcl     (or: vault policy write …)
#
# It grants exactly what keyturn uses (src/keyturn/commands/check.py, required_capabilities,
# and the mount check of src/keyturn/vault/mounts.py), and nothing else: no delete, no sudo,
# two lists (the state prefix's names, the published folders' metadata), nothing outside
# these paths.
# docs: deploy/vault/README.md, docs/vault.md.

# The inputs keyturn reads through `vault:` references: client ids and secrets, a rotator's
# admin token, alert hooks' URLs and routing keys. Read only: people (or their pipeline) put
# them there; keyturn never writes them.
path "secret/data/keyturn/inputs/*" {
  capabilities = ["read"]
}

# keyturn's private state, one record per credential: refresh token, current and pending
# keys, the rotation journal, the lease that lets one instance at a time work on a
# credential. No app's policy may grant anything here.
path "secret/data/keyturn/state/*" {
  capabilities = ["create", "update", "read"]
}

# The names of those records, listed once when the daemon starts, so that a credential with
# no record yet is created without a read first (without it every first run reads).
path "secret/metadata/keyturn/state/" {
  capabilities = ["list"]
}

# What apps read (each credential's publish_to). keyturn writes new versions with
# check-and-set and reads the current one to plan its next refresh.
path "secret/data/apps/*" {
  capabilities = ["create", "update", "read"]
}

# The same paths' KV metadata: keyturn writes custom_metadata (managed-by, credential,
# writer; only when it changes) and reads the version history to spot writes and deletions made by
# someone else.
path "secret/metadata/apps/*" {
  capabilities = ["create", "update", "read"]
}

# The folders of those paths, listed with each key's metadata (OpenBao's `detailed-metadata`
# LIST) by the same sweep: one call for up to 500 published paths instead of a read each.
# Without it (or on HashiCorp Vault, which has no such endpoint) the sweep reads path by path.
path "secret/detailed-metadata/apps/*" {
  capabilities = ["list"]
}

# keyturn's own token: look it up, renew it, and ask which capabilities it has
# (`keyturn check`). The built-in `default` policy grants the same; they are repeated here
# so that keyturn also works with a token that carries only this policy
# (token_no_default_policy=true on its AppRole or Kubernetes role).
path "auth/token/lookup-self" {
  capabilities = ["read"]
}

path "auth/token/renew-self" {
  capabilities = ["update"]
}

path "sys/capabilities-self" {
  capabilities = ["update"]
}

# What is mounted at "secret" (type kv, options.version 2): `keyturn check` and the daemon's
# start read it and refuse a missing or KV version 1 mount before anything is written there.
# Vault and OpenBao also answer this read for any token holding a capability under the mount.
path "sys/internal/ui/mounts/secret" {
  capabilities = ["read"]
}
