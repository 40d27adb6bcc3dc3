"""Every Prometheus metric the gateway exports, defined in one place for review.

Prefix `egress_gateway_`, base units in names, `_total` on counters, bounded labels only
(decision, code, kind, engine, outcome, direction, tool): never a host, URL, principal, token or
client IP. Per-request detail belongs in the audit log.

The metrics the proxy updates per tunnel and per request are `LoopCounter`/`LoopHistogram`
(lock-free, event-loop thread only, same exposition); the rest are prometheus_client's own.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.observe.loop_metrics import LoopCounter, LoopHistogram

REGISTRY = CollectorRegistry(auto_describe=True)

_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_DURATION_BUCKETS_S = (0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0)
_SIZE_BUCKETS_BYTES = (256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 104857600)

DECISIONS = LoopCounter(
    "egress_gateway_decisions_total",
    "Egress decisions by kind (connect, http, fetch, search), decision and code.",
    ["kind", "decision", "code"],
    registry=REGISTRY,
)
DNS_LOOKUP_SECONDS = Histogram(
    "egress_gateway_dns_lookup_seconds",
    "Time to resolve a destination name.",
    buckets=_LATENCY_BUCKETS_S,
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
EVENT_LOOP_STALL_SECONDS = Histogram(
    "egress_gateway_event_loop_lag_seconds",
    "Observed event loop lag (scheduled vs actual wake-up).",
    buckets=_LATENCY_BUCKETS_S,
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
