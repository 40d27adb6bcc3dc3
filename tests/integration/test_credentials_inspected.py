"""Credential injection inside inspected TLS through the real daemon (issue 26).

An echo origin over TLS (the test PKI) reflects the request headers it received. The agent
(curl and httpx, trusting the interception CA only through the environment) sends the
placeholder; the origin receives the real value; the agent sees the placeholder echoed back, not
the value; the audit names the credential only. Basic and a named header, `require: true`,
rotation by swapping the file, a principal not allowed, and a host bound by a credential is
inspected without any `inspect` entry. WebSocket upgrade heads get the same guard: injected into
on a bound host (the 101's head scrubbed), refused with a placeholder off its binding or a tier-2
token in the query. Everything the gateway wrote is grepped for the value.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from gateway.policy.decide import token_digest
from tests.harness.inspection import InspectingGateway, InspectingGatewayFactory, InterceptionCA, tls_through
from tests.harness.origins import Origin, OriginFactory
from tests.harness.proxy import proxy_policy, read_head

BOUND = "api.bound.example"
UNBOUND = "ws.unbound.example"  # inspected by an `inspect` entry, bound by no credential
VALUE = "corp-" + "RealValue0" * 3 + "xyz"  # 38 characters, a shape no rule knows
ROTATED = "corp-" + "Rotated000" * 3 + "xyz"
AGENT_TOKEN = "agent-two-token"


def _echo_app(seen: list[dict[str, str]], upgrades: list[str]) -> web.Application:
    async def socket_echo(request: web.Request) -> web.StreamResponse:
        seen.append({k.lower(): v for k, v in request.headers.items()})
        upgrades.append(request.path)
        ws = web.WebSocketResponse()
        # The 101's head names what arrived: the agent must get it back scrubbed.
        ws.headers["X-Seen-Authorization"] = request.headers.get("Authorization", "")
        await ws.prepare(request)
        await ws.close()
        return ws

    async def echo(request: web.Request) -> web.Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        seen.append(headers)
        return web.json_response({"headers": headers, "path": request.path_qs})

    app = web.Application()
    app.router.add_get("/bearer/ws", socket_echo)
    app.router.add_get("/ws", socket_echo)
    app.router.add_route("*", "/{tail:.*}", echo)
    return app


class Bound:
    def __init__(
        self,
        gateway: InspectingGateway,
        ca: InterceptionCA,
        origin: Origin,
        seen: list[dict[str, str]],
        upgrades: list[str],
    ):
        self.gateway = gateway
        self.ca = ca
        self.origin = origin
        self.seen = seen
        self.upgrades = upgrades
        self.placeholders = self._placeholders()

    def _placeholders(self) -> dict[str, str]:
        printed = subprocess.run(
            [sys.executable, "-m", "gateway", "credentials", "placeholders", "--format", "json"],
            env=self.gateway.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
            cwd=self.gateway.workdir,
        )
        return {name: entry["placeholder"] for name, entry in json.loads(printed.stdout).items()}

    def url(self, path: str) -> str:
        return f"https://{BOUND}:{self.origin.port}{path}"

    def client(self, *, proxy_auth: str | None = None) -> httpx.Client:
        env = self.ca.agent_env(self.gateway.proxy_url)
        proxy = self.gateway.proxy_url
        if proxy_auth is not None:
            proxy = proxy.replace("http://", f"http://{proxy_auth}@")
        return httpx.Client(proxy=proxy, verify=ssl.create_default_context(cafile=env["SSL_CERT_FILE"]), timeout=10)

    def upgrade(self, host: str, target: str, authorization: str | None = None) -> bytes:
        """A WebSocket upgrade through CONNECT and the gateway's leaf (a raw TLS client, to read
        the answer head as the agent gets it); the bytes up to the head's end."""
        with tls_through(self.gateway, self.ca, self.origin, host=host, timeout_s=10) as tls:
            auth = f"Authorization: {authorization}\r\n" if authorization else ""
            tls.sendall(
                f"GET {target} HTTP/1.1\r\nHost: {host}:{self.origin.port}\r\n{auth}Connection: Upgrade\r\n"
                "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".encode()
            )
            return read_head(tls)

    def assert_nothing_leaked(self) -> None:
        captured = self.gateway.audit_path.read_text() + self.gateway.stderr()
        assert VALUE not in captured
        assert ROTATED not in captured
        for placeholder in self.placeholders.values():
            assert placeholder not in captured


