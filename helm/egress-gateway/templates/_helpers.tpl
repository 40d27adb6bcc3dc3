{{/*
Helpers for the egress-gateway chart.

The "egress-gateway.sidecar*" and "egress-gateway.agentEnv" templates are also included by
workload charts that depend on this chart. They take a context with .Values (this chart's
values), .Release and .Capabilities, so none of them reads .Chart, and names derive from the
release name only (the ConfigMap and Secret this chart renders are then found by the workload):

  {{- $egw := dict "Values" (index .Values "egress-gateway") "Release" .Release "Capabilities" .Capabilities }}
*/}}

{{- define "egress-gateway.name" -}}
{{- default "egress-gateway" .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "egress-gateway.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "egress-gateway.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "egress-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "egress-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "egress-gateway.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "egress-gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: {{ .Values.mode }}
{{- end }}

{{- define "egress-gateway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "egress-gateway.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "egress-gateway.configMapName" -}}
{{- default (printf "%s-policy" (include "egress-gateway.fullname" .)) .Values.policy.existingConfigMap }}
{{- end }}

{{- define "egress-gateway.secretName" -}}
{{- default (include "egress-gateway.fullname" .) .Values.secret.existingSecret }}
{{- end }}

{{/* The image reference; a digest wins over the tag. */}}
{{- define "egress-gateway.image" -}}
{{- $tag := .Values.image.tag }}
{{- if not $tag }}
{{- $fromChart := "" }}
{{- with .Chart }}{{ if eq .Name "egress-gateway" }}{{ $fromChart = .AppVersion }}{{ end }}{{ end }}
{{- $tag = required "image.tag is required when the sidecar templates are included from another chart" $fromChart }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* "true" when sidecar mode renders a Kubernetes native sidecar (>= 1.29, beta on by default). */}}
{{- define "egress-gateway.nativeSidecar" -}}
{{- if and .Values.sidecar.native (semverCompare ">=1.29-0" .Capabilities.KubeVersion.Version) }}true{{ end }}
{{- end }}

{{/* Listen hosts: see values.yaml `listen`. */}}
{{- define "egress-gateway.proxyHost" -}}
{{- .Values.listen.proxyHost | default (ternary "127.0.0.1" "0.0.0.0" (eq .Values.mode "sidecar")) }}
{{- end }}
{{- define "egress-gateway.apiHost" -}}
{{- .Values.listen.apiHost | default (ternary "127.0.0.1" "0.0.0.0" (eq .Values.mode "sidecar")) }}
{{- end }}
{{- define "egress-gateway.adminHost" -}}
{{- .Values.listen.adminHost | default "0.0.0.0" }}
{{- end }}

{{/* Refuse settings that would render a broken or unsafe gateway. */}}
{{- define "egress-gateway.validate" -}}
{{- include "egress-gateway.validateTransparent" . }}
{{- $s := .Values.shutdown }}
{{- if le (int $s.terminationGracePeriodSeconds) (add $s.drainSeconds $s.preStopSleepSeconds | int) }}
{{- fail (printf "shutdown.terminationGracePeriodSeconds (%d) must exceed shutdown.preStopSleepSeconds + shutdown.drainSeconds (%d)" (int $s.terminationGracePeriodSeconds) (add $s.drainSeconds $s.preStopSleepSeconds | int)) }}
{{- end }}
{{- if and .Values.networkPolicy.enabled (not (or .Values.networkPolicy.agentSelector.matchLabels .Values.networkPolicy.agentSelector.matchExpressions)) }}
{{- fail "networkPolicy.agentSelector must select the agent pods (an empty selector would lock down every pod of the namespace)" }}
{{- end }}
{{- if and .Values.networkPolicy.enabled .Values.networkPolicy.redis.enabled (not .Values.networkPolicy.redis.to) }}
{{- fail "networkPolicy.redis.to must list the Redis peers (podSelector/namespaceSelector/ipBlock)" }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (eq .Values.mode "sidecar") }}
{{- fail "metrics.serviceMonitor needs mode=deployment (in sidecar mode scrape the workload's pods with a PodMonitor)" }}
{{- end }}
{{- if and .Values.inspection.enabled (not (and .Values.inspection.caSecret .Values.inspection.trustConfigMap)) }}
{{- fail "inspection.enabled needs inspection.caSecret (the CA's tls Secret) and inspection.trustConfigMap (ca.pem and bundle.pem for agents)" }}
{{- end }}
{{- end }}

