{{/*
Model sources: how a card's weights get into its pool pods (`modelSources.<card>`).
One of: an existing PersistentVolumeClaim (mounted read-only), a hostPath (a node-local cache),
or `download` (an init container copies a URL or object-store path into an emptyDir or a
generic ephemeral volume). The volume is mounted at the source's mountPath and the pool gets
--checkpoint-root=<mountPath>; digests go to /etc/fastvideo3/checkpoint-digests.yaml.
*/}}

{{/* Cards whose weights ship inside the image: no model source needed. Kept equal to the
built-in registry's cards without diffusers_dir components (tests/unit/test_chart_models.py). */}}
{{- define "fastvideo3.selfContainedCards" -}}
wan-tiny wan-tiny-4step wan-tiny-seeded wan-tiny-fp8
{{- end -}}

{{- define "fastvideo3.modelMountPath" -}}
{{- .source.mountPath | default (printf "/models/%s" .card) -}}
{{- end -}}

{{/* The model source of a pool, or empty. Call with (dict "root" $ "pool" POOL). Returns the card name. */}}
{{- define "fastvideo3.poolModelCard" -}}
{{- $card := include "fastvideo3.poolCard" . -}}
{{- if hasKey (.root.Values.modelSources | default dict) $card -}}{{ $card }}{{- end -}}
{{- end -}}

{{/* Extra pool args: where to listen and advertise, the checkpoint root and digests. */}}
{{- define "fastvideo3.poolStartArgs" -}}
{{- $v := .root.Values -}}
- --host={{ $v.listenHost }}
- --advertise-host=$(POD_IP)
- --load-failure-hold={{ $v.loadFailureHoldSeconds }}
{{- with include "fastvideo3.poolModelCard" . }}
{{- $src := index $v.modelSources . }}
- --checkpoint-root={{ include "fastvideo3.modelMountPath" (dict "card" . "source" $src) }}
{{- if $src.digests }}
- --checkpoint-digests=/etc/fastvideo3/checkpoint-digests.yaml
{{- end }}
{{- end }}
{{- end -}}

{{- define "fastvideo3.modelVolumeMounts" -}}
{{- with include "fastvideo3.poolModelCard" . }}
{{- $src := index $.root.Values.modelSources . }}
- name: model
  mountPath: {{ include "fastvideo3.modelMountPath" (dict "card" . "source" $src) }}
  readOnly: true
  {{- with ($src.persistentVolumeClaim | default dict).subPath }}
  subPath: {{ . }}
  {{- end }}
{{- end }}
{{- end -}}

{{- define "fastvideo3.modelVolumes" -}}
{{- with include "fastvideo3.poolModelCard" . }}
{{- $src := index $.root.Values.modelSources . }}
- name: model
  {{- if $src.persistentVolumeClaim }}
  persistentVolumeClaim:
    claimName: {{ $src.persistentVolumeClaim.claimName }}
    readOnly: true
  {{- else if $src.hostPath }}
  hostPath:
    path: {{ $src.hostPath.path }}
    type: {{ $src.hostPath.type | default "Directory" }}
  {{- else if and $src.download.ephemeral $src.download.ephemeral.enabled }}
  ephemeral:
    volumeClaimTemplate:
      metadata:
        labels:
          {{- include "fastvideo3.labels" (dict "root" $.root "component" "model") | nindent 10 }}
      spec:
        accessModes: [ReadWriteOnce]
        {{- with $src.download.ephemeral.storageClassName }}
        storageClassName: {{ . }}
        {{- end }}
        resources:
          requests:
            storage: {{ $src.download.ephemeral.size }}
  {{- else }}
  emptyDir:
    {{- with $src.download.sizeLimit }}
    sizeLimit: {{ . }}
    {{- else }}
    {}
    {{- end }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* The copy command of a download source: the operator's, or one chosen by the URL's scheme. */}}
{{- define "fastvideo3.downloadCommand" -}}
{{- $d := .source.download -}}
{{- if $d.command -}}
{{- toYaml $d.command -}}
{{- else if hasPrefix "s3://" $d.url -}}
{{- toYaml (list "aws" "s3" "sync" "--only-show-errors" $d.url .dest) -}}
{{- else if hasPrefix "gs://" $d.url -}}
{{- toYaml (list "gcloud" "storage" "rsync" "--recursive" $d.url .dest) -}}
{{- else -}}
{{- toYaml (list "python" "-m" "fastvideo3.card.fetch" (printf "--url=%s" $d.url) (printf "--dest=%s" .dest) "--clean" (printf "--timeout=%v" ($d.timeoutSeconds | default 3600))) -}}
{{- end -}}
{{- end -}}

{{/* Init container of a download source. Call with (dict "root" $ "pool" POOL "image" POOL_IMAGE). */}}
{{- define "fastvideo3.modelInitContainers" -}}
{{- with include "fastvideo3.poolModelCard" . }}
{{- $src := index $.root.Values.modelSources . }}
{{- if $src.download }}
{{- $dest := include "fastvideo3.modelMountPath" (dict "card" . "source" $src) }}
- name: fetch-model
  image: {{ $src.download.image | default $.image | quote }}
  imagePullPolicy: {{ $.root.Values.image.pullPolicy }}
  command:
    {{- include "fastvideo3.downloadCommand" (dict "source" $src "dest" $dest) | nindent 4 }}
  {{- with $src.download.env }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  resources:
    {{- toYaml ($src.download.resources | default (dict "requests" (dict "cpu" "500m" "memory" "1Gi") "limits" (dict "cpu" "2" "memory" "4Gi"))) | nindent 4 }}
  securityContext:
    {{- toYaml $.root.Values.containerSecurityContext | nindent 4 }}
  terminationMessagePolicy: FallbackToLogsOnError
  volumeMounts:
    - {name: model, mountPath: {{ $dest }}}
{{- end }}
{{- end }}
{{- end -}}
