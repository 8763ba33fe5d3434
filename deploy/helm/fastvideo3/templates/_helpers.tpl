{{/* Names, labels and shared snippets of the fastvideo3 chart. */}}

{{/* The four role pools, in data-flow order. The only keys accepted under `pools`. */}}
{{- define "fastvideo3.roles" -}}
encoder denoiser decoder reward
{{- end -}}

{{- define "fastvideo3.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object-name prefix: <release>-<chart>, or the release name when it already holds it. */}}
{{- define "fastvideo3.fullname" -}}
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

{{/* Name of one component's objects. Call with (dict "root" $ "component" "denoiser"). */}}
{{- define "fastvideo3.componentName" -}}
{{- printf "%s-%s" (include "fastvideo3.fullname" .root | trunc 50 | trimSuffix "-") .component -}}
{{- end -}}

{{- define "fastvideo3.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels. Call with (dict "root" $ "component" NAME). Never change these on upgrade. */}}
{{- define "fastvideo3.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fastvideo3.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* All labels. Call with (dict "root" $ "component" NAME). */}}
{{- define "fastvideo3.labels" -}}
helm.sh/chart: {{ include "fastvideo3.chart" .root }}
{{ include "fastvideo3.selectorLabels" . }}
app.kubernetes.io/part-of: fastvideo3
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{/* Image of a role. Call with (dict "root" $ "role" ROLE "image" COMPONENT_IMAGE_VALUES). */}}
{{- define "fastvideo3.image" -}}
{{- $override := .image | default dict -}}
{{- $tag := $override.tag | default .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- if $override.repository -}}
{{- printf "%s:%s" $override.repository $tag -}}
{{- else -}}
{{- printf "%s-%s:%s" .root.Values.image.repository .role $tag -}}
{{- end -}}
{{- end -}}

{{/* In-cluster address host:port of a component's Service. Call with (dict "root" $ "component" NAME "port" P). */}}
{{- define "fastvideo3.address" -}}
{{- printf "%s.%s.svc.%s:%v" (include "fastvideo3.componentName" .) .root.Release.Namespace .root.Values.clusterDomain .port -}}
{{- end -}}

{{/* Card a pool serves. Call with (dict "root" $ "pool" POOL_VALUES). */}}
{{- define "fastvideo3.poolCard" -}}
{{- .pool.card | default .root.Values.card -}}
{{- end -}}

{{/* "redis" | "external" | "memory": where the scheduler checkpoints LoopState. */}}
{{- define "fastvideo3.stateStoreKind" -}}
{{- if .Values.redis.enabled -}}redis
{{- else if or .Values.redis.externalUrl .Values.redis.externalUrlSecret.name -}}external
{{- else -}}memory
{{- end -}}
{{- end -}}

{{/* Env var FASTVIDEO3_STATE_STORE for the scheduler; empty for the in-memory store. */}}
{{- define "fastvideo3.stateStoreEnv" -}}
{{- $kind := include "fastvideo3.stateStoreKind" . -}}
{{- if eq $kind "redis" }}
- name: FASTVIDEO3_STATE_STORE
  value: {{ printf "redis://%s:%v/%v" (include "fastvideo3.componentName" (dict "root" . "component" "redis")) .Values.redis.port .Values.redis.db | quote }}
{{- else if and (eq $kind "external") .Values.redis.externalUrlSecret.name }}
- name: FASTVIDEO3_STATE_STORE
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.externalUrlSecret.name }}
      key: {{ .Values.redis.externalUrlSecret.key }}
{{- else if eq $kind "external" }}
- name: FASTVIDEO3_STATE_STORE
  value: {{ .Values.redis.externalUrl | quote }}
{{- end }}
{{- end -}}

{{/* Native gRPC startup/readiness/liveness probes on a port. Call with (dict "root" $ "port" P). */}}
{{- define "fastvideo3.grpcProbes" -}}
{{- $p := .root.Values.probes -}}
startupProbe:
  grpc: {port: {{ .port }}}
  periodSeconds: {{ $p.startup.periodSeconds }}
  failureThreshold: {{ $p.startup.failureThreshold }}
  timeoutSeconds: {{ $p.startup.timeoutSeconds }}
readinessProbe:
  grpc: {port: {{ .port }}}
  periodSeconds: {{ $p.readiness.periodSeconds }}
  failureThreshold: {{ $p.readiness.failureThreshold }}
  timeoutSeconds: {{ $p.readiness.timeoutSeconds }}
livenessProbe:
  grpc: {port: {{ .port }}}
  periodSeconds: {{ $p.liveness.periodSeconds }}
  failureThreshold: {{ $p.liveness.failureThreshold }}
  timeoutSeconds: {{ $p.liveness.timeoutSeconds }}
{{- end -}}

{{/* Pod annotations of a fleet pod: config checksum, Prometheus scrape hints, user's. */}}
{{- define "fastvideo3.podAnnotations" -}}
checksum/config: {{ include (print .root.Template.BasePath "/configmap.yaml") .root | sha256sum }}
{{- if .root.Values.metrics.scrapeAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .root.Values.metrics.port | quote }}
prometheus.io/path: {{ .root.Values.metrics.path | quote }}
{{- end }}
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* nodeSelector / tolerations / affinity of a component. Call with the component's values. */}}
{{- define "fastvideo3.placement" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "fastvideo3.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
Degree of a parallel plan ("cfg2xulysses2" -> 4; "" or "single" -> 1).
*/}}
{{- define "fastvideo3.planDegree" -}}
{{- $degree := 1 -}}
{{- if and . (ne . "single") -}}
{{- range $factor := splitList "x" . -}}
{{- $degree = mul $degree (atoi (regexReplaceAll "^[a-z]+" $factor "")) -}}
{{- end -}}
{{- end -}}
{{- $degree -}}
{{- end -}}
