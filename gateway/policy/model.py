"""Typed policy objects (DESIGN.md section 4), immutable once loaded.

A `Policy` is a value: the decision functions take it as an argument, and a reload replaces it
whole with a higher generation. Never touches a file or a socket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from gateway.policy.request_rules import InspectEntry
from gateway.vet.addresses import IPAddress, IPNetwork

Mode = Literal["enforce", "report"]
SniMode = Literal["require", "match-if-present", "off"]
RobotsMode = Literal["respect", "ignore"]
DestinationMode = Literal["follow-name", "strict"]
DnsDeniedAnswer = Literal["nxdomain", "refused"]
ScanAction = Literal["deny", "report", "off"]
InjectionKind = Literal["bearer", "basic", "header"]
SecretSourceKind = Literal["env", "file"]


@dataclass(frozen=True, slots=True)
class InternalHostRule:
    """Lets one named host resolve into an internal range, without opening it to other names."""

    host: str
    cidrs: tuple[IPNetwork, ...]


@dataclass(frozen=True, slots=True)
class EgressRule:
    allow_domains: tuple[str, ...] = ()
    deny_domains: tuple[str, ...] = ()
    internal_hosts: tuple[InternalHostRule, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolSwitches:
    search: bool = False
    fetch: bool = False


DEFAULT_MAX_LIVE_IDS = 1000
# Window quotas: name, length. Windows are fixed and aligned to the store's clock (a minute
# window is one clock minute), so a burst across a boundary can take up to two windows' worth;
# the next shorter window bounds that burst.
WINDOWS: tuple[tuple[str, float], ...] = (("minute", 60.0), ("hour", 3600.0), ("day", 86_400.0))


@dataclass(frozen=True, slots=True)
class ToolLimits:
    """Budget limits for one tool of one principal, as the policy sets them.

    `per_step` and `per_run` bound reservations (attempts, not successes) within one
    `X-Egress-Step` and one `X-Egress-Run`; `concurrent` bounds unexpired leases;
    `min_interval_s` is the minimum time between two starts (0 means none); a lease that is never
    released (a crashed worker) frees its slot after `lease_ttl_s`. The budget stores take this
    value per call, so a reload changes the limits of the next call.

    `per_minute`, `per_hour` and `per_day` (issue 12) bound the principal's reservations of this
    tool in each window whatever ids a call carries (None: no such window); `max_live_ids` bounds
    how many run and step ids of the principal and tool are live (counted) at once.
    """

    per_step: int
    per_run: int
    concurrent: int
    min_interval_s: float
    lease_ttl_s: float = 45.0
    per_minute: int | None = None
    per_hour: int | None = None
    per_day: int | None = None
    max_live_ids: int = DEFAULT_MAX_LIVE_IDS

    def __post_init__(self) -> None:
        # A negative or NaN limit would silently turn a check off; refuse it when the policy loads.
        for name in ("per_step", "per_run", "concurrent", "max_live_ids", "per_minute", "per_hour", "per_day"):
            value = getattr(self, name)
            if value is None and name in ("per_minute", "per_hour", "per_day"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if not math.isfinite(self.min_interval_s) or self.min_interval_s < 0:
            raise ValueError(f"min_interval_s must be >= 0, got {self.min_interval_s!r}")
        if not math.isfinite(self.lease_ttl_s) or self.lease_ttl_s <= 0:
            raise ValueError(f"lease_ttl_s must be > 0, got {self.lease_ttl_s!r}")

    def window_limits(self) -> tuple[tuple[str, float, int], ...]:
        """(name, length in seconds, limit) of each window this tool has, shortest first."""
        out: list[tuple[str, float, int]] = []
        for name, length_s in WINDOWS:
            limit = getattr(self, f"per_{name}")
            if limit is not None:
                out.append((name, length_s, limit))
        return tuple(out)


# Issue 12's windows sit above what the per-run budgets and the search interval allow one run
# (search: 2 s apart is at most 30 a minute), so they bind only an agent that rotates ids.
DEFAULT_SEARCH_BUDGET = ToolLimits(
    per_step=20, per_run=100, concurrent=1, min_interval_s=2.0, per_minute=30, per_hour=300, per_day=2000
)
DEFAULT_FETCH_BUDGET = ToolLimits(
    per_step=40, per_run=200, concurrent=3, min_interval_s=0.0, per_minute=120, per_hour=1000, per_day=5000
)


@dataclass(frozen=True, slots=True)
class Budgets:
    search: ToolLimits = DEFAULT_SEARCH_BUDGET
    fetch: ToolLimits = DEFAULT_FETCH_BUDGET


DEFAULT_SCAN_WINDOW_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ScanSettings:
    """A `scan:` section (per principal, or in `defaults`): each tier's action and the body window.

    Tier 1 is the exact values the gateway holds (real secrets and their placeholders), tier 2
    high-confidence prefixed token formats, tier 3 a broader set and high-entropy URL parts. A
    placeholder outside its binding is refused whatever tier 1 says (`credential_misuse`)."""

    tier1: ScanAction = "deny"
    tier2: ScanAction = "deny"
    tier3: ScanAction = "report"
    body_window_bytes: int = DEFAULT_SCAN_WINDOW_BYTES


@dataclass(frozen=True, slots=True)
class SecretSource:
    """Where a real value is read from: a variable of the gateway's environment or a file (a
    mounted Secret), never the policy text itself."""

    kind: SecretSourceKind
    name: str  # the variable's name, or the file's path

    def describe(self) -> str:
        return f"{self.kind} {self.name}"


@dataclass(frozen=True, slots=True)
class PlaceholderShape:
    """A shape-preserving placeholder: `prefix`, the marker `egph`, then letters and digits up
    to `length` characters, for SDKs that check a key's format before sending it."""

    prefix: str
    length: int