{{/* "true" when the pod's traffic is intercepted (sidecar mode with transparent.enabled). */}}
{{- define "egress-gateway.transparent" -}}
{{- if and (eq .Values.mode "sidecar") .Values.transparent.enabled }}true{{ end }}
{{- end }}

{{/* What would let an agent undo the interception: its running as the gateway's uid (the rules
exempt that uid) or holding NET_ADMIN (it could delete the rules). Refused at render time. */}}
{{- define "egress-gateway.validateTransparent" -}}
{{- $t := .Values.transparent }}
{{- if $t.enabled }}
{{- if ne .Values.mode "sidecar" }}
{{- fail "transparent.enabled needs mode=sidecar (the shared deployment is enforced by NetworkPolicy)" }}
{{- end }}
{{- $gw := int $t.gatewayUid }}
{{- range $t.agentUids }}
{{- if eq (int .) $gw }}
{{- fail (printf "transparent.agentUids: %d is transparent.gatewayUid; an agent running as the gateway's uid is exempt from the rules" $gw) }}
{{- end }}
{{- if eq (int .) 0 }}
{{- fail "transparent.agentUids: 0 (root) could remove the rules; run the agent as a non-root uid" }}
{{- end }}
{{- end }}
{{- if eq (int (.Values.podSecurityContext.runAsUser | default 0)) $gw }}
{{- fail (printf "podSecurityContext.runAsUser is transparent.gatewayUid (%d): every container without its own runAsUser, the agent included, would be exempt from the rules" $gw) }}
{{- end }}
{{- $caps := ((.Values.securityContext.capabilities | default dict).add | default list) }}
{{- if or (has "NET_ADMIN" $caps) (has "CAP_NET_ADMIN" $caps) }}
{{- fail "securityContext.capabilities.add has NET_ADMIN: an agent with it could delete the interception rules" }}
{{- end }}
{{- with .Values.policy.inline.transparent }}
{{- range $uid, $_ := (.principals | default dict) }}
{{- if eq (int $uid) $gw }}
{{- fail (printf "policy transparent.principals maps uid %d, which is transparent.gatewayUid" $gw) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The gateway container's securityContext: the values', run as the gateway uid when intercepting. */}}
{{- define "egress-gateway.gatewaySecurityContext" -}}
{{- $ctx := deepCopy .Values.securityContext }}
{{- if include "egress-gateway.transparent" . }}
{{- $_ := set $ctx "runAsUser" (int .Values.transparent.gatewayUid) }}
{{- $_ := set $ctx "runAsGroup" (int .Values.transparent.gatewayUid) }}
{{- end }}
{{- toYaml $ctx }}
{{- end }}

{{/* Settings of the transparent and DNS listeners and of the rules (gateway and init container). */}}
{{- define "egress-gateway.transparentEnv" -}}
{{- $t := .Values.transparent }}
- name: EGRESS_TRANSPARENT_LISTEN
  value: {{ printf "127.0.0.1:%d,[::1]:%d" (int $t.port) (int $t.port) | quote }}
- name: EGRESS_DNS_LISTEN
  value: {{ printf "127.0.0.1:%d,[::1]:%d" (int $t.dnsPort) (int $t.dnsPort) | quote }}
- name: EGRESS_GATEWAY_UID
  value: {{ $t.gatewayUid | quote }}
{{- with $t.excludeCidrs }}
- name: EGRESS_REDIRECT_EXCLUDE_CIDRS
  value: {{ join "," . | quote }}
{{- end }}
{{- with $t.excludePorts }}
- name: EGRESS_REDIRECT_EXCLUDE_PORTS
  value: {{ join "," . | quote }}
{{- end }}
{{- end }}

