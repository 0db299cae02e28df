{{/* Name of the chart, or nameOverride. */}}
{{- define "fleetwatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-fleetwatch, or fullnameOverride; 63 characters at most (DNS label). */}}
{{- define "fleetwatch.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "fleetwatch.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "fleetwatch.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "fleetwatch.exporter.fullname" -}}
{{- printf "%s-exporter" (include "fleetwatch.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fleetwatch.tainter.fullname" -}}
{{- printf "%s-tainter" (include "fleetwatch.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The tainter's webhook token Secret: the user's, or the one this chart generates. */}}
{{- define "fleetwatch.tainter.tokenSecret" -}}
{{- default (printf "%s-token" (include "fleetwatch.tainter.fullname" .)) .Values.tainter.webhookToken.existingSecret }}
{{- end }}

{{/* The Secrets holding the tainter's Prometheus credentials, by the folder each is mounted
in under /etc/fleetwatch/prometheus (YAML: name: secret). */}}
{{- define "fleetwatch.tainter.prometheusSecrets" -}}
{{- $client := .Values.tainter.prometheusClient }}
{{- with $client.bearerToken.secret }}
token: {{ . }}
{{- end }}
{{- if $client.basicAuth.username }}
password: {{ required "tainter.prometheusClient.basicAuth.secret: the Secret holding the password" $client.basicAuth.secret }}
{{- end }}
{{- with $client.tls.caSecret }}
ca: {{ . }}
{{- end }}
{{- with $client.tls.clientCertSecret }}
client: {{ . }}
{{- end }}
{{- end }}

{{/* The breaker's --breaker.max-new-taints: the deprecated tainter.breaker.maxNodes when
set (0 included), else tainter.breaker.maxNewTaints. */}}
{{- define "fleetwatch.tainter.maxNewTaints" -}}
{{- $breaker := .Values.tainter.breaker }}
{{- if kindIs "invalid" $breaker.maxNodes }}{{ $breaker.maxNewTaints }}{{ else }}{{ $breaker.maxNodes }}{{ end }}
{{- end }}

{{/* repository:tag of one component's image: pass (list . .Values.exporter.image). */}}
{{- define "fleetwatch.image" -}}
{{- $image := index . 1 }}
{{- printf "%s:%s" $image.repository (default (index . 0).Chart.AppVersion $image.tag) }}
{{- end }}

{{/* Labels every resource carries. */}}
{{- define "fleetwatch.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "fleetwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fleetwatch
{{- end }}

{{/* Selector labels of one component ("exporter" or "tainter"): pass (list . "exporter"). */}}
{{- define "fleetwatch.selectorLabels" -}}
{{- $root := index . 0 }}
app.kubernetes.io/name: {{ include "fleetwatch.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* Flags every subcommand takes. */}}
{{- define "fleetwatch.logArgs" -}}
- --log.format={{ .Values.log.format }}
- --log.level={{ .Values.log.level }}
{{- end }}

{{/* The Secret holding COMPONENT's serving certificate (tls.crt, tls.key, ca.crt): the
user's, or <component fullname>-tls (what the chart's cert-manager Certificate writes).
Called with (list $ "exporter"|"tainter"). */}}
{{- define "fleetwatch.web.tlsSecret" -}}
{{- $root := index . 0 }}{{- $component := index . 1 }}
{{- $tls := (index $root.Values $component).web.tls }}
{{- default (printf "%s-tls" (include (printf "fleetwatch.%s.fullname" $component) $root)) $tls.secretName }}
{{- end }}

{{/* The exporter's basic auth users (user: bcrypt hash); the tainter has none in the chart:
its webhook keeps the bearer token, which basic auth cannot join (docs/tainter.md). */}}
{{- define "fleetwatch.web.users" -}}
{{- toYaml (dig "basicAuth" "users" (dict) (index .root.Values .component).web) }}
{{- end }}

{{/* "true" when COMPONENT serves under --web.config.file: TLS or basic auth on. */}}
{{- define "fleetwatch.web.enabled" -}}
{{- $web := (index .root.Values .component).web }}
{{- if or $web.tls.enabled (dig "basicAuth" "users" (dict) $web) }}true{{ end }}
{{- end }}

{{/* COMPONENT's --web.config.file argument, when it has a web config. Called with a dict
of root and component, as the web helpers below. */}}
{{- define "fleetwatch.web.args" -}}
{{- if include "fleetwatch.web.enabled" . }}
- --web.config.file=/etc/fleetwatch/web/web-config.yml
{{- end }}
{{- end }}

{{/* The probe handler of COMPONENT on PORT for PATH: HTTPS when web TLS is on; a TCP
connect with mutual TLS or basic auth (a kubelet probe presents no client certificate and
no password, and exporter-toolkit guards every path: docs/deploy.md); plain HTTP otherwise.
Called with a dict of root, component, port, path. */}}
{{- define "fleetwatch.web.probe" -}}
{{- $tls := (index .root.Values .component).web.tls }}
{{- $users := dig "basicAuth" "users" (dict) (index .root.Values .component).web }}
{{- if or (and $tls.enabled $tls.clientAuth) $users }}
tcpSocket:
  port: {{ .port }}
{{- else }}
httpGet:
  path: {{ .path }}
  port: {{ .port }}
  {{- if $tls.enabled }}
  scheme: HTTPS
  {{- end }}
{{- end }}
{{- end }}

{{/* The volume mounts of COMPONENT's web config and certificate. */}}
{{- define "fleetwatch.web.volumeMounts" -}}
{{- if include "fleetwatch.web.enabled" . }}
- name: web-config
  mountPath: /etc/fleetwatch/web
  readOnly: true
{{- end }}
{{- if (index .root.Values .component).web.tls.enabled }}
- name: web-tls
  mountPath: /etc/fleetwatch/web-tls
  readOnly: true
{{- end }}
{{- end }}

{{/* The volumes of COMPONENT's web config (a Secret: it may hold bcrypt hashes) and
certificate (its Secret). */}}
{{- define "fleetwatch.web.volumes" -}}
{{- if include "fleetwatch.web.enabled" . }}
- name: web-config
  secret:
    secretName: {{ include (printf "fleetwatch.%s.fullname" .component) .root }}-web-config
{{- end }}
{{- if (index .root.Values .component).web.tls.enabled }}
- name: web-tls
  secret:
    secretName: {{ include "fleetwatch.web.tlsSecret" (list .root .component) }}
{{- end }}
{{- end }}

{{/* "true" when the tainter runs GPU reset Jobs: gpu-reset opted in and not as a reboot. */}}
{{- define "fleetwatch.tainter.resetJobs" -}}
{{- $repair := .Values.tainter.repair -}}
{{- if and (has "gpu-reset" $repair.kinds) (not $repair.resetByReboot) (ne $repair.mode "off") -}}
true
{{- end -}}
{{- end -}}
