"""What the findings of one outbound request mean: misuse, a secret to block, or a note to audit.

Pure: a snapshot of held secrets, the request's facts (principal, scheme, host, port, method,
path) and the scanner's findings in; a `Screening` out. The rules (issue 26):
- a placeholder inside its credential's binding is what the agent is meant to send: no finding;
- a placeholder anywhere else is `credential_misuse` (403), whatever the scan settings: that is
  an exfiltration attempt by definition;
- a held secret's real value is tier 1, a token format tier 2 or 3: each tier's action
  (`deny` or `report`) is the principal's `scan:` section (or the defaults'); `deny` refuses
  the request with `secret_detected` (`credential_misuse` for a real value of a held secret).
Also decides which credentials are bound to a request (`bound_to`), for injection and
`require: true`. Never reads a value's bytes, never writes a line or a metric.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gateway.credentials.store import HeldCredential, HeldSecrets
from gateway.errors import ErrorCode, GatewayError
from gateway.policy.decide import glob_matches
from gateway.policy.model import CredentialBinding, Policy, Principal, ScanSettings
from gateway.scan.scanner import Finding

# Without a `scan:` section the gateway still looks for the secrets it holds and their
# placeholders (tier 1, deny); the token formats (tiers 2 and 3) are off.
HELD_ONLY = ScanSettings(tier1="deny", tier2="off", tier3="off")


@dataclass(frozen=True, slots=True)
class RequestFacts:
    kind: str  # http | https | transparent | fetch | search | dns
    principal: str
    scheme: str  # http | https ("" where there is none: a search query, a DNS name)
    host: str | None
    port: int | None
    method: str | None = None
    path: str | None = None  # without the query


@dataclass(slots=True)
class Screening:
    """The verdict over one request's findings."""

    reported: list[Finding] = field(default_factory=list)  # audited, allowed
    denied: list[Finding] = field(default_factory=list)  # audited, the reason for `refusal`
    refusal: GatewayError | None = None

    @property
    def clean(self) -> bool:
        return not self.reported and not self.denied


def scan_settings_for(policy: Policy, principal: Principal) -> ScanSettings:
    return policy.scan_for(principal) or HELD_ONLY


def path_matches(glob: str, path: str) -> bool:
    """`*` matches within one segment, `**` any number of segments (zero included); anchored."""
    return _segments_match(glob.strip("/").split("/"), path.strip("/").split("/"))


def _segments_match(globs: list[str], parts: list[str]) -> bool:
    if not globs:
        return not parts
    head, rest = globs[0], globs[1:]
    if head == "**":
        return any(_segments_match(rest, parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and _segment_matches(head, parts[0]) and _segments_match(rest, parts[1:])


def _segment_matches(glob: str, part: str) -> bool:
    pieces = glob.split("*")
    if len(pieces) == 1:
        return glob == part
    if not part.startswith(pieces[0]) or not part.endswith(pieces[-1]):
        return False
    position = len(pieces[0])
    end = len(part) - len(pieces[-1])
    for piece in pieces[1:-1]:
        found = part.find(piece, position, end)
        if found < 0:
            return False
        position = found + len(piece)
    return position <= end


def binding_holds(bind: CredentialBinding, facts: RequestFacts) -> bool:
    """Whether a request with these facts is inside the binding (https, host, port, method,
    path, principal)."""
    if facts.scheme != "https" or facts.host is None or facts.port not in bind.ports:
        return False
    if bind.principals and facts.principal not in bind.principals:
        return False
    if not any(glob_matches(glob, facts.host) for glob in bind.hosts):
        return False
    if bind.methods and (facts.method or "").upper() not in bind.methods:
        return False
    return not bind.paths or (facts.path is not None and any(path_matches(g, facts.path) for g in bind.paths))


def host_is_bound(held: HeldSecrets, host: str, port: int) -> bool:
    """Whether any credential names this host and port (a bound host is always inspected)."""
    return any(
        port in c.rule.bind.ports and any(glob_matches(glob, host) for glob in c.rule.bind.hosts)
        for c in held.by_name.values()
    )


def bound_to(held: HeldSecrets, facts: RequestFacts) -> tuple[HeldCredential, ...]:
    return tuple(c for c in held.by_name.values() if binding_holds(c.rule.bind, facts))


def _where(finding: Finding) -> str:
    return f"header {finding.header}" if finding.header else finding.where


def judge(findings: Iterable[Finding], held: HeldSecrets, facts: RequestFacts, scan: ScanSettings) -> Screening:
    """The verdict over `findings` for a request with `facts`."""
    screening = Screening()
    bound: set[str] | None = None
    for finding in findings:
        if finding.rule == "tier1.placeholder":
            if bound is None:
                bound = {c.name for c in bound_to(held, facts)}
            if finding.credential in bound:
                continue  # sent where it belongs: injection swaps it
            screening.denied.append(finding)
            if screening.refusal is None or screening.refusal.code != ErrorCode.CREDENTIAL_MISUSE:
                screening.refusal = GatewayError(
                    ErrorCode.CREDENTIAL_MISUSE,
                    f"the placeholder of credential {finding.credential!r} was sent outside its binding "
                    f"(in the {_where(finding)}); it is only ever sent to its bound hosts",
                    rule="credentials",
                )
            continue
        action = (scan.tier1, scan.tier2, scan.tier3)[min(finding.tier, 3) - 1]
        if action == "off":
            continue
        if action == "report":
            screening.reported.append(finding)
            continue
        screening.denied.append(finding)
        if screening.refusal is None:
            if finding.rule == "tier1.secret_value":
                screening.refusal = GatewayError(
                    ErrorCode.CREDENTIAL_MISUSE,
                    f"the value of credential {finding.credential!r} was found in the {_where(finding)}",
                    rule="credentials",
                )
            else:
                screening.refusal = GatewayError(
                    ErrorCode.SECRET_DETECTED,
                    f"a secret ({finding.rule}) was found in the {_where(finding)}",
                    rule="scan",
                )
    return screening
