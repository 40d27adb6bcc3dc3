"""One frozen `Settings` object built once from CLI flags, EGRESS_* variables and a settings file.

Flags win over the environment, which wins over the `--config` file (YAML or TOML, keys are the
variable names without `EGRESS_` in lower case, nested sections joined with `_`). An EGRESS_*
variable or file key that no setting reads is an error naming the closest known setting. No other
module reads `os.environ`: settings are passed down.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, ItemsView, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from gateway.errors import ErrorCode, GatewayError

DEFAULT_ENGINES = ("tavily", "exa", "brave_api", "duckduckgo", "bing", "brave")
# The uid the chart runs the gateway container as; the redirect rules exempt exactly this uid.
DEFAULT_GATEWAY_UID = 15337
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
    redis_ca_bundle: str | None = None
    redis_min_replicas: int = 0
    run_token_secret: str | None = None
    # Transparent interception (gateway/transparent, gateway/dnsguard, gateway/redirect): off when empty.
    transparent_listen: tuple[ListenAddress, ...] = ()
    dns_listen: tuple[ListenAddress, ...] = ()
    gateway_uid: int = DEFAULT_GATEWAY_UID
    redirect_exclude_cidrs: tuple[str, ...] = ()
    redirect_exclude_ports: tuple[int, ...] = ()
    audit_on_failure: str = "deny"
    audit_max_bytes: int = 0
    audit_keep_files: int = 5
    audit_aggregate_s: float = 10.0
    extract_workers: int = 1
    extract_idle_exit_s: float = 60.0
    audit_http_paths: bool = True
    # The gateway's whole environment, for credential sources of kind `env` (the policy names the
    # variables, so they are not known here). Never printed: `__repr__` leaves it out.
    secret_env: Mapping[str, str] = field(default_factory=dict)
    # Inspection (issue 25): the interception CA (a file or a mounted Secret) and where leaf files
    # live for the instant `load_cert_chain` reads them (default: a fresh 0700 temporary directory).
    inspect_ca_cert: str | None = None
    inspect_ca_key: str | None = None
    inspect_leaf_dir: str | None = None

    def __repr__(self) -> str:
        return (
            f"Settings(policy_path={self.policy_path!r}, proxy={self.proxy_listen}, api={self.api_listen}, "
            f"admin={self.admin_listen}, nameservers={self.nameservers!r}, "
            f"redis={'set' if self.redis_url else 'unset'})"
        )

    @property
    def listen_addresses(self) -> tuple[ListenAddress, ...]:
        return (self.proxy_listen, self.api_listen, self.admin_listen, *self.transparent_listen, *self.dns_listen)


def parse_listen_list(text: str | None, setting: str) -> tuple[ListenAddress, ...]:
    """A comma list of IP:PORT (`127.0.0.1:15001,[::1]:15001`); empty means off."""
    return tuple(parse_listen(item, setting) for item in _split_list(text))


def _redirect_settings(pick: Callable[[str, str], str | None]) -> dict[str, Any]:
    """The gateway uid and the redirect exclusions, shared by `serve` and `redirect`."""
    uid_text = pick("gateway_uid", "EGRESS_GATEWAY_UID") or str(DEFAULT_GATEWAY_UID)
    if not uid_text.isdigit() or not 0 < int(uid_text) < 2**32 - 1:
        raise GatewayError(ErrorCode.INVALID_INPUT, f"EGRESS_GATEWAY_UID: {uid_text!r} is not a non-root uid")
    cidrs = _split_list(pick("exclude_cidrs", "EGRESS_REDIRECT_EXCLUDE_CIDRS"))
    for cidr in cidrs:
        try:
            ipaddress.ip_network(cidr, strict=True)
        except ValueError:
            raise GatewayError(
                ErrorCode.INVALID_INPUT, f"EGRESS_REDIRECT_EXCLUDE_CIDRS: {cidr!r} is not a CIDR network"
            ) from None
    ports: list[int] = []
    for text in _split_list(pick("exclude_ports", "EGRESS_REDIRECT_EXCLUDE_PORTS")):
        if not text.isdigit() or not 1 <= int(text) <= 65535:
            raise GatewayError(ErrorCode.INVALID_INPUT, f"EGRESS_REDIRECT_EXCLUDE_PORTS: {text!r} is not a port")
        ports.append(int(text))
    return {"gateway_uid": int(uid_text), "redirect_exclude_cidrs": cidrs, "redirect_exclude_ports": tuple(ports)}


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


MIN_RUN_TOKEN_SECRET_CHARS = 32


def _redis_min_replicas(text: str | None) -> int:
    if not text:
        return 0
    if not text.isdigit() or int(text) > 16:
        raise GatewayError(ErrorCode.INVALID_INPUT, f"EGRESS_REDIS_MIN_REPLICAS: {text!r} is not 0-16")
    return int(text)


def _run_token_secret(text: str | None) -> str | None:
    if not text:
        return None
    if len(text) < MIN_RUN_TOKEN_SECRET_CHARS:
        raise GatewayError(
            ErrorCode.INVALID_INPUT, f"EGRESS_RUN_TOKEN_SECRET must be at least {MIN_RUN_TOKEN_SECRET_CHARS} characters"
        )
    return text


DEFAULT_POLICY = "policies/default.yaml"
# The source tree's copy, for a command run from another directory (`.venv/bin/egress-gateway check`).
_SOURCE_POLICY = Path(__file__).resolve().parent.parent / DEFAULT_POLICY


def default_policy_path() -> str:
    """`policies/default.yaml` of the working directory, else of the source tree it runs from."""
    if not Path(DEFAULT_POLICY).exists() and _SOURCE_POLICY.exists():
        return str(_SOURCE_POLICY)
    return DEFAULT_POLICY


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


def _switch(text: str | None, setting: str, *, default: bool) -> bool:
    if text is None or not text.strip():
        return default
    value = text.strip().lower()
    if value in {"on", "true", "yes", "1"}:
        return True
    if value in {"off", "false", "no", "0"}:
        return False
    raise GatewayError(ErrorCode.INVALID_INPUT, f"{setting}: {text!r} is not on or off")


def _audit_on_failure(text: str | None) -> str:
    value = (text or "deny").strip().lower()
    if value not in {"deny", "allow"}:
        raise GatewayError(ErrorCode.INVALID_INPUT, f"EGRESS_AUDIT_ON_FAILURE: {text!r} is not deny or allow")
    return value


# `egress-gateway mcp --connect` credentials, read by the CLI (never on its command line).
CONNECT_TOKEN_VARIABLE = "EGRESS_CONNECT_TOKEN"  # noqa: S105 - a variable's name
CONNECT_RUN_TOKEN_VARIABLE = "EGRESS_CONNECT_RUN_TOKEN"  # noqa: S105 - a variable's name
# Read by the CLI itself, not by load_settings.
_CLI_VARIABLES = frozenset({"EGRESS_CONFIG", CONNECT_TOKEN_VARIABLE, CONNECT_RUN_TOKEN_VARIABLE})


class _ReadRecorder(Mapping[str, str]):
    """The environment, remembering which names a setting looked up: whatever EGRESS_* name
    nobody read is a typo (the list of known names is what load_settings reads, never a copy)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = env
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return self._env[key]

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return key in self._env

    def __iter__(self) -> Iterator[str]:
        return iter(self._env)

    def items(self) -> ItemsView[str, str]:
        # Scanning for a pattern (EGRESS_SEARCH_<ENGINE>_KEY) is not reading every name.
        return self._env.items()

    def __len__(self) -> int:
        return len(self._env)