{{/* The init container that installs the interception rules, once, before any other container. */}}
{{- define "egress-gateway.redirectInitContainer" -}}
- name: {{ .Values.sidecar.containerName }}-redirect
  image: {{ include "egress-gateway.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["/opt/venv/bin/egress-gateway", "redirect", "--apply"]
  env:
    - name: EGRESS_POLICY
      value: {{ printf "/etc/egress-gateway/policy/%s" .Values.policy.key | quote }}
    {{- include "egress-gateway.transparentEnv" . | trim | nindent 4 }}
  securityContext:
    # Root inside the pod's network namespace only, with the two capabilities nft needs.
    runAsUser: 0
    runAsGroup: 0
    runAsNonRoot: false
    readOnlyRootFilesystem: true
    allowPrivilegeEscalation: false
    privileged: false
    capabilities:
      drop: [ALL]
      add: [NET_ADMIN, NET_RAW]
    seccompProfile:
      type: RuntimeDefault
  resources:
    {{- toYaml .Values.transparent.initResources | nindent 4 }}
  terminationMessagePolicy: FallbackToLogsOnError
  volumeMounts:
    - name: egress-gateway-policy
      mountPath: /etc/egress-gateway/policy
      readOnly: true
{{- end }}

{{/* checksum/* pod annotations: a changed inline policy or chart-made Secret rolls the pods.
Secret values reach the gateway as env vars, which are read once at start. */}}
{{- define "egress-gateway.checksumAnnotations" -}}
{{- if and .Values.policy.checksumAnnotation (not .Values.policy.existingConfigMap) }}
checksum/policy: {{ include "egress-gateway.policyData" . | sha256sum }}
{{- end }}
{{- if not .Values.secret.existingSecret }}
checksum/secret: {{ include "egress-gateway.secretData" . | sha256sum }}
{{- end }}
{{- end }}

{{- define "egress-gateway.policyData" -}}
{{ .Values.policy.key }}: |
  {{- toYaml .Values.policy.inline | nindent 2 }}
{{- end }}

{{- define "egress-gateway.secretData" -}}
{{- $s := .Values.secret }}
{{- with $s.searchKeys.tavily }}
EGRESS_SEARCH_TAVILY_KEY: {{ . | b64enc | quote }}
{{- end }}
{{- with $s.searchKeys.exa }}
EGRESS_SEARCH_EXA_KEY: {{ . | b64enc | quote }}
{{- end }}
{{- with $s.searchKeys.braveApi }}
EGRESS_SEARCH_BRAVE_API_KEY: {{ . | b64enc | quote }}
{{- end }}
{{- with $s.fetchReaderKey }}
EGRESS_FETCH_READER_KEY: {{ . | b64enc | quote }}
{{- end }}
{{- with $s.redisUrl }}
EGRESS_REDIS_URL: {{ . | b64enc | quote }}
{{- end }}
{{- with $s.runTokenSecret }}
EGRESS_RUN_TOKEN_SECRET: {{ . | b64enc | quote }}
{{- end }}
{{- range $principal, $token := $s.agentTokens }}
token-{{ $principal }}: {{ $token | b64enc | quote }}
{{- end }}
{{- end }}

{{/* The gateway's env: settings from values, secrets by reference (optional keys). */}}
{{- define "egress-gateway.env" -}}
- name: EGRESS_POLICY
  value: {{ printf "/etc/egress-gateway/policy/%s" .Values.policy.key | quote }}
- name: EGRESS_PROXY_LISTEN
  value: {{ printf "%s:%d" (include "egress-gateway.proxyHost" .) (int .Values.ports.proxy) | quote }}
- name: EGRESS_API_LISTEN
  value: {{ printf "%s:%d" (include "egress-gateway.apiHost" .) (int .Values.ports.api) | quote }}
- name: EGRESS_ADMIN_LISTEN
  value: {{ printf "%s:%d" (include "egress-gateway.adminHost" .) (int .Values.ports.admin) | quote }}
- name: EGRESS_AUDIT_LOG
  value: {{ .Values.config.auditLog | quote }}
- name: EGRESS_LOG_LEVEL
  value: {{ .Values.config.logLevel | quote }}
{{- with .Values.config.nameservers }}
- name: EGRESS_NAMESERVERS
  value: {{ . | quote }}
{{- end }}
{{- with .Values.config.caBundle }}
- name: EGRESS_CA_BUNDLE
  value: {{ . | quote }}
{{- end }}
{{- with .Values.config.searchEngines }}
- name: EGRESS_SEARCH_ENGINES
  value: {{ . | quote }}
{{- end }}
{{- $secretName := include "egress-gateway.secretName" . }}
{{- range list "EGRESS_SEARCH_TAVILY_KEY" "EGRESS_SEARCH_EXA_KEY" "EGRESS_SEARCH_BRAVE_API_KEY" "EGRESS_FETCH_READER_KEY" "EGRESS_REDIS_URL" "EGRESS_RUN_TOKEN_SECRET" }}
- name: {{ . }}
  valueFrom:
    secretKeyRef:
      name: {{ $secretName }}
      key: {{ . }}
      optional: true
{{- end }}
{{- if include "egress-gateway.transparent" . }}
{{ include "egress-gateway.transparentEnv" . | trim }}
{{- end }}
{{- if .Values.inspection.enabled }}
- name: EGRESS_INSPECT_CA_CERT
  value: "/etc/egress-gateway/inspect-ca/tls.crt"
- name: EGRESS_INSPECT_CA_KEY
  value: "/etc/egress-gateway/inspect-ca/tls.key"
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The gateway container, without the list dash. role: deployment | native | legacy. */}}
{{- define "egress-gateway.container" -}}
{{- $v := .ctx.Values -}}
name: {{ .name }}
image: {{ include "egress-gateway.image" .ctx }}
imagePullPolicy: {{ $v.image.pullPolicy }}
{{- if eq .role "native" }}
restartPolicy: Always
{{- end }}
ports:
  - name: proxy
    containerPort: {{ $v.ports.proxy }}
    protocol: TCP
  - name: api
    containerPort: {{ $v.ports.api }}
    protocol: TCP
  - name: admin
    containerPort: {{ $v.ports.admin }}
    protocol: TCP