def _policy(
    origin: Origin, secrets: Path, require: bool = False, default: dict[str, Any] | None = None
) -> dict[str, Any]:
    default = dict(default or {})
    # An `inspect` entry (`UNBOUND`'s) on the origin's port.
    if "inspect" in default:
        default["inspect"] = [{**entry, "ports": [origin.port]} for entry in default["inspect"]]
    policy = proxy_policy(
        [origin.cidr],
        ports=[80, 443, origin.port],
        principals={
            "default": {"egress": {"allow_domains": ["*"]}, **default},
            "two": {"token_sha256": token_digest(AGENT_TOKEN), "egress": {"allow_domains": ["*"]}},
        },
    )
    bind = {"hosts": [BOUND], "ports": [origin.port], "principals": ["default"]}
    policy["credentials"] = {
        "placeholder_key": {"file": str(secrets / "key")},
        "entries": [
            {
                "name": "bearer-api",
                "source": {"file": str(secrets / "value")},
                "inject": "bearer",
                # As long as the value: the echo comes back as exactly the placeholder.
                "placeholder": {"prefix": "corp-", "length": len(VALUE)},
                "bind": {**bind, "paths": ["/bearer/**"]},
                "require": require,
            },
            {
                "name": "basic-api",
                "source": {"file": str(secrets / "value")},
                "inject": {"basic": "robot"},
                "bind": {**bind, "paths": ["/basic/**"]},
            },
            {
                "name": "header-api",
                "source": {"file": str(secrets / "value")},
                "inject": {"header": "X-Api-Key"},
                "bind": {**bind, "paths": ["/header/**"]},
            },
        ],
    }
    return policy


@pytest.fixture
def make_bound(
    inspecting_gateway: InspectingGatewayFactory,
    interception_ca: InterceptionCA,
    origins: OriginFactory,
    tmp_path: Path,
) -> Callable[..., Bound]:
    def start(*, require: bool = False, default: dict[str, Any] | None = None) -> Bound:
        secrets = tmp_path / "secrets"
        secrets.mkdir(exist_ok=True)
        (secrets / "key").write_text(os.urandom(40).hex())
        (secrets / "value").write_text(VALUE + "\n")
        seen: list[dict[str, str]] = []
        upgrades: list[str] = []
        origin = origins.start(_echo_app(seen, upgrades), names=(BOUND, UNBOUND))
        gateway = inspecting_gateway(_policy(origin, secrets, require, default))
        return Bound(gateway, interception_ca, origin, seen, upgrades)

    return start


