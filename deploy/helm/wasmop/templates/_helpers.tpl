{{/*
The names of the chart's objects: the release name when it contains "wasmop" (so
`helm install wasmop` makes the same names as `kubectl apply -k deploy/`), else
<release>-wasmop; at most 63 characters.
*/}}
{{- define "wasmop.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The labels of every object: deploy/kustomization.yaml's, then Helm's. */}}
{{- define "wasmop.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/part-of: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The host's pods: the Deployment's selector, the Service's, the NetworkPolicy's. */}}
{{- define "wasmop.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/component: host
{{- end -}}

{{/* The host image: by digest when one is set, else by tag (default: appVersion). */}}
{{- define "wasmop.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* The Secret with the webhook's serving certificate. */}}
{{- define "wasmop.webhookSecret" -}}
{{- .Values.webhook.tls.secretName | default (printf "%s-webhook-tls" (include "wasmop.fullname" .)) -}}
{{- end -}}

{{/* A name of deploy/components/metacontroller (list FULLNAME NAME): `wasmop-x` as FULLNAME-x. */}}
{{- define "wasmop.metacontrollerName" -}}
{{- $name := index . 1 -}}
{{- if hasPrefix "wasmop-" $name -}}
{{- printf "%s-%s" (index . 0) (trimPrefix "wasmop-" $name) | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name -}}
{{- end -}}
{{- end -}}