env:
  {{- include "egress-gateway.env" .ctx | nindent 2 }}
{{- if eq .role "native" }}
startupProbe:
  httpGet:
    path: {{ $v.probes.startup.path }}
    port: admin
  periodSeconds: {{ $v.probes.startup.periodSeconds }}
  timeoutSeconds: {{ $v.probes.startup.timeoutSeconds }}
  failureThreshold: {{ $v.probes.startup.failureThreshold }}
{{- end }}
livenessProbe:
  httpGet:
    path: {{ $v.probes.liveness.path }}
    port: admin
  initialDelaySeconds: {{ $v.probes.liveness.initialDelaySeconds }}
  periodSeconds: {{ $v.probes.liveness.periodSeconds }}
  timeoutSeconds: {{ $v.probes.liveness.timeoutSeconds }}
  failureThreshold: {{ $v.probes.liveness.failureThreshold }}
readinessProbe:
  httpGet:
    path: {{ $v.probes.readiness.path }}
    port: admin
  periodSeconds: {{ $v.probes.readiness.periodSeconds }}
  timeoutSeconds: {{ $v.probes.readiness.timeoutSeconds }}
  failureThreshold: {{ $v.probes.readiness.failureThreshold }}
{{- if and (ne .role "native") (gt (int $v.shutdown.preStopSleepSeconds) 0) }}
lifecycle:
  preStop:
    exec:
      command: ["/bin/sleep", "{{ $v.shutdown.preStopSleepSeconds }}"]
{{- end }}
securityContext:
  {{- include "egress-gateway.gatewaySecurityContext" .ctx | nindent 2 }}
resources:
  {{- toYaml $v.resources | nindent 2 }}
terminationMessagePolicy: FallbackToLogsOnError
volumeMounts:
  - name: egress-gateway-policy
    mountPath: /etc/egress-gateway/policy
    readOnly: true
  - name: egress-gateway-tmp
    mountPath: /tmp
  {{- if $v.inspection.enabled }}
  - name: egress-gateway-inspect-ca
    mountPath: /etc/egress-gateway/inspect-ca
    readOnly: true
  {{- end }}
  {{- with $v.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* Pod volumes for the gateway container (policy directory, /tmp). */}}
{{- define "egress-gateway.volumes" -}}
- name: egress-gateway-policy
  configMap:
    name: {{ include "egress-gateway.configMapName" . }}
    items:
      - key: {{ .Values.policy.key }}
        path: {{ .Values.policy.key }}
- name: egress-gateway-tmp
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.tmpSizeLimit }}
{{- if .Values.inspection.enabled }}
# The interception CA: the gateway container mounts it, no agent container does.
- name: egress-gateway-inspect-ca
  secret:
    secretName: {{ .Values.inspection.caSecret }}
    defaultMode: 0440
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Sidecar templates for workload charts. Each renders list items (or nothing):
  initContainers: {{ include "egress-gateway.sidecar.initContainers" $egw }}   native (>= 1.29)
  containers:     {{ include "egress-gateway.sidecar.containers" $egw }}       legacy (< 1.29)
  volumes:        {{ include "egress-gateway.sidecar.volumes" $egw }}
  agent env:      {{ include "egress-gateway.agentEnv" $egw }}
  pod annotations:{{ include "egress-gateway.checksumAnnotations" $egw }}
