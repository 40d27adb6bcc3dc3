"""Every Prometheus metric the gateway exports, defined in one place for review.

Prefix `egress_gateway_`, base units in names, `_total` on counters, bounded labels only
(decision, code, kind, engine, outcome, direction, tool): never a host, URL, principal, token or
client IP. Per-request detail belongs in the audit log.

The metrics the proxy updates per tunnel and per request are `LoopCounter`/`LoopHistogram`
(lock-free, event-loop thread only, same exposition); the rest are prometheus_client's own.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from gateway import __version__
from gateway.observe.loop_metrics import LoopCounter, LoopHistogram

# A `_created` series per counter and histogram child doubles the exposition and no alert uses it.
disable_created_metrics()  # type: ignore[no-untyped-call]
REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_DURATION_BUCKETS_S = (0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0)
_SIZE_BUCKETS_BYTES = (256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 104857600)

DECISIONS = LoopCounter(
    "egress_gateway_decisions_total",
    "Policy verdicts by kind (connect, http, fetch, search), decision (allow, deny, would_deny, none) and code "
    "(the denial's code, `none` for allow).",
    ["kind", "decision", "code"],
    registry=REGISTRY,
)
DNS_LOOKUP_SECONDS = Histogram(
    "egress_gateway_dns_lookup_seconds",
    "Time to resolve a destination name.",
    buckets=_LATENCY_BUCKETS_S,
    registry=REGISTRY,
)
DNS_QUERIES = LoopCounter(
    "egress_gateway_dns_queries_total",
    "Queries answered by the policy-aware DNS listener, by decision and query type (known types, else OTHER).",
    ["decision", "qtype"],
    registry=REGISTRY,
)
CONNECT_SECONDS = LoopHistogram(
    "egress_gateway_upstream_connect_seconds",
    "Time to open a pinned upstream TCP connection.",
    ["kind"],
    buckets=_LATENCY_BUCKETS_S,
    registry=REGISTRY,
)
POLICY_RELOADS = Counter(
    "egress_gateway_policy_reloads_total",
    "Policy reloads by outcome (success, failure).",
    ["outcome"],
    registry=REGISTRY,
)
POLICY_GENERATION = Gauge(
    "egress_gateway_policy_generation",
    "Generation of the policy in force.",
    registry=REGISTRY,
)
ACTIVE_TUNNELS = Gauge(
    "egress_gateway_active_tunnels",
    "CONNECT tunnels currently open.",
    registry=REGISTRY,
)
TUNNEL_SECONDS = LoopHistogram(
    "egress_gateway_tunnel_duration_seconds",
    "Lifetime of CONNECT tunnels.",
    (),
    buckets=_DURATION_BUCKETS_S,
    registry=REGISTRY,
)
TUNNEL_BYTES = LoopCounter(
    "egress_gateway_tunnel_bytes_total",
    "Bytes relayed through tunnels by direction (upstream, downstream).",
    ["direction"],
    registry=REGISTRY,
)
HTTP_FORWARD_SECONDS = LoopHistogram(
    "egress_gateway_http_forward_seconds",
    "Plain HTTP forward requests, head received to response end.",
    (),
    buckets=_LATENCY_BUCKETS_S,
    registry=REGISTRY,
)
HTTP_FORWARD_BYTES = LoopCounter(
    "egress_gateway_http_forward_bytes_total",
    "Body bytes relayed by the plain HTTP forwarder by direction (upstream, downstream).",
    ["direction"],
    registry=REGISTRY,
)
TOOL_CALLS = Counter(
    "egress_gateway_tool_calls_total",
    "web_search and web_fetch calls by tool and outcome code (ok or an error code).",
    ["tool", "code"],
    registry=REGISTRY,
)
TOOL_SECONDS = Histogram(
    "egress_gateway_tool_call_seconds",
    "Tool call latency by tool.",
    ["tool"],
    buckets=_LATENCY_BUCKETS_S,
    registry=REGISTRY,
)
FETCH_BODY_BYTES = Histogram(
    "egress_gateway_fetch_body_bytes",
    "web_fetch bodies by stage (wire, decoded).",
    ["stage"],
    buckets=_SIZE_BUCKETS_BYTES,
    registry=REGISTRY,
)
SEARCH_ATTEMPTS = Counter(
    "egress_gateway_search_attempts_total",
    "Search engine attempts by engine and outcome.",
    ["engine", "outcome"],
    registry=REGISTRY,
)
SEARCH_ENGINE_SECONDS = Histogram(
    "egress_gateway_search_engine_seconds",
    "Latency of one engine attempt.",
    ["engine"],
    buckets=_LATENCY_BUCKETS_S,
    registry=REGISTRY,
)
SEARCH_RESULTS = Histogram(
    "egress_gateway_search_results",
    "Results returned per successful search, by engine.",
    ["engine"],
    buckets=(0, 1, 2, 5, 10, 15, 20),
    registry=REGISTRY,
)
BUDGET_DENIALS = Counter(
    "egress_gateway_budget_denials_total",
    "Budget denials by tool and code.",
    ["tool", "code"],
    registry=REGISTRY,
)
STORE_UP = Gauge(
    "egress_gateway_store_up",
    "1 when the budget store answers, 0 when it does not.",
    registry=REGISTRY,
)
# On the loop: every close audit line counts its outcome (prometheus_client's lock was ~3 k
# instructions a tunnel).
OUTCOMES = LoopCounter(
    "egress_gateway_outcomes_total",
    "What happened after the verdict, by kind and outcome (ok, denied, dns_error, upstream_error, timeout, ...).",
    ["kind", "outcome"],
    registry=REGISTRY,
)
OPEN_FILES_LIMIT = Gauge(
    "egress_gateway_open_files_limit",
    "The process's open-files soft limit (RLIMIT_NOFILE) after start raised it to the hard limit.",
    registry=REGISTRY,
)
LISTENER_REFUSED = Counter(
    "egress_gateway_listener_connections_refused_total",
    "Connections closed at accept because the listener (api, admin) was at its connection cap.",
    ["listener"],
    registry=REGISTRY,
)
# On the loop: an agent retrying with a wrong credential counts one per attempt.
AUTH_FAILURES = LoopCounter(
    "egress_gateway_auth_failures_total",
    "Requests refused for a missing or wrong credential (bearer or run token), by kind.",
    ["kind"],
    registry=REGISTRY,
)
AUDIT_WRITE_FAILURES = Counter(
    "egress_gateway_audit_write_failures_total",
    "Failed writes of the audit log (each retry counts).",
    registry=REGISTRY,
)
AUDIT_WRITABLE = Gauge(
    "egress_gateway_audit_writable",
    "1 while the audit log can be written, 0 while writes fail.",
    registry=REGISTRY,
)
# On the loop: one per repeated denial (a retry loop's cost); unlabelled, its one child exists
# from the start, as prometheus_client's counter would be exported at zero.
AUDIT_AGGREGATED_LINES = LoopCounter(
    "egress_gateway_audit_aggregated_lines_total",
    "Repeated identical denials counted into a `repeated` audit line instead of written one by one.",
    (),
    registry=REGISTRY,
)
AUDIT_AGGREGATED_LINES.labels()
TUNNEL_LIMIT_HITS = Counter(
    "egress_gateway_tunnel_limit_hits_total",
    "CONNECT requests refused by a tunnel limit, by scope (gateway, principal).",
    ["scope"],
    registry=REGISTRY,
)
SCAN_FINDINGS = Counter(
    "egress_gateway_scan_findings_total",
    "Outbound secret-scanner findings by tier (1 held values and placeholders, 2 token formats, 3 broader), "
    "action taken (deny, report) and where they were found (url, header, body, query, dns).",
    ["tier", "action", "where"],
    registry=REGISTRY,
)
SCAN_SKIPPED_BYTES = Counter(
    "egress_gateway_scan_unscanned_bodies_total",
    "Request bodies the scanner stopped reading at its window (the rest was sent unscanned), by kind.",
    ["kind"],
    registry=REGISTRY,
)
# Credential names are never labels (a policy may list hundreds, and a name says what an agent
# can reach): injections and scrubs are counted by how, the audit line names which.
CREDENTIAL_INJECTIONS = Counter(
    "egress_gateway_credential_injections_total",
    "Real credential values injected into inspected requests, by injection kind (bearer, basic, header).",
    ["inject"],
    registry=REGISTRY,
)
CREDENTIAL_SCRUBS = Counter(
    "egress_gateway_credential_scrubs_total",
    "Real credential values replaced by their placeholder in responses of bound hosts (head and body window), "
    "by where (response).",
    ["where"],
    registry=REGISTRY,
)
INSPECTED_REQUESTS = LoopCounter(
    "egress_gateway_inspected_requests_total",
    "Requests judged by inspect rules (inside terminated TLS, plain HTTP, web_fetch), by decision (allow, deny, "
    "would_deny) and code (the refusal's code, `none` for allow).",
    ["decision", "code"],
    registry=REGISTRY,
)
INSPECT_HANDSHAKE_FAILURES = Counter(
    "egress_gateway_inspect_handshake_failures_total",
    "Terminations of an inspected host that failed before any request, by code (tls_untrusted, "
    "inspection_unsupported, host_mismatch, invalid_input).",
    ["code"],
    registry=REGISTRY,
)
INSPECT_LEAF_MINTS = Counter(
    "egress_gateway_inspect_leaf_mints_total",
    "Leaf certificates minted for inspected hosts.",
    registry=REGISTRY,
)
INSPECT_LEAF_CACHE = Gauge(
    "egress_gateway_inspect_leaf_cache_hosts",
    "Inspected hosts whose server TLS context is cached.",
    registry=REGISTRY,
)
BUILD_INFO = Gauge(
    "egress_gateway_build_info",
    "Always 1; labels carry the gateway version and the sha256 of the policy file in force.",
    ["version", "policy_sha256"],
    registry=REGISTRY,
)


def set_build_info(policy_sha256: str) -> None:
    """One series for the version and policy in force (the previous policy's series is removed)."""
    BUILD_INFO.clear()
    BUILD_INFO.labels(version=__version__, policy_sha256=policy_sha256).set(1)
