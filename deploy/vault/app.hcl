# Vault / OpenBao policy for ONE consuming app: read the one path keyturn publishes for it.
#
# A template: replace APP_PATH with the credential's publish_to (relative to the KV mount),
# write one policy per app, and attach it to that app's auth role only. For example, for
# publish_to = "apps/reporting/acme":
#
#   sed 's|APP_PATH|apps/reporting/acme|' deploy/vault/app.hcl | bao policy write app-reporting -
#
# An app that uses several credentials gets one `path` block per publish_to (repeat the block
# below). Never use a wildcard here: `apps/*` would let every app read every other app's
# token, and nothing may ever grant a path under keyturn/ (the inputs and keyturn's private
# state: client secrets, refresh tokens, pending keys).
#
# A KV v2 read of the data path returns the custom_metadata too (managed-by, credential,
# writer; expires_at is in the data), so the app needs nothing on secret/metadata/. It needs no list,
# create, update or delete either: keyturn alone writes the path.
# docs: deploy/vault/README.md, docs/vault.md.

path "secret/data/APP_PATH" {
  capabilities = ["read"]
}
