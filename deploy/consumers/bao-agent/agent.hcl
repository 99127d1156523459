# OpenBao Agent for ONE app on ONE host: renders the credential keyturn publishes for the app
# into two files and tells the app when they change. HashiCorp Vault Agent reads the same file
# (`vault agent -config=agent.hcl`). Run it as its own user under systemd (Restart=always):
#
#   bao agent -config=/etc/keyturn-agent/agent.hcl
#
# Read deploy/consumers/README.md first: static_secret_render_interval must follow from the
# token's lifetime. tests/integration/test_consumer_bao_agent.py runs this file, with its
# paths, address and reload command replaced by the test's own.

pid_file = "/run/keyturn-agent/agent.pid"

vault {
  address = "https://vault.example.com:8200"
  ca_cert = "/etc/keyturn-agent/vault-ca.pem"
}

# The agent logs in as the app: an AppRole whose only policy (besides `default`) is the app's
# instance of deploy/vault/app.hcl, i.e. `read` on secret/data/apps/reporting/acme.
auto_auth {
  method "approle" {
    mount_path = "auth/approle"
    config = {
      role_id_file_path                   = "/etc/keyturn-agent/role_id"
      secret_id_file_path                 = "/etc/keyturn-agent/secret_id"
      remove_secret_id_file_after_reading = false
    }
  }
}

template_config {
  # KV v2 values have no lease: the agent reads them again every interval (in fact after 85
  # to 95 % of it), so a rendered file lags Vault by up to this long. keyturn's new value is
  # in Vault at least 0.24 x lifetime before the old one expires (refresh.at + jitter =
  # 0.76); keep the interval at most half of that, 0.12 x lifetime, in whole seconds, and
  # not under 2s (under 2s the agent can skip a change for one more interval).
  # 5m: for access tokens of 1 h (or longer).
  static_secret_render_interval = "5m"
  exit_on_retry_failure         = true
}

# For an app that reads a file: the header value and the times, in JSON. Apps re-read it
# (at refresh_at, on a 401/403); no signal needed.
template {
  source               = "/etc/keyturn-agent/credential.json.ctmpl"
  destination          = "/run/myapp/credential.json"
  perms                = "0640"
  backup               = false
  error_on_missing_key = true
}

# For an app configured by environment variables: KEYTURN_AUTHORIZATION="Bearer ..." and the
# times. It must be told to read them again; `exec` runs only when the rendered file changed.
template {
  source               = "/etc/keyturn-agent/app.env.ctmpl"
  destination          = "/run/myapp/app.env"
  perms                = "0640"
  backup               = false
  error_on_missing_key = true
  exec {
    command = ["systemctl", "reload", "myapp.service"]
    timeout = "30s"
  }
}