def closest_setting(name: str, known: Sequence[str]) -> str | None:
    """The known setting an unknown `EGRESS_*` name most likely meant, or None.

    Names are compared word by word (`AUDIT_FILE` is two words): the most words in common first,
    then the same number of words, then the spelling. Letter similarity alone picks
    `EGRESS_AUDIT_ON_FAILURE` for `EGRESS_AUDIT_FILE`, where `EGRESS_AUDIT_LOG` is meant.
    """
    import difflib  # noqa: PLC0415 - only a refused setting needs it

    # Compared without the shared prefix, which would make every name look alike.
    wanted = name.removeprefix("EGRESS_")
    words = wanted.split("_")

    def closeness(candidate: str) -> tuple[int, bool, float]:
        theirs = candidate.removeprefix("EGRESS_").split("_")
        return (
            len(set(words) & set(theirs)),
            len(theirs) == len(words),
            difflib.SequenceMatcher(None, wanted, candidate.removeprefix("EGRESS_")).ratio(),
        )

    best = max(known, key=closeness, default=None)
    if best is None:
        return None
    shared, _, ratio = closeness(best)
    return best if shared > 0 or ratio >= 0.6 else None


def _reject_unknown(env: _ReadRecorder, file_keys: Mapping[str, str]) -> None:
    known = sorted(name for name in env.read | _CLI_VARIABLES if name.startswith("EGRESS_"))
    for name in sorted(env):
        if not name.startswith("EGRESS_") or name in env.read or name in _CLI_VARIABLES:
            continue
        if _ENGINE_SETTING.match(name):
            continue
        suggestion = closest_setting(name, known)
        close = [suggestion] if suggestion is not None else []
        hint = f" (did you mean {close[0]}?)" if close else ""
        if name in file_keys:
            origin = f"settings file key {file_keys[name]!r}"
            hint = f" (did you mean {close[0].removeprefix('EGRESS_').lower()}?)" if close else ""
        else:
            origin = name
        raise GatewayError(ErrorCode.INVALID_INPUT, f"{origin} is not a known setting{hint}")


