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
