{{/*
Where each exporter collector runs: a map of collector name to "main", "admin" or "off".

The main container holds no privilege. The admin container (gpuProfilingAdminOnly) runs
as root and holds only what its collectors' sources need: gpm and mig (GPM samples, also
per MIG instance, under the driver's profiling restriction: profilingCapability), podresources (the kubelet's socket admits only root)
and, with kernelLog, xid (CAP_SYSLOG for /dev/kmsg; NVML events and the kernel log in one
process, so each Xid is counted once). docs/deploy.md names each privilege with its source.
*/}}
{{- define "fleetwatch.exporter.placement" -}}
{{- $exporter := .Values.exporter }}
{{- $adminOnly := $exporter.gpuProfilingAdminOnly }}
{{- /* The exporter's collectors; values.schema.json lists the same names. */}}
{{- range $name := list "gpu" "pci" "gpm" "mig" "nvlink" "xid" "podresources" "slurmjobs" "infiniband" "storage" }}
{{- $where := "main" }}
{{- if not (dig $name true $exporter.collectors) }}
{{- $where = "off" }}
{{- else if eq $name "slurmjobs" }}
{{- /* Slurm's job mapping: a Kubernetes node has pods, not Slurm jobs (docs/slurm.md). */}}
{{- $where = "off" }}
{{- else if or (eq $name "gpm") (eq $name "mig") }}
{{- $where = ternary "admin" "main" $adminOnly }}
{{- else if eq $name "podresources" }}
{{- $where = ternary "admin" "off" (and $adminOnly $exporter.podResources.enabled) }}
{{- else if and (eq $name "xid") $adminOnly $exporter.kernelLog.enabled }}
{{- $where = "admin" }}
{{- end }}
{{ $name }}: {{ $where | quote }}
{{- end }}
{{- end }}

{{/* "true" when the podresources collector runs with DRA attribution (its ServiceAccount,
RBAC and token), else "". */}}
{{- define "fleetwatch.exporter.dra" -}}
{{- $placement := include "fleetwatch.exporter.placement" . | fromYaml }}
{{- if and (ne (get $placement "podresources") "off") (ne .Values.exporter.podResources.dra "off") }}true{{ end }}
{{- end }}

{{/* "true" when the admin container runs at least one collector, else "". */}}
{{- define "fleetwatch.exporter.hasAdmin" -}}
{{- $placement := include "fleetwatch.exporter.placement" . | fromYaml }}
{{- range $name, $where := $placement }}
{{- if eq $where "admin" }}true{{ break }}{{ end }}
{{- end }}
{{- end }}

{{/* The metrics ports of the exporter pod: name and number, one per container. */}}
{{- define "fleetwatch.exporter.ports" -}}
- name: metrics
  port: {{ .Values.exporter.port }}
{{- if include "fleetwatch.exporter.hasAdmin" . }}
- name: metrics-admin
  port: {{ .Values.exporter.admin.port }}
{{- end }}
{{- end }}
