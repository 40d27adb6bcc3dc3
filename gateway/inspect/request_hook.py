"""The per-request hook of an inspected connection: one request head in, a judgement out.

`judge_inspected_request` is the one function every request inside terminated TLS (and every
plain HTTP request to an inspected host) passes before a byte of it goes upstream. Today it
checks that the request names the host the connection was decided for (`host_mismatch`: a
fronting attempt) and applies the inspect rules (`policy.inspect_decide`). It returns the
verdict and the field lines the upstream head carries, so the credential work (issue 26) can
rewrite them (inject a credential, strip a placeholder) in this one place. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import ErrorCode, GatewayError
from gateway.policy.inspect_decide import RequestFacts, RequestVerdict, decide_request
from gateway.policy.model import Policy, Principal


@dataclass(frozen=True, slots=True)
class InspectedRequest:
    """A request head as the agent sent it inside an inspected connection."""

    host: str  # the name the connection was decided for (the CONNECT host, the SNI)
    port: int
    tls: bool
    method: str
    target: str  # as sent: origin-form, or absolute-form naming the same host
    headers: tuple[tuple[str, str], ...]
    fields: bytes  # the end-to-end field lines the upstream head will carry


@dataclass(frozen=True, slots=True)
class RequestJudgement:
    verdict: RequestVerdict
    origin_form: str  # the target as the upstream gets it
    fields: bytes  # possibly rewritten field lines for the upstream head


def _authority_matches(authority: str, host: str, port: int) -> bool:
    """`name`, `name:port`, `[v6]` or `[v6]:port` naming exactly `host` (and `port` if given)."""
    text = authority.strip().lower()
    if text.startswith("["):
        name, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else rest
    else:
        name, _, port_text = text.partition(":")
    if name.rstrip(".") != host:
        return False
    return not port_text or (port_text.isdigit() and int(port_text) == port)


def origin_form_for(request: InspectedRequest) -> str:
    """The origin-form target, refusing (`host_mismatch`) any Host or absolute authority that
    is not the connection's host: inside TLS for one name, a request for another is fronting."""
    hosts = [value for name, value in request.headers if name.lower() == "host"]
    if len(hosts) != 1:
        raise GatewayError(ErrorCode.HOST_MISMATCH, "an inspected request needs exactly one Host header")
    if not _authority_matches(hosts[0], request.host, request.port):
        raise GatewayError(
            ErrorCode.HOST_MISMATCH, f"the request's Host is not {request.host}, the host this connection is for"
        )
    target = request.target
    if target.startswith(("/", "*")):
        return target
    scheme, sep, rest = target.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise GatewayError(ErrorCode.INVALID_INPUT, "the request target is neither origin-form nor an http(s) URL")
    authority, slash, path = rest.partition("/")
    if "@" in authority or not _authority_matches(authority, request.host, request.port):
        raise GatewayError(
            ErrorCode.HOST_MISMATCH, f"the request's URL names another host than {request.host}, this connection's"
        )
    return slash + path if slash else "/"


def judge_inspected_request(policy: Policy, principal: Principal, request: InspectedRequest) -> RequestJudgement:
    """The hook: Host check, then the rules, under the policy in force for this request."""
    origin_form = origin_form_for(request)
    facts = RequestFacts(request.host, request.port, request.tls, request.method, origin_form, request.headers)
    return RequestJudgement(decide_request(policy, principal, facts), origin_form, request.fields)
