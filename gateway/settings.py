"""One frozen `Settings` object built once from CLI flags and EGRESS_* environment variables.

Flags win over the environment. No other module reads `os.environ`: settings are passed down.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.errors import ErrorCode, GatewayError

DEFAULT_ENGINES = ("tavily", "exa", "brave_api", "duckduckgo", "bing", "brave")
DEFAULT_USER_AGENT = "egress-gateway/0.1 (+https://github.com/egress-gateway)"


@dataclass(frozen=True, slots=True)
class ListenAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(text: str, setting: str) -> ListenAddress:
    """`host:port` or `[v6]:port`, host an IP address (listeners never resolve names)."""
    host, sep, port_text = text.strip().rpartition(":")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
        port = int(port_text)
    except ValueError:
        raise GatewayError(ErrorCode.INVALID_INPUT, f"{setting}: {text!r} is not IP:PORT") from None
    if not sep or not 0 <= port <= 65535:
        raise GatewayError(ErrorCode.INVALID_INPUT, f"{setting}: {text!r} is not IP:PORT")
    return ListenAddress(host, port)


def _split_list(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    return tuple(item.strip() for item in text.split(",") if item.strip())


@dataclass(frozen=True, slots=True)
class SearchEngineSettings:
    engines: tuple[str, ...] = DEFAULT_ENGINES
    keys: Mapping[str, str] = field(default_factory=dict)
    urls: Mapping[str, str] = field(default_factory=dict)
    template_url: str | None = None
    template_key: str | None = None

    def __repr__(self) -> str:
        # Keys never appear in logs, even through a repr.
        return f"SearchEngineSettings(engines={self.engines!r}, keyed={sorted(self.keys)!r})"


@dataclass(frozen=True, slots=True)
class Settings:
    policy_path: str = "policies/default.yaml"
    proxy_listen: ListenAddress = ListenAddress("127.0.0.1", 3128)
    api_listen: ListenAddress = ListenAddress("127.0.0.1", 8080)
    admin_listen: ListenAddress = ListenAddress("127.0.0.1", 9090)
    nameservers: tuple[str, ...] = ()
    ca_bundle: str | None = None
    redis_url: str | None = None
    audit_log: str = "-"
    log_level: str = "info"
    user_agent: str = DEFAULT_USER_AGENT
    dns_timeout_s: float = 3.0
    search: SearchEngineSettings = field(default_factory=SearchEngineSettings)
    fetch_reader_url: str | None = None
    fetch_reader_key: str | None = None
    audit_on_failure: str = "deny"
    audit_max_bytes: int = 0
    audit_keep_files: int = 5
    audit_aggregate_s: float = 10.0
    extract_workers: int = 1
    extract_idle_exit_s: float = 60.0

    def __repr__(self) -> str:
        return (
            f"Settings(policy_path={self.policy_path!r}, proxy={self.proxy_listen}, api={self.api_listen}, "
            f"admin={self.admin_listen}, nameservers={self.nameservers!r}, "
            f"redis={'set' if self.redis_url else 'unset'})"
        )

    @property
    def listen_addresses(self) -> tuple[ListenAddress, ...]:
        return (self.proxy_listen, self.api_listen, self.admin_listen)


_ENGINE_SETTING = re.compile(r"^EGRESS_SEARCH_([A-Z0-9_]+)_(KEY|URL)$")


def _search_settings(env: Mapping[str, str]) -> SearchEngineSettings:
    """Engine order, keys and endpoints; the search registry validates the names when it builds."""
    keys: dict[str, str] = {}
    urls: dict[str, str] = {}
    for variable, value in env.items():
        match = _ENGINE_SETTING.match(variable)
        if match and value:
            (keys if match.group(2) == "KEY" else urls)[match.group(1).lower()] = value
    return SearchEngineSettings(
        engines=_split_list(env.get("EGRESS_SEARCH_ENGINES")) or DEFAULT_ENGINES,
        keys=keys,
        urls=urls,
        template_url=env.get("EGRESS_SEARCH_URL") or None,
        template_key=env.get("EGRESS_SEARCH_KEY") or None,
    )


def _number(text: str | None, setting: str, default: float, *, integer: bool = False) -> float:
    if text is None or not text.strip():
        return default
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        raise GatewayError(ErrorCode.INVALID_INPUT, f"{setting}: {text!r} is not a number") from None
    if value < 0:
        raise GatewayError(ErrorCode.INVALID_INPUT, f"{setting}: {text!r} must not be negative")
    return value


def _audit_on_failure(text: str | None) -> str:
    value = (text or "deny").strip().lower()
    if value not in {"deny", "allow"}:
        raise GatewayError(ErrorCode.INVALID_INPUT, f"EGRESS_AUDIT_ON_FAILURE: {text!r} is not deny or allow")
    return value


def load_settings(env: Mapping[str, str], flags: Mapping[str, str | None] | None = None) -> Settings:
    """Build Settings from the environment, then flags (which win). Raises invalid_input."""
    flags = flags or {}

    def pick(flag: str, var: str, default: str | None = None) -> str | None:
        value = flags.get(flag)
        if value is not None:
            return value
        return env.get(var) or default

    log_level = (pick("log_level", "EGRESS_LOG_LEVEL", "info") or "info").lower()
    if log_level not in {"debug", "info", "warning", "error"}:
        raise GatewayError(
            ErrorCode.INVALID_INPUT, f"EGRESS_LOG_LEVEL: {log_level!r} is not debug, info, warning or error"
        )
    return Settings(
        policy_path=pick("policy", "EGRESS_POLICY", "policies/default.yaml") or "policies/default.yaml",
        proxy_listen=parse_listen(
            pick("proxy_listen", "EGRESS_PROXY_LISTEN", "127.0.0.1:3128") or "", "EGRESS_PROXY_LISTEN"
        ),
        api_listen=parse_listen(pick("api_listen", "EGRESS_API_LISTEN", "127.0.0.1:8080") or "", "EGRESS_API_LISTEN"),
        admin_listen=parse_listen(
            pick("admin_listen", "EGRESS_ADMIN_LISTEN", "127.0.0.1:9090") or "", "EGRESS_ADMIN_LISTEN"
        ),
        nameservers=_split_list(pick("nameservers", "EGRESS_NAMESERVERS")),
        ca_bundle=pick("ca_bundle", "EGRESS_CA_BUNDLE"),
        redis_url=pick("redis_url", "EGRESS_REDIS_URL"),
        audit_log=pick("audit_log", "EGRESS_AUDIT_LOG", "-") or "-",
        log_level=log_level,
        user_agent=env.get("EGRESS_USER_AGENT") or DEFAULT_USER_AGENT,
        search=_search_settings(env),
        fetch_reader_url=env.get("EGRESS_FETCH_READER_URL") or None,
        fetch_reader_key=env.get("EGRESS_FETCH_READER_KEY") or None,
        audit_on_failure=_audit_on_failure(pick("audit_on_failure", "EGRESS_AUDIT_ON_FAILURE")),
        audit_max_bytes=int(_number(env.get("EGRESS_AUDIT_MAX_BYTES"), "EGRESS_AUDIT_MAX_BYTES", 0, integer=True)),
        audit_keep_files=int(_number(env.get("EGRESS_AUDIT_KEEP_FILES"), "EGRESS_AUDIT_KEEP_FILES", 5, integer=True)),
        audit_aggregate_s=_number(env.get("EGRESS_AUDIT_AGGREGATE_S"), "EGRESS_AUDIT_AGGREGATE_S", 10.0),
        extract_workers=int(_number(env.get("EGRESS_EXTRACT_WORKERS"), "EGRESS_EXTRACT_WORKERS", 1, integer=True)),
        extract_idle_exit_s=_number(env.get("EGRESS_EXTRACT_IDLE_EXIT_S"), "EGRESS_EXTRACT_IDLE_EXIT_S", 60.0),
    )
