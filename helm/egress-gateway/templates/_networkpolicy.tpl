{{/* Egress rules shared by the gateway pods (deployment mode) and agent pods (sidecar mode). */}}
{{- define "egress-gateway.internetEgress" -}}
{{- $np := .Values.networkPolicy }}
# The internet on the policy's ports, minus every range an SSRF would aim at. The gateway's own
# address guard refuses these too; this is the second, independent layer.
- to:
    - ipBlock:
        cidr: 0.0.0.0/0
        except:
          {{- toYaml $np.exceptCIDRs | nindent 10 }}
    {{- if $np.ipv6.enabled }}
    - ipBlock:
        cidr: ::/0
        except:
          {{- toYaml $np.ipv6.exceptCIDRs | nindent 10 }}
    {{- end }}
  ports:
    {{- range $np.egressPorts }}
    - protocol: TCP
      port: {{ . }}
    {{- end }}
{{- if $np.redis.enabled }}
- to:
    {{- toYaml $np.redis.to | nindent 4 }}
  ports:
    - protocol: TCP
      port: {{ $np.redis.port }}
{{- end }}
{{- $exceptions := include "egress-gateway.policyExceptionCIDRs" . | fromJsonArray }}
{{- if $exceptions }}
# The ranges the policy itself opens (defaults.allow_cidrs, internal_hosts), on its ports.
- to:
    {{- range $exceptions }}
    - ipBlock:
        cidr: {{ . }}
    {{- end }}
  ports:
    {{- range (include "egress-gateway.policyPorts" . | fromJsonArray) }}
    - protocol: TCP
      port: {{ . }}
    {{- end }}
{{- end }}
{{- with $np.extraEgress }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The inline policy's allow_cidrs and every principal's internal_hosts CIDRs, as a JSON list
(empty with networkPolicy.policyExceptions false or an existing ConfigMap the chart cannot read). */}}
{{- define "egress-gateway.policyExceptionCIDRs" -}}
{{- $cidrs := list }}
{{- if and .Values.networkPolicy.policyExceptions (not .Values.policy.existingConfigMap) }}
{{- $policy := .Values.policy.inline | default dict }}
{{- range ((get ($policy.defaults | default dict) "allow_cidrs") | default list) }}
{{- $cidrs = append $cidrs . }}
{{- end }}
{{- range $name, $principal := ($policy.principals | default dict) }}
{{- range ((get ((get ($principal | default dict) "egress") | default dict) "internal_hosts") | default list) }}
{{- range ((get . "cidrs") | default list) }}
{{- $cidrs = append $cidrs . }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- toJson (uniq $cidrs) }}
{{- end }}

{{/* The inline policy's defaults.ports (the gateway's default, 80 and 443, when unset). */}}
{{- define "egress-gateway.policyPorts" -}}
{{- $defaults := (.Values.policy.inline | default dict).defaults | default dict }}
{{- toJson ((get $defaults "ports") | default (list 80 443)) }}
{{- end }}

{{/* Egress to a node-local DNS cache by address (its link-local IP matches no pod selector). */}}
{{- define "egress-gateway.nodeLocalDNS" -}}
{{- with .Values.networkPolicy.dns.nodeLocalCIDRs }}
- to:
    {{- range . }}
    - ipBlock:
        cidr: {{ . }}
    {{- end }}
  ports:
    - protocol: UDP
      port: 53
    - protocol: TCP
      port: 53
{{- end }}
{{- end }}
