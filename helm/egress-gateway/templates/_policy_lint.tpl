{{/*
The inline policy, checked at render time so a mistake fails `helm template`/`helm install` with
the message `egress-gateway policy lint` prints (without its file:line prefix), instead of a pod
that crash-loops. It covers the structural mistakes (unknown keys, version, modes, ports, names,
token hashes); the gateway still validates everything else at start. tests/chart/test_chart_policy.py
checks each message against the real lint.
*/}}
{{- define "egress-gateway.lintKeys" -}}
{{- $where := index . 0 }}{{- $map := index . 1 }}{{- $allowed := index . 2 }}
{{- if not (kindIs "map" $map) }}
{{- fail (printf "policy.inline: %s must be a mapping" $where) }}
{{- end }}
{{- range $key := keys $map | sortAlpha }}
{{- if not (has $key $allowed) }}
{{- fail (printf "policy.inline: %s: unknown key '%s' (expected one of ['%s'])" $where $key (join "', '" (sortAlpha $allowed))) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "egress-gateway.lintChoice" -}}
{{- $where := index . 0 }}{{- $value := index . 1 }}{{- $choices := index . 2 }}
{{- if not (has $value $choices) }}
{{- fail (printf "policy.inline: %s must be one of %s, got '%v'" $where (join ", " $choices) $value) }}
{{- end }}
{{- end }}

{{- define "egress-gateway.lintPolicy" -}}
{{- $policy := . }}
{{- include "egress-gateway.lintKeys" (list "policy" $policy (list "version" "defaults" "principals" "fetch" "search" "proxy" "transparent" "orchestrators" "credentials")) }}
{{- if not (hasKey $policy "version") }}
{{- fail "policy.inline: version is required (version: 1)" }}
{{- end }}
{{- if ne (toString $policy.version) "1" }}
{{- fail (printf "policy.inline: version must be between 1 and 1, got %v" $policy.version) }}
{{- end }}
{{- with $policy.defaults }}
{{- include "egress-gateway.lintKeys" (list "defaults" . (list "mode" "ports" "literal_ips" "allow_cidrs" "deny_cidrs" "inspect" "scan")) }}
{{- if hasKey . "mode" }}{{ include "egress-gateway.lintChoice" (list "defaults.mode" .mode (list "enforce" "report")) }}{{ end }}
{{- if hasKey . "literal_ips" }}{{ include "egress-gateway.lintChoice" (list "defaults.literal_ips" .literal_ips (list "deny" "allow")) }}{{ end }}
{{- range $port := .ports | default list }}
{{- $text := toString $port }}
{{- if or (not (regexMatch "^[0-9]+$" $text)) (lt (atoi $text) 1) (gt (atoi $text) 65535) }}
{{- fail (printf "policy.inline: defaults.ports must be between 1 and 65535, got %v" $port) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $name, $principal := $policy.principals | default dict }}
{{- if not (regexMatch "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$" $name) }}
{{- fail (printf "policy.inline: principal name '%s' must be 1-64 letters, digits, '.', '_' or '-'" $name) }}
{{- end }}
{{- $where := printf "principals.%s" $name }}
{{- include "egress-gateway.lintKeys" (list $where $principal (list "token_sha256" "egress" "tools" "budgets" "mode" "inspect" "scan")) }}
{{- if hasKey $principal "token_sha256" }}
{{- if not (regexMatch "^[0-9a-f]{64}$" (toString $principal.token_sha256)) }}
{{- fail (printf "policy.inline: %s.token_sha256 must be 64 lowercase hex digits" $where) }}
{{- end }}
{{- end }}
{{- with $principal.egress }}{{ include "egress-gateway.lintKeys" (list (printf "%s.egress" $where) . (list "allow_domains" "deny_domains" "internal_hosts")) }}{{ end }}
{{- with $principal.tools }}{{ include "egress-gateway.lintKeys" (list (printf "%s.tools" $where) . (list "search" "fetch")) }}{{ end }}
{{- with $principal.budgets }}{{ include "egress-gateway.lintKeys" (list (printf "%s.budgets" $where) . (list "search" "fetch")) }}{{ end }}
{{- if hasKey $principal "mode" }}{{ include "egress-gateway.lintChoice" (list (printf "%s.mode" $where) $principal.mode (list "enforce" "report")) }}{{ end }}
{{- end }}
{{- end }}
