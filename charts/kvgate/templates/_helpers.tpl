{{/* Names, labels and the webhook's TLS material, shared by every template. */}}

{{- define "kvgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every namespaced object: <release>-kvgate, or <release> if it already says kvgate. */}}
{{- define "kvgate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Cluster-scoped objects carry the namespace too: two releases in two namespaces must not clash. */}}
{{- define "kvgate.clusterName" -}}
{{- printf "%s-%s" (include "kvgate.fullname" .) .Release.Namespace | trunc 253 | trimSuffix "-" }}
{{- end }}

{{- define "kvgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "kvgate.labels" -}}
helm.sh/chart: {{ include "kvgate.chart" . }}
{{ include "kvgate.selectorLabels" . }}
{{ include "kvgate.commonLabels" . }}
{{- end }}

{{- define "kvgate.commonLabels" -}}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvgate
{{- end }}

{{/* The webhook's own pods (Deployment <fullname>-webhook): the controller's selector, with
component "operator", never matches them. */}}
{{- define "kvgate.webhookSelectorLabels" -}}
app.kubernetes.io/name: {{ include "kvgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end }}

{{- define "kvgate.webhookLabels" -}}
helm.sh/chart: {{ include "kvgate.chart" . }}
{{ include "kvgate.webhookSelectorLabels" . }}
{{ include "kvgate.commonLabels" . }}
{{- end }}

{{- define "kvgate.webhookName" -}}
{{- printf "%s-webhook" (include "kvgate.fullname" .) }}
{{- end }}

{{- define "kvgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false: name the ServiceAccount the operator should run as" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kvgate.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "kvgate.webhookServiceName" -}}
{{- printf "%s-webhook" (include "kvgate.fullname" .) }}
{{- end }}

{{- define "kvgate.metricsServiceName" -}}
{{- printf "%s-metrics" (include "kvgate.fullname" .) }}
{{- end }}

{{- define "kvgate.webhookSecretName" -}}
{{- printf "%s-webhook-tls" (include "kvgate.fullname" .) }}
{{- end }}

{{- define "kvgate.certificateName" -}}
{{- printf "%s-webhook" (include "kvgate.fullname" .) }}
{{- end }}

{{/* DNS names the API server may use for the webhook Service. */}}
{{- define "kvgate.webhookDNSNames" -}}
{{- $svc := include "kvgate.webhookServiceName" . }}
{{- $ns := .Release.Namespace }}
{{- toJson (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns)) }}
{{- end }}

{{/*
The chart-generated CA and serving certificate, as JSON {"ca": PEM, "cert": PEM, "key": PEM}.
Reused from the existing Secret when there is one, so `helm upgrade` keeps the CA the API server
trusts; generated otherwise. Memoised on the root context so the Secret, the webhook
configuration and the pod annotation all see the same material within one render.
*/}}
{{- define "kvgate.generatedTLS" -}}
{{- if not (hasKey . "kvgateGeneratedTLS") }}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (include "kvgate.webhookSecretName" .) }}
{{- $data := dict }}
{{- if $secret }}{{ $data = default dict $secret.data }}{{ end }}
{{- $tls := dict }}
{{- if and (hasKey $data "ca.crt") (hasKey $data "tls.crt") (hasKey $data "tls.key") }}
{{- $tls = dict "ca" (index $data "ca.crt" | b64dec) "cert" (index $data "tls.crt" | b64dec) "key" (index $data "tls.key" | b64dec) }}
{{- else }}
{{- $days := int .Values.webhook.generatedCert.validityDays }}
{{- $ca := genCA (printf "%s-webhook-ca" (include "kvgate.fullname" .)) $days }}
{{- $names := include "kvgate.webhookDNSNames" . | fromJsonArray }}
{{- $cert := genSignedCert (index $names 2) nil $names $days $ca }}
{{- $tls = dict "ca" $ca.Cert "cert" $cert.Cert "key" $cert.Key }}
{{- end }}
{{- $_ := set . "kvgateGeneratedTLS" $tls }}
{{- end }}
{{- toJson (get . "kvgateGeneratedTLS") }}
{{- end }}

{{/* Fail early, with the way out, when a kind the values ask for is not served by the cluster. */}}
{{- define "kvgate.requireAPI" -}}
{{- $ctx := index . 0 }}
{{- $api := index . 1 }}
{{- $value := index . 2 }}
{{- if not ($ctx.Capabilities.APIVersions.Has $api) }}
{{- fail (printf "%s is true but the cluster does not serve %s: install its CRDs first, or set %s=false (with `helm template`, pass --api-versions %s)" $value $api $value $api) }}
{{- end }}
{{- end }}