def _nameservers(text: str | None) -> tuple[str, ...]:
    """`host[:port]` items with host an IP address (the resolver never resolves its own servers)."""
    servers = _split_list(text)
    for server in servers:
        host, port_text = server, ""
        if server.startswith("["):
            host, _, port_text = server[1:].partition("]")
            port_text = port_text.removeprefix(":")
        elif server.count(":") == 1:
            host, _, port_text = server.partition(":")
        try:
            ipaddress.ip_address(host)
            port = int(port_text) if port_text else 53
        except ValueError:
            raise GatewayError(
                ErrorCode.INVALID_INPUT, f"EGRESS_NAMESERVERS: {server!r} is not IP[:PORT] (e.g. 10.0.0.10:53)"
            ) from None
        if not 1 <= port <= 65535:
            raise GatewayError(ErrorCode.INVALID_INPUT, f"EGRESS_NAMESERVERS: {server!r} has a port out of range")
    return servers


def _flatten(document: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in document.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{name}_")
        else:
            yield name, value


def _file_value(value: Any) -> str:
    if isinstance(value, bool):
        # YAML reads an unquoted `off` as false: `audit_log: off` means the documented `off`.
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def read_settings_file(path: str) -> dict[str, str]:
    """A YAML or TOML settings file as EGRESS_* variables ({"audit": {"on_failure": "deny"}} →
    EGRESS_AUDIT_ON_FAILURE=deny). Raises invalid_input with the file and the problem."""
    import tomllib  # noqa: PLC0415 - only a --config file needs it

    try:
        raw = Path(path).read_bytes()
        document = tomllib.loads(raw.decode()) if path.endswith(".toml") else yaml.safe_load(raw)
    except OSError as exc:
        raise GatewayError(ErrorCode.INVALID_INPUT, f"--config {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, yaml.YAMLError, UnicodeDecodeError) as exc:
        reason = " ".join(str(exc).split())
        raise GatewayError(ErrorCode.INVALID_INPUT, f"--config {path}: not valid YAML/TOML: {reason}") from None
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise GatewayError(ErrorCode.INVALID_INPUT, f"--config {path}: the file must be a mapping of settings")
    return {f"EGRESS_{name.upper()}": _file_value(value) for name, value in _flatten(document)}


def load_settings(
    env: Mapping[str, str],
    flags: Mapping[str, str | None] | None = None,
    *,
    settings_file: Mapping[str, str] | None = None,
) -> Settings:
    """Build Settings from the settings file, then the environment, then flags (each wins over the
    one before). Raises invalid_input, naming the setting."""
    from_file = {name: name.removeprefix("EGRESS_").lower() for name in settings_file or {} if name not in env}
    recorder = _ReadRecorder({**(settings_file or {}), **env})
    settings = _build(recorder, flags or {})
    _reject_unknown(recorder, from_file)
    return settings


def _build(env: Mapping[str, str], flags: Mapping[str, str | None]) -> Settings:

    def pick(flag: str, var: str, default: str | None = None) -> str | None:
        from_env = env.get(var)  # read even when a flag wins: it is a known name, not a typo
        value = flags.get(flag)
        if value is not None:
            return value
        return from_env or default

    log_level = (pick("log_level", "EGRESS_LOG_LEVEL", "info") or "info").lower()
    if log_level not in {"debug", "info", "warning", "error"}:
        raise GatewayError(
            ErrorCode.INVALID_INPUT, f"EGRESS_LOG_LEVEL: {log_level!r} is not debug, info, warning or error"
        )
    return Settings(
        policy_path=pick("policy", "EGRESS_POLICY") or default_policy_path(),
        proxy_listen=parse_listen(
            pick("proxy_listen", "EGRESS_PROXY_LISTEN", "127.0.0.1:3128") or "", "EGRESS_PROXY_LISTEN"
        ),
        api_listen=parse_listen(pick("api_listen", "EGRESS_API_LISTEN", "127.0.0.1:8080") or "", "EGRESS_API_LISTEN"),
        admin_listen=parse_listen(
            pick("admin_listen", "EGRESS_ADMIN_LISTEN", "127.0.0.1:9090") or "", "EGRESS_ADMIN_LISTEN"
        ),
        nameservers=_nameservers(pick("nameservers", "EGRESS_NAMESERVERS")),
        ca_bundle=pick("ca_bundle", "EGRESS_CA_BUNDLE"),
        redis_url=pick("redis_url", "EGRESS_REDIS_URL"),
        audit_log=pick("audit_log", "EGRESS_AUDIT_LOG", "-") or "-",
        log_level=log_level,
        user_agent=env.get("EGRESS_USER_AGENT") or DEFAULT_USER_AGENT,
        search=_search_settings(env),
        fetch_reader_url=env.get("EGRESS_FETCH_READER_URL") or None,
        fetch_reader_key=env.get("EGRESS_FETCH_READER_KEY") or None,
        redis_ca_bundle=env.get("EGRESS_REDIS_CA_BUNDLE") or None,
        redis_min_replicas=_redis_min_replicas(env.get("EGRESS_REDIS_MIN_REPLICAS")),
        run_token_secret=_run_token_secret(env.get("EGRESS_RUN_TOKEN_SECRET")),
        transparent_listen=parse_listen_list(
            pick("transparent_listen", "EGRESS_TRANSPARENT_LISTEN"), "EGRESS_TRANSPARENT_LISTEN"
        ),
        dns_listen=parse_listen_list(pick("dns_listen", "EGRESS_DNS_LISTEN"), "EGRESS_DNS_LISTEN"),
        **_redirect_settings(pick),
        audit_on_failure=_audit_on_failure(pick("audit_on_failure", "EGRESS_AUDIT_ON_FAILURE")),
        audit_max_bytes=int(_number(env.get("EGRESS_AUDIT_MAX_BYTES"), "EGRESS_AUDIT_MAX_BYTES", 0, integer=True)),
        audit_keep_files=int(_number(env.get("EGRESS_AUDIT_KEEP_FILES"), "EGRESS_AUDIT_KEEP_FILES", 5, integer=True)),
        audit_aggregate_s=_number(env.get("EGRESS_AUDIT_AGGREGATE_S"), "EGRESS_AUDIT_AGGREGATE_S", 10.0),
        extract_workers=int(_number(env.get("EGRESS_EXTRACT_WORKERS"), "EGRESS_EXTRACT_WORKERS", 1, integer=True)),
        extract_idle_exit_s=_number(env.get("EGRESS_EXTRACT_IDLE_EXIT_S"), "EGRESS_EXTRACT_IDLE_EXIT_S", 60.0),
        audit_http_paths=_switch(env.get("EGRESS_AUDIT_HTTP_PATHS"), "EGRESS_AUDIT_HTTP_PATHS", default=True),
        secret_env=MappingProxyType(dict(env.items())),
        inspect_ca_cert=pick("inspect_ca_cert", "EGRESS_INSPECT_CA_CERT"),
        inspect_ca_key=pick("inspect_ca_key", "EGRESS_INSPECT_CA_KEY"),
        inspect_leaf_dir=env.get("EGRESS_INSPECT_LEAF_DIR") or None,
    )