@dataclass(frozen=True, slots=True)
class Injection:
    """Where the real value goes on a bound request: `Authorization: Bearer <value>`, Basic with
    the value as password (`username` as the user), or the value alone in the named header."""

    kind: InjectionKind
    header: str = "authorization"  # lower case; `header` injections name their own
    username: str = ""


@dataclass(frozen=True, slots=True)
class CredentialBinding:
    """Where a credential may be used: https only, hosts (globs), ports, optional methods and
    path globs (`*` inside one segment, `**` across), and the principals allowed (empty: all)."""

    hosts: tuple[str, ...]
    ports: tuple[int, ...] = (443,)
    methods: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    principals: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CredentialRule:
    """One `credentials.entries` item: the name audit lines use, the value's source, the
    placeholder's shape, where the value is injected, what it is bound to, and `require`
    (a request to a bound host without the placeholder is refused)."""

    name: str
    source: SecretSource
    inject: Injection
    bind: CredentialBinding
    require: bool = False
    shape: PlaceholderShape | None = None
    agent_env: str = ""  # the variable the agent reads the placeholder from

    @property
    def agent_variable(self) -> str:
        """`agent_env`, else the source's variable name, else the name in upper case."""
        if self.agent_env:
            return self.agent_env
        if self.source.kind == "env":
            return self.source.name
        return "".join(c if c.isalnum() else "_" for c in self.name.upper())


