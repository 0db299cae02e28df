{{- /*
The rules config override the tainter reads (--rules.config-file): the values' thresholds
(the per-model overheat_policy included) and alert timing, in the shape of rules/config.yaml,
so the tainter's clear conditions follow the thresholds the PrometheusRule is rendered with.
The deprecated tainter.clearCelsius still sets the untaint temperature.
*/}}
{{- define "fleetwatch.rulesOverride" -}}
{{- $thresholds := deepCopy .Values.thresholds }}
{{- with .Values.tainter.clearCelsius }}
{{- $_ := set $thresholds "untaint_gpu_temperature_celsius" . }}
{{- end }}
{{- toYaml (dict "thresholds" $thresholds "alerts" .Values.alerts) }}
{{- end }}
