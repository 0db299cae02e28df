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