"egress-gateway.sidecar" is the container entry itself, in the shape the cluster version needs.
*/}}
{{- define "egress-gateway.sidecar" -}}
{{- $role := ternary "native" "legacy" (eq (include "egress-gateway.nativeSidecar" .) "true") -}}
- {{ include "egress-gateway.container" (dict "ctx" . "role" $role "name" .Values.sidecar.containerName) | indent 2 | trim }}
{{- end }}

{{- define "egress-gateway.sidecar.initContainers" -}}
{{- if include "egress-gateway.transparent" . -}}
{{- include "egress-gateway.redirectInitContainer" . }}
{{ end }}
{{- if include "egress-gateway.nativeSidecar" . -}}
{{- include "egress-gateway.sidecar" . }}
{{- end }}
{{- end }}

{{- define "egress-gateway.sidecar.containers" -}}
{{- if not (include "egress-gateway.nativeSidecar" .) -}}
{{- include "egress-gateway.sidecar" . }}
{{- end }}
{{- end }}

{{- define "egress-gateway.sidecar.volumes" -}}
{{- include "egress-gateway.volumes" . }}
{{- end }}

{{/* Where agents reach the gateway. */}}
{{- define "egress-gateway.proxyURL" -}}
{{- if eq .Values.mode "sidecar" }}
{{- printf "http://127.0.0.1:%d" (int .Values.ports.proxy) }}
{{- else }}
{{- printf "http://%s.%s.svc.cluster.local:%d" (include "egress-gateway.fullname" .) .Release.Namespace (int .Values.ports.proxy) }}
{{- end }}
{{- end }}

{{- define "egress-gateway.apiURL" -}}
{{- if eq .Values.mode "sidecar" }}
{{- printf "http://127.0.0.1:%d" (int .Values.ports.api) }}
{{- else }}
{{- printf "http://%s.%s.svc.cluster.local:%d" (include "egress-gateway.fullname" .) .Release.Namespace (int .Values.ports.api) }}
{{- end }}
{{- end }}

{{/* Env entries for an agent container: both spellings, since curl reads only lowercase
http_proxy and other tools read only one of the two. */}}
{{- define "egress-gateway.agentEnv" -}}
{{- $proxy := include "egress-gateway.proxyURL" . }}
{{- $noProxy := join "," .Values.agentEnv.noProxy -}}
{{- range list "HTTPS_PROXY" "HTTP_PROXY" "https_proxy" "http_proxy" }}
- name: {{ . }}
  value: {{ $proxy | quote }}
{{- end }}
{{- range list "NO_PROXY" "no_proxy" }}
- name: {{ . }}
  value: {{ $noProxy | quote }}
{{- end }}
{{- if .Values.inspection.enabled }}
{{ include "egress-gateway.agentTrustEnv" . | trim }}
{{- end }}
{{- end }}

{{/* What makes an agent's tools trust the interception CA (docs/guides/trusting-the-ca.md):
the variables that replace a tool's store point at the combined bundle (roots + CA);
NODE_EXTRA_CA_CERTS adds to Node's roots, so it takes the CA alone. */}}
{{- define "egress-gateway.agentTrustEnv" -}}
{{- $dir := .Values.inspection.agentTrustPath }}
{{- range list "SSL_CERT_FILE" "REQUESTS_CA_BUNDLE" "CURL_CA_BUNDLE" "GIT_SSL_CAINFO" "PIP_CERT" "NPM_CONFIG_CAFILE" }}
- name: {{ . }}
  value: {{ printf "%s/bundle.pem" $dir | quote }}
{{- end }}
- name: NODE_EXTRA_CA_CERTS
  value: {{ printf "%s/ca.pem" $dir | quote }}
{{- end }}

{{/* The agent's trust files: a volume for the pod and its mount for the agent container. */}}
{{- define "egress-gateway.agentTrustVolume" -}}
- name: egress-gateway-trust
  configMap:
    name: {{ .Values.inspection.trustConfigMap }}
    items:
      - key: ca.pem
        path: ca.pem
      - key: bundle.pem
        path: bundle.pem
{{- end }}

{{- define "egress-gateway.agentTrustVolumeMount" -}}
- name: egress-gateway-trust
  mountPath: {{ .Values.inspection.agentTrustPath }}
  readOnly: true
{{- end }}
