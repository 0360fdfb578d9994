{{/* Chart name, truncated to fit label values. */}}
{{- define "rio.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "<release>-<chart>" unless the release name already contains the chart name. */}}
{{- define "rio.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rio.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rio.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "rio.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "rio.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rocm-inference
{{- end }}

{{- define "rio.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rio.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rio.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "rio.peeringName" -}}
{{- default (include "rio.fullname" .) .Values.ha.peeringName }}
{{- end }}

{{/* The namespaces a namespaced install watches, as a JSON list (the release's by default). */}}
{{- define "rio.namespaces" -}}
{{- if .Values.watch.namespaces }}
{{- toJson .Values.watch.namespaces }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/* RBAC rules kept as plain YAML in files/rbac/ (checked against the operator's API calls by tests). */}}
{{- define "rio.rules" -}}
{{- $root := index . 0 }}
{{- range $file := index . 1 }}
{{ $root.Files.Get (printf "files/rbac/%s.yaml" $file) }}
{{- end }}
{{- end }}

{{- define "rio.activatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "rio.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: activator
{{- end }}

{{- define "rio.activatorLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "rio.activatorSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rocm-inference
{{- end }}

{{/* The activator's name (its Deployment, Service, account and scrape job), whether or not it is installed. */}}
{{- define "rio.activatorFullname" -}}
{{- printf "%s-activator" (include "rio.fullname" . | trunc 53 | trimSuffix "-") }}
{{- end }}

{{/* Whether the activator is installed ("true" or empty): its watch is cluster-wide. */}}
{{- define "rio.activatorEnabled" -}}
{{- if and .Values.activator.enabled .Values.watch.allNamespaces }}true{{ end }}
{{- end }}

{{/* NAMESPACE/NAME of the activator's Service, for the operator; empty without one. */}}
{{- define "rio.activatorService" -}}
{{- if include "rio.activatorEnabled" . }}
{{- printf "%s/%s" .Release.Namespace (include "rio.activatorFullname" .) }}
{{- end }}
{{- end }}