def test_bearer_placeholder_is_swapped_and_the_echo_comes_back_as_the_placeholder(
    make_bound: Callable[..., Bound],
) -> None:
    bound = make_bound()
    placeholder = bound.placeholders["bearer-api"]
    result = subprocess.run(
        ["curl", "-sS", "--max-time", "10", "-H", f"Authorization: Bearer {placeholder}", bound.url("/bearer/user")],
        env=bound.ca.agent_env(bound.gateway.proxy_url),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    echoed = json.loads(result.stdout)["headers"]
    assert echoed["authorization"] == f"Bearer {placeholder}"  # what the agent sees
    assert VALUE not in result.stdout
    assert bound.seen[-1]["authorization"] == f"Bearer {VALUE}"  # what the origin got
    lines = bound.gateway.wait_audit(lambda ls: sum(line["event"] == "security" for line in ls) >= 2, timeout_s=5)
    security = [line for line in lines if line["event"] == "security"]
    injected = [line for line in security if line["action"] == "inject"]
    assert [(line["credential"], line["injected_into"], line["kind"]) for line in injected] == [
        ("bearer-api", "authorization", "inspect")
    ]
    assert [line["scrubbed"] for line in security if line["action"] == "scrub"] == [1]
    bound.assert_nothing_leaked()


def test_basic_and_named_header_injection_replace_the_clients_own_header(make_bound: Callable[..., Bound]) -> None:
    bound = make_bound()
    with bound.client() as client:
        basic_placeholder = bound.placeholders["basic-api"]
        auth = base64.b64encode(f"agent:{basic_placeholder}".encode()).decode()
        got = client.get(bound.url("/basic/x"), headers={"Authorization": f"Basic {auth}"})
        header_placeholder = bound.placeholders["header-api"]
        named = client.get(
            bound.url("/header/x"), headers=[("X-Api-Key", "agents-own-key"), ("X-Api-Key", header_placeholder)]
        )
    assert got.status_code == 200
    assert named.status_code == 200
    expected_basic = "Basic " + base64.b64encode(f"robot:{VALUE}".encode()).decode()
    assert bound.seen[0]["authorization"] == expected_basic
    assert bound.seen[1]["x-api-key"] == VALUE
    # An opaque placeholder (37 characters) is not the value's length: the echo is the
    # placeholder padded to it, and never holds the value itself.
    assert VALUE not in got.text + named.text
    assert named.json()["headers"]["x-api-key"] == (header_placeholder + "*" * len(VALUE))[: len(VALUE)]
    bound.assert_nothing_leaked()


def test_require_refuses_a_request_without_the_placeholder_and_nothing_reaches_the_origin(
    make_bound: Callable[..., Bound],
) -> None:
    bound = make_bound(require=True)
    with bound.client() as client:
        missing = client.get(bound.url("/bearer/user"), headers={"Authorization": "Bearer agents-own"})
        other_path = client.get(bound.url("/elsewhere"))
    assert missing.status_code == 403
    assert missing.headers["X-Egress-Code"] == "policy_denied"
    assert other_path.status_code == 200  # outside the binding's paths: not required there
    assert [entry.get("authorization") for entry in bound.seen] == [None]


def test_a_placeholder_outside_the_bindings_path_or_for_a_principal_not_allowed_is_misuse(
    make_bound: Callable[..., Bound],
) -> None:
    bound = make_bound()
    placeholder = bound.placeholders["bearer-api"]
    with bound.client() as client:
        wrong_path = client.get(bound.url("/basic/x"), headers={"Authorization": f"Bearer {placeholder}"})
    with bound.client(proxy_auth=f"two:{AGENT_TOKEN}") as client:
        not_allowed = client.get(bound.url("/bearer/x"), headers={"Authorization": f"Bearer {placeholder}"})
    for response in (wrong_path, not_allowed):
        assert response.status_code == 403
        assert response.headers["X-Egress-Code"] == "credential_misuse"
    assert bound.seen == []
    lines = bound.gateway.wait_audit(lambda ls: sum(line["event"] == "security" for line in ls) >= 2)
    principals = {line["principal"] for line in lines if line["event"] == "security"}
    assert principals == {"default", "two"}
    bound.assert_nothing_leaked()


def test_rotation_by_swapping_the_file_injects_the_new_value_without_a_restart(
    make_bound: Callable[..., Bound], tmp_path: Path
) -> None:
    bound = make_bound()
    placeholder = bound.placeholders["bearer-api"]
    staged = tmp_path / "secrets" / "value.new"
    staged.write_text(ROTATED)
    staged.replace(tmp_path / "secrets" / "value")
    deadline = time.monotonic() + 10
    with bound.client() as client:
        while time.monotonic() < deadline:
            got = client.get(bound.url("/bearer/r"), headers={"Authorization": f"Bearer {placeholder}"})
            assert got.status_code == 200
            if bound.seen[-1]["authorization"] == f"Bearer {ROTATED}":
                break
            time.sleep(0.2)
    assert bound.seen[-1]["authorization"] == f"Bearer {ROTATED}"
    assert got.json()["headers"]["authorization"] == f"Bearer {placeholder}"
    bound.assert_nothing_leaked()


def test_a_websocket_upgrade_to_a_bound_host_carries_the_real_value_and_its_101_is_scrubbed(
    make_bound: Callable[..., Bound],
) -> None:
    bound = make_bound()
    placeholder = bound.placeholders["bearer-api"]
    answer = bound.upgrade(BOUND, "/bearer/ws", f"Bearer {placeholder}")
    assert answer.startswith(b"HTTP/1.1 101"), answer
    assert bound.upgrades == ["/bearer/ws"]
    # One Authorization reached the origin, the real one (the agent's line was replaced).
    assert bound.seen[-1]["authorization"] == f"Bearer {VALUE}"
    # The origin named the value in its 101; the agent gets the placeholder (as long as the value).
    assert VALUE.encode() not in answer
    assert f"X-Seen-Authorization: Bearer {placeholder}".encode() in answer
    lines = bound.gateway.wait_audit(lambda ls: any(line.get("upgrade") == "websocket" for line in ls), timeout_s=10)
    security = [line for line in lines if line["event"] == "security"]
    injected = [
        (line["credential"], line["injected_into"], line["kind"]) for line in security if line["action"] == "inject"
    ]
    assert injected == [("bearer-api", "authorization", "inspect")]
    assert [line["scrubbed"] for line in security if line["action"] == "scrub"] == [1]
    bound.assert_nothing_leaked()


def test_a_websocket_upgrade_with_a_placeholder_to_an_unbound_host_is_refused_before_the_origin(
    make_bound: Callable[..., Bound],
) -> None:
    bound = make_bound(default={"inspect": [{"host": UNBOUND, "access": "read-only"}]})
    placeholder = bound.placeholders["bearer-api"]
    answer = bound.upgrade(UNBOUND, "/ws", f"Bearer {placeholder}")
    assert answer.startswith(b"HTTP/1.1 403"), answer
    assert b"X-Egress-Code: credential_misuse" in answer
    assert bound.upgrades == []
    lines = bound.gateway.wait_audit(lambda ls: any(line["event"] == "security" for line in ls))
    (security,) = [line for line in lines if line["event"] == "security"]
    assert (security["action"], security["code"], security["host"]) == ("deny", "credential_misuse", UNBOUND)
    assert [finding["rule"] for finding in security["findings"]] == ["tier1.placeholder"]
    denied = [line for line in lines if line["event"] != "security" and line.get("code") == "credential_misuse"]
    assert [(line["kind"], line["path"]) for line in denied] == [("inspect", "/ws")]
    bound.assert_nothing_leaked()


def test_a_tier2_token_in_a_websocket_upgrades_query_is_refused_in_deny_mode(make_bound: Callable[..., Bound]) -> None:
    bound = make_bound(default={"inspect": [{"host": UNBOUND, "access": "read-only"}], "scan": {"tier2": "deny"}})
    token = "AKIAIOSFODNN7EXAMPLE"  # an AWS access key id's shape: tier 2
    answer = bound.upgrade(UNBOUND, f"/ws?key={token}")
    assert answer.startswith(b"HTTP/1.1 403"), answer
    assert b"X-Egress-Code: secret_detected" in answer
    assert bound.upgrades == []
    lines = bound.gateway.wait_audit(lambda ls: any(line["event"] == "security" for line in ls))
    (security,) = [line for line in lines if line["event"] == "security"]
    assert security["action"] == "deny"
    assert [finding["rule"] for finding in security["findings"]] == ["tier2.aws_access_key_id"]
    assert token not in bound.gateway.audit_path.read_text()
