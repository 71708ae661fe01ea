{{/*
Chart name, truncated to the 63 characters a label value allows.
*/}}
{{- define "npu-lora-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full resource name: fullnameOverride, else <release>-<chart>, or the release name when it already
contains the chart name, or the chart name when it starts with the release name (release
"npu-lora" -> "npu-lora-operator"); truncated to 63 characters.
*/}}
{{- define "npu-lora-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else if hasPrefix .Release.Name $name }}
{{- $name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "npu-lora-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: stable across upgrades (a Deployment's selector is immutable).
*/}}
{{- define "npu-lora-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "npu-lora-operator.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end }}

{{/*
Standard labels (Kubernetes recommended labels + helm.sh/chart).
*/}}
{{- define "npu-lora-operator.labels" -}}
helm.sh/chart: {{ include "npu-lora-operator.chart" . | quote }}
{{ include "npu-lora-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: npu-lora
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
{{- end }}

{{/*
Name of the operator's ServiceAccount.
*/}}
{{- define "npu-lora-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "npu-lora-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Operator image reference (tag defaults to the chart's appVersion).
*/}}
{{- define "npu-lora-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
Default worker image reference (tag defaults to the chart's appVersion).
*/}}
{{- define "npu-lora-operator.workerImage" -}}
{{- printf "%s:%s" .Values.workerImage.repository (default .Chart.AppVersion .Values.workerImage.tag) }}
{{- end }}

{{/*
Fail when more than one replica is requested: kopf runs standalone (no peering), so two replicas
would handle every MoEFinetune twice. 0 is allowed (the operator paused).
*/}}
{{- define "npu-lora-operator.checkReplicas" -}}
{{- if gt (int .Values.replicas) 1 }}
{{- fail (printf "replicas must be 1 or 0 (got %v): the npu-lora operator runs kopf standalone without peering, so more than one replica would handle every MoEFinetune twice" .Values.replicas) }}
{{- end }}
{{- end }}
