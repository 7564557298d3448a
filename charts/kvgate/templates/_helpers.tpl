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

{{/* The Secret the webhook serves from: the user's (webhook.existingSecret), else the chart's. */}}
{{- define "kvgate.webhookSecretName" -}}
{{- default (printf "%s-webhook-tls" (include "kvgate.fullname" .)) .Values.webhook.existingSecret }}
{{- end }}

{{/*
The webhook configuration's caBundle (base64): webhook.caBundle with webhook.existingSecret (PEM,
or PEM already base64-encoded), else the chart-generated CA. cert-manager mode has none (its
cainjector writes it). Fails, naming the value, when what is given cannot work.
*/}}
{{- define "kvgate.webhookCABundle" -}}
{{- $webhook := .Values.webhook }}
{{- $marker := "-----BEGIN CERTIFICATE-----" }}
{{- if $webhook.existingSecret }}
{{- if $webhook.certManager.enabled }}
{{- fail "webhook.existingSecret and webhook.certManager.enabled are exclusive: cert-manager writes the chart's own Secret; unset one of them" }}
{{- end }}
{{- if not $webhook.caBundle }}
{{- fail (printf "webhook.existingSecret=%s needs webhook.caBundle: the PEM CA certificate that signed its tls.crt (e.g. --set-file webhook.caBundle=ca.crt), which the API server must trust to call the webhook" $webhook.existingSecret) }}
{{- end }}
{{- $pem := $webhook.caBundle }}
{{- if not (contains $marker $pem) }}
{{- $pem = b64dec $pem }}
{{- end }}
{{- if not (contains $marker $pem) }}
{{- fail (printf "webhook.caBundle is not a PEM certificate (%s ...) nor one base64-encoded: give the CA that signed the tls.crt of webhook.existingSecret=%s" $marker $webhook.existingSecret) }}
{{- end }}
{{- $pem | b64enc }}
{{- else if $webhook.caBundle }}
{{- fail "webhook.caBundle is used only with webhook.existingSecret (the chart's own certificate and cert-manager's carry their CA): set webhook.existingSecret or unset webhook.caBundle" }}
{{- else if not $webhook.certManager.enabled }}
{{- (include "kvgate.generatedTLS" . | fromJson).ca | b64enc }}
{{- end }}
{{- end }}

{{/* The Secret (and key) the router key seed is read from: routerKeySeed.existingSecret, else the chart's. */}}
{{- define "kvgate.routerKeySeedSecretName" -}}
{{- default (printf "%s-router-key-seed" (include "kvgate.fullname" .)) .Values.routerKeySeed.existingSecret }}
{{- end }}

{{- define "kvgate.routerKeySeedKey" -}}
{{- if .Values.routerKeySeed.existingSecret }}
{{- .Values.routerKeySeed.existingSecretKey }}
{{- else }}
{{- "seed" }}
{{- end }}
{{- end }}

{{/*
The spec fields of a PodDisruptionBudget: minAvailable when set, else maxUnavailable. Fails when,
with every replica healthy, it would let no pod be evicted: every drain would wait forever.
Called with (list budget replicas "budget's value path" "replicas' value path").
*/}}
{{- define "kvgate.disruptionBudget" -}}
{{- $budget := index . 0 }}
{{- $replicas := int (index . 1) }}
{{- $path := index . 2 }}
{{- $replicasPath := index . 3 }}
{{- $field := "maxUnavailable" }}
{{- $value := $budget.maxUnavailable }}
{{- if not (kindIs "invalid" $budget.minAvailable) }}
{{- $field = "minAvailable" }}
{{- $value = $budget.minAvailable }}
{{- end }}
{{- if kindIs "invalid" $value }}
{{- fail (printf "%s: set maxUnavailable (e.g. 1) or minAvailable" $path) }}
{{- end }}
{{- $count := 0 }}
{{- if kindIs "string" $value }}
{{- /* A percentage of the replicas, rounded up as the disruption controller does. */}}
{{- $count = div (add (mul (int (trimSuffix "%" $value)) $replicas) 99) 100 }}
{{- else }}
{{- $count = int $value }}
{{- end }}
{{- $evictable := $count }}
{{- if eq $field "minAvailable" }}
{{- $evictable = sub $replicas $count }}
{{- end }}
{{- if and (gt $replicas 0) (lt (int $evictable) 1) }}
{{- fail (printf "%s.%s=%v with %s: %d would block every node drain (no pod could ever be evicted, so kubectl drain, cluster upgrades and the cluster autoscaler wait forever): use %s.maxUnavailable: 1 (the default) with minAvailable unset, or raise %s" $path $field $value $replicasPath $replicas $path $replicasPath) }}
{{- end }}
{{- if kindIs "string" $value }}
{{ $field }}: {{ $value | quote }}
{{- else }}
{{ $field }}: {{ int $value }}
{{- end }}
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

{{/* runAsNonRoot with the uid and gid of runAsUser/runAsGroup; a null one is left to the
platform (OpenShift's restricted SCC assigns both from the namespace's range). */}}
{{- define "kvgate.runAs" -}}
runAsNonRoot: true
{{- with .Values.runAsUser }}
runAsUser: {{ . }}
{{- end }}
{{- with .Values.runAsGroup }}
runAsGroup: {{ . }}
{{- end }}
{{- end }}

{{/* The operator's and the webhook's pod securityContext. */}}
{{- define "kvgate.podSecurityContext" -}}
{{ include "kvgate.runAs" . }}
{{- with .Values.runAsGroup }}
fsGroup: {{ . }}
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end }}