@dataclass(frozen=True, slots=True)
class CredentialSettings:
    """The `credentials:` section: the key placeholders are derived from, and the entries."""

    placeholder_key: SecretSource | None = None
    entries: tuple[CredentialRule, ...] = ()


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    token_sha256: str | None = None
    egress: EgressRule = field(default_factory=EgressRule)
    tools: ToolSwitches = field(default_factory=ToolSwitches)
    budgets: Budgets = field(default_factory=Budgets)
    mode: Mode | None = None
    scan: ScanSettings | None = None  # None: the defaults' `scan:` (or scanning off)
    # Hosts whose requests are judged one by one (issue 25); first matching entry wins.
    inspect: tuple[InspectEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class Orchestrator:
    """A trusted party that vouches for run ids by minting run tokens (`POST /v1/runs`).

    Its own credential (`token_sha256`), never shared with a principal: an agent holding only
    its principal token can name a run id but never make it count. `principals` lists whom it
    may mint for (`("*",)` for all); `max_ttl_s` caps a token's lifetime.
    """

    name: str
    token_sha256: str
    principals: tuple[str, ...] = ()
    max_ttl_s: float = 86_400.0

    def may_mint_for(self, principal: str) -> bool:
        return "*" in self.principals or principal in self.principals


@dataclass(frozen=True, slots=True)
class Defaults:
    mode: Mode = "enforce"
    ports: tuple[int, ...] = (80, 443)
    literal_ips: Literal["deny", "allow"] = "deny"
    allow_cidrs: tuple[IPNetwork, ...] = ()
    deny_cidrs: tuple[IPNetwork, ...] = ()
    scan: ScanSettings | None = None  # None: tiers 2 and 3 off unless a principal sets `scan:`
    # Inspect entries every principal has, after its own.
    inspect: tuple[InspectEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class FetchSettings:
    """The policy's `fetch:` section, and the caps the guarded client enforces on every call
    (web_search's engine requests use a copy with their own byte caps and no redirects)."""

    max_redirects: int = 4
    max_wire_bytes: int = 2 * 1024 * 1024
    max_decoded_bytes: int = 2 * 1024 * 1024
    deadline_s: float = 30.0
    max_headers: int = 100
    max_header_line_bytes: int = 16 * 1024
    max_source_chars: int = 400_000
    robots: RobotsMode = "respect"
    robots_cache_s: float = 3600.0
    max_pdf_bytes: int = 10 * 1024 * 1024
    max_pdf_pages: int = 200
    convert_timeout_s: float = 10.0


@dataclass(frozen=True, slots=True)
class SearchSettings:
    cache_ttl_s: float = 900.0
    deadline_s: float = 20.0
    max_retry_after_s: float = 60.0


@dataclass(frozen=True, slots=True)
class ProxySettings:
    sni: SniMode = "require"
    head_timeout_s: float = 10.0
    idle_timeout_s: float = 300.0
    max_tunnel_lifetime_s: float = 3600.0
    max_tunnels_per_principal: int = 256
    max_tunnels_total: int = 4096
    max_response_bytes: int = 100 * 1024 * 1024
    drain_grace_s: float = 20.0
    connect_timeout_s: float = 10.0
    # Plain HTTP forwarding: the upstream's response head, and the whole response, each within a
    # total deadline (an origin dripping a byte at a time is never idle long enough to time out).
    response_head_timeout_s: float = 300.0
    response_timeout_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class RawTcpRule:
    """One host:port the transparent listener may splice as raw TCP (no TLS or HTTP seen)."""

    host: str  # an IDNA name or an IP address as text
    ip: IPAddress | None
    port: int


@dataclass(frozen=True, slots=True)
class TransparentSettings:
    """The `transparent:` section: interception of redirected TCP and of the pod's DNS."""

    # uid -> principal name; each listed uid is redirected to a listener port of its own.
    principals: tuple[tuple[int, str], ...] = ()
    default_principal: str = "default"
    destination: DestinationMode = "follow-name"
    raw_tcp: tuple[RawTcpRule, ...] = ()
    dns_denied_answer: DnsDeniedAnswer = "nxdomain"
    dns_allow_types: tuple[str, ...] = ("A", "AAAA", "CNAME")

    def principal_for_uid(self, uid: int | None) -> str:
        for listed, name in self.principals:
            if listed == uid:
                return name
        return self.default_principal


@dataclass(frozen=True, slots=True)
class Policy:
    version: int
    defaults: Defaults
    principals: dict[str, Principal]
    fetch: FetchSettings = field(default_factory=FetchSettings)
    search: SearchSettings = field(default_factory=SearchSettings)
    proxy: ProxySettings = field(default_factory=ProxySettings)
    source: str = "<memory>"
    orchestrators: dict[str, Orchestrator] = field(default_factory=dict)
    transparent: TransparentSettings = field(default_factory=TransparentSettings)
    credentials: CredentialSettings = field(default_factory=CredentialSettings)

    @property
    def default_principal(self) -> Principal | None:
        return self.principals.get("default")

    def mode_for(self, principal: Principal) -> Mode:
        return principal.mode or self.defaults.mode

    def scan_for(self, principal: Principal) -> ScanSettings | None:
        """The principal's scan settings, else the defaults', else None (tiers 2 and 3 off)."""
        return principal.scan or self.defaults.scan


@dataclass(frozen=True, slots=True)
class LoadedPolicy:
    """A policy and the generation number it was loaded as."""

    policy: Policy
    generation: int
