{{/* The chart's name, and the objects' name: the release's when it says "keyturn" already. */}}
{{- define "keyturn.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "keyturn.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* What selects keyturn's pods: stable across upgrades (a StatefulSet's selector is immutable). */}}
{{- define "keyturn.selectorLabels" -}}
app.kubernetes.io/name: {{ include "keyturn.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "keyturn.labels" -}}
{{ include "keyturn.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "keyturn.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "keyturn.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: the ServiceAccount keyturn runs as, when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The headless Service: the pods' metrics, and the StatefulSet's serviceName. */}}
{{- define "keyturn.metricsServiceName" -}}
{{- printf "%s-metrics" (include "keyturn.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "keyturn.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Where the chart mounts things in the pod. */}}
{{- define "keyturn.configDir" -}}/etc/keyturn{{- end -}}
{{- define "keyturn.approleDir" -}}/etc/keyturn-approle{{- end -}}
{{- define "keyturn.tlsDir" -}}/etc/keyturn-tls{{- end -}}

{{/* HTTPS on the metrics port: metrics.webConfig has a tls_server_config. */}}
{{- define "keyturn.metricsScheme" -}}
{{- if (.Values.metrics.webConfig).tls_server_config -}}HTTPS{{- else -}}HTTP{{- end -}}
{{- end -}}

{{/*
keyturn.toml from TOML's building blocks. Helm reads every number of the values as a float,
so a whole number is written as an integer (keyturn's integer keys refuse 64.0); strings are
JSON's quoted strings, which are TOML's basic strings; a map in a table is an inline table.
*/}}
{{- define "keyturn.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{ . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- end -}}

{{- define "keyturn.toml.value" -}}
{{- $value := . -}}
{{- if kindIs "string" $value -}}
{{- toJson $value -}}
{{- else if kindIs "bool" $value -}}
{{- $value -}}
{{- else if or (kindIs "float64" $value) (kindIs "int64" $value) (kindIs "int" $value) -}}
{{- if eq (float64 (int64 $value)) (float64 $value) -}}{{ int64 $value }}{{- else -}}{{ $value }}{{- end -}}
{{- else if kindIs "slice" $value -}}
[{{- range $index, $item := $value -}}{{- if $index -}}, {{ end -}}{{- include "keyturn.toml.value" $item -}}{{- end -}}]
{{- else if kindIs "map" $value -}}
{{- $pairs := list -}}
{{- range $key := keys $value | sortAlpha -}}
{{- $pairs = append $pairs (printf "%s = %s" (include "keyturn.toml.key" $key) (include "keyturn.toml.value" (get $value $key))) -}}
{{- end -}}
{{- if $pairs -}}{ {{ join ", " $pairs }} }{{- else -}}{}{{- end -}}
{{- else -}}
{{- fail (printf "config: a value TOML cannot hold: %v" $value) -}}
{{- end -}}
{{- end -}}

{{/* The key = value lines of one table, its name first (keys set to null are left out). */}}
{{- define "keyturn.toml.lines" -}}
{{- $keys := keys . | sortAlpha -}}
{{- if has "name" $keys -}}{{- $keys = prepend (without $keys "name") "name" -}}{{- end -}}
{{- range $key := $keys -}}
{{- $value := get $ $key -}}
{{- if not (kindIs "invalid" $value) }}
{{ include "keyturn.toml.key" $key }} = {{ include "keyturn.toml.value" $value }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* [vault] from vault.* and config.vault. */}}
{{- define "keyturn.vaultTable" -}}
{{- $vault := .Values.vault -}}
{{- $auth := dict "method" $vault.auth.method -}}
{{- if eq $vault.auth.method "kubernetes" -}}
{{- $_ := set $auth "role" $vault.auth.kubernetes.role -}}
{{- $_ := set $auth "mount" $vault.auth.kubernetes.mount -}}
{{- else if eq $vault.auth.method "approle" -}}
{{- $approle := $vault.auth.approle -}}
{{- $_ := required "vault.auth.approle.secretName: the Secret with the AppRole's role_id and secret_id, with vault.auth.method approle" $approle.secretName -}}
{{- $_ := set $auth "role_id" (printf "file:%s/%s" (include "keyturn.approleDir" .) $approle.roleIdKey) -}}
{{- $_ := set $auth "secret_id" (printf "file:%s/%s" (include "keyturn.approleDir" .) $approle.secretIdKey) -}}
{{- $_ := set $auth "mount" $approle.mount -}}
{{- else if eq $vault.auth.method "token_file" -}}
{{- $_ := set $auth "path" (required "vault.auth.tokenFile.path: the token file, with vault.auth.method token_file" $vault.auth.tokenFile.path) -}}
{{- end -}}
{{- $table := dict "address" $vault.address "mount" $vault.mount "auth" $auth -}}
{{- if $vault.namespace -}}{{- $_ := set $table "namespace" $vault.namespace -}}{{- end -}}
{{- if $vault.caCert -}}{{- $_ := set $table "ca_cert" $vault.caCert -}}{{- end -}}
{{- include "keyturn.toml.lines" (merge $table .Values.config.vault) -}}
{{- end -}}

{{/* [metrics]: the pod's address, and web.yml when metrics.webConfig is set. */}}
{{- define "keyturn.metricsTable" -}}
{{- $table := dict "listen" (printf "0.0.0.0:%d" (int64 .Values.metrics.port)) -}}
{{- if .Values.metrics.webConfig -}}
{{- $_ := set $table "web_config" (printf "%s/web.yml" (include "keyturn.configDir" .)) -}}
{{- $_ := set $table "open_paths" (list "/healthz" "/readyz") -}}
{{- end -}}
{{- include "keyturn.toml.lines" (merge $table .Values.config.metrics) -}}
{{- end -}}

{{- define "keyturn.toml" -}}
{{- if .Values.config.file -}}
{{ .Values.config.file }}
{{- else -}}
# Written by the chart from its values (config.*, vault.*, metrics.*). instance_id: each pod's
# name, from KEYTURN_KEYTURN_INSTANCE_ID.
[keyturn]
{{- include "keyturn.toml.lines" (omit .Values.config.keyturn "instance_id") }}

[vault]
{{- include "keyturn.vaultTable" . }}

[metrics]
{{- include "keyturn.metricsTable" . }}
{{- range $section := list "providers" "rotators" "credentials" "alerts" }}
{{- range $entry := index $.Values.config $section }}

[[{{ $section }}]]
{{- include "keyturn.toml.lines" $entry }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}
