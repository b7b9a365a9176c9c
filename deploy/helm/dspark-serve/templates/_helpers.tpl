{{/* The release's name for every object: <release>-dspark-serve, or the release name when it already says so. */}}
{{- define "dspark-serve.fullname" -}}
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

{{- define "dspark-serve.selectorLabels" -}}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dspark-serve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{ include "dspark-serve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "dspark-serve.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}

{{/* Engines are specific to a GPU architecture: one cache directory per GPU product (or "cpu"). */}}
{{- define "dspark-serve.cacheKey" -}}
{{- if eq (int .Values.gpu.count) 0 -}}cpu{{- else -}}{{ default "gpu" .Values.gpu.product }}{{- end -}}
{{- end -}}

{{/* preStop to SIGKILL: the preStop wait, the drain, tritonserver's own exit, and a margin. */}}
{{- define "dspark-serve.terminationGrace" -}}
{{- $drain := add (int .Values.serve.drainTimeoutSeconds) (int .Values.preStopSleepSeconds) -}}
{{- $grace := int .Values.terminationGracePeriodSeconds -}}
{{- if eq $grace 0 -}}
{{- add $drain (int .Values.serve.exitTimeoutSeconds) 15 -}}
{{- else if le $grace $drain -}}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed preStopSleepSeconds + serve.drainTimeoutSeconds (%d): Kubernetes would kill pods mid-drain" $grace $drain) -}}
{{- else -}}
{{- $grace -}}
{{- end -}}
{{- end -}}

{{/* `dspark serve`'s arguments (the command is `dspark`); SOURCE is passed as .source. */}}
{{- define "dspark-serve.args" -}}
{{- $v := .root.Values -}}
- serve
- {{ .source | quote }}
- --host
- 0.0.0.0
- --openai-port
- {{ $v.ports.openai | quote }}
- --http-port
- {{ $v.ports.http | quote }}
- --grpc-port
- {{ $v.ports.grpc | quote }}
- --metrics-port
- {{ $v.ports.metrics | quote }}
- --metrics-host
- 0.0.0.0
- --cache-dir
- {{ printf "%s/%s/%s" .cacheRoot $v.model.cacheSubdir (include "dspark-serve.cacheKey" .root) | quote }}
- --drain-timeout
- {{ $v.serve.drainTimeoutSeconds | quote }}
- --exit-timeout
- {{ $v.serve.exitTimeoutSeconds | quote }}
- --max-batch-size
- {{ $v.serve.maxBatchSize | quote }}
- --instances
- {{ $v.serve.instances | quote }}
{{- if $v.serve.maxQueue }}
- --max-queue
- {{ $v.serve.maxQueue | quote }}
{{- end }}
{{- if $v.serve.threads }}
- --threads
- {{ $v.serve.threads | quote }}
{{- end }}
{{- with $v.serve.runtime }}
- --runtime
- {{ . | quote }}
{{- end }}
{{- with $v.serve.device }}
- --device
- {{ . | quote }}
{{- end }}
{{- with $v.serve.topk }}
- --topk
- {{ . | quote }}
{{- end }}
{{- with $v.model.target }}
- --target
- {{ . | quote }}
{{- end }}
{{- with $v.model.servedModelName }}
- --served-model-name
- {{ . | quote }}
{{- end }}
{{- range $v.serve.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* Liveness: the process and its servers answer; readiness: the model is loaded and the pod is not draining. */}}
{{- define "dspark-serve.probes" -}}
{{- $p := .Values.probes -}}
startupProbe:
  httpGet:
    path: /health/live
    port: openai
  periodSeconds: {{ $p.startup.periodSeconds }}
  failureThreshold: {{ $p.startup.failureThreshold }}
livenessProbe:
  httpGet:
    path: /health/live
    port: openai
  periodSeconds: {{ $p.liveness.periodSeconds }}
  failureThreshold: {{ $p.liveness.failureThreshold }}
  timeoutSeconds: {{ $p.liveness.timeoutSeconds }}
readinessProbe:
  httpGet:
    path: /health/ready
    port: openai
  periodSeconds: {{ $p.readiness.periodSeconds }}
  failureThreshold: {{ $p.readiness.failureThreshold }}
  timeoutSeconds: {{ $p.readiness.timeoutSeconds }}
{{- end -}}

{{- define "dspark-serve.resources" -}}
{{- $r := deepCopy .Values.resources -}}
{{- if gt (int .Values.gpu.count) 0 -}}
{{- $limits := default (dict) $r.limits -}}
{{- $_ := set $limits "nvidia.com/gpu" (int .Values.gpu.count) -}}
{{- $_ := set $r "limits" $limits -}}
{{- end -}}
{{- toYaml $r -}}
{{- end -}}

{{- define "dspark-serve.nodeSelector" -}}
{{- $ns := deepCopy .Values.nodeSelector -}}
{{- if and (gt (int .Values.gpu.count) 0) .Values.gpu.product -}}
{{- $_ := set $ns "nvidia.com/gpu.product" .Values.gpu.product -}}
{{- end -}}
{{- if $ns -}}{{ toYaml $ns }}{{- end -}}
{{- end -}}
