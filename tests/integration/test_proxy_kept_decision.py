"""A keep-alive connection's kept decision is never wider than a fresh one.

The dispatcher reuses a client connection's last decision when its next request repeats the
credential and absolute URI; through the real daemon and one httpx keep-alive connection, these
cases show it still follows what `pin_cached` would decide: a DNS answer replaced after its TTL
is vetted afresh (here: a rebinding to a denied address is refused), and a policy reload that
denies the host refuses the next request on the same connection. The upstream head it keeps is
reused only for a request whose fields are the same, and its audit lines only for a request with
the same method.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import httpx
from aiohttp import web

from tests.harness.dns import FakeDNS
from tests.harness.origins import Origin, OriginFactory
from tests.harness.principals import policy_generation
from tests.harness.proxy import ProxyProcess, proxy_policy

ProxyFactory = Callable[..., ProxyProcess]

NAME = "kept.example.org"
RELOAD_WAIT_S = 10.0


def _origin(origins: OriginFactory) -> Origin:
    async def hello(request: web.Request) -> web.Response:
        # What the origin saw of the request: its method and the one field the cases vary.
        return web.Response(text=f"{request.method} {request.headers.get('X-Run', '-')}")

    app = web.Application()
    app.router.add_route("*", "/", hello)
    return origins.start(app, names=(NAME,), tls=False, register_dns=False)


def _policy(origin: Origin, allowed: list[str]) -> dict[str, Any]:
    principals = {"default": {"egress": {"allow_domains": allowed}}}
    return proxy_policy([origin.cidr], ports=[origin.port], principals=principals)


def test_an_answer_replaced_after_its_ttl_is_vetted_afresh_on_the_same_connection(
    proxy_factory: ProxyFactory, origins: OriginFactory, fake_dns: FakeDNS
) -> None:
    origin = _origin(origins)
    # The first answer (allowed) holds for one second; the lookup after it rebinds the name to an
    # address outside allow_cidrs.
    fake_dns.sequence(NAME, [[origin.ip], ["10.1.2.3"]], ttl=1)
    proxy = proxy_factory(_policy(origin, [NAME]))
    url = origin.url("/", name=NAME)
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        first, second = client.get(url), client.get(url)  # a DNS miss, then the kept decision
        time.sleep(1.5)  # the answer's TTL passes: the resolver's cache no longer holds it
        third = client.get(url)
    assert [first.status_code, second.status_code] == [200, 200]
    assert third.status_code == 403
    assert third.headers["X-Egress-Code"] == "blocked_destination"
    _assert_one_client_connection(proxy)


def test_a_reload_denying_the_host_refuses_the_next_request_on_the_same_connection(
    proxy_factory: ProxyFactory, origins: OriginFactory, fake_dns: FakeDNS
) -> None:
    origin = _origin(origins)
    fake_dns.add(NAME, origin.ip, ttl=300)
    proxy = proxy_factory(_policy(origin, [NAME]))
    url = origin.url("/", name=NAME)
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        assert [client.get(url).status_code, client.get(url).status_code] == [200, 200]
        proxy.write_policy(_policy(origin, ["other.example.org"]))
        proxy.signal(signal.SIGHUP)
        # The reload lands asynchronously: wait for its generation with this connection idle (a
        # request in flight at the reload would be cut by live permission, not refused).
        deadline = time.monotonic() + RELOAD_WAIT_S
        while policy_generation(proxy) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        response = client.get(url)
    assert response.status_code == 403
    assert response.headers["X-Egress-Code"] == "policy_denied"
    _assert_one_client_connection(proxy)


def _assert_one_client_connection(proxy: ProxyProcess) -> None:
    """Every decision was made for one client connection: the refusal followed a kept decision."""
    lines = proxy.wait_audit(lambda lines: any(line.get("decision") == "deny" for line in lines))
    assert len({line["conn"] for line in lines if line["event"] == "decision"}) == 1


def test_each_request_on_a_kept_decision_reaches_the_origin_with_its_own_method_and_fields(
    proxy_factory: ProxyFactory, origins: OriginFactory, fake_dns: FakeDNS
) -> None:
    origin = _origin(origins)
    fake_dns.add(NAME, origin.ip, ttl=300)
    proxy = proxy_factory(_policy(origin, [NAME]))
    url = origin.url("/", name=NAME)
    runs = [("GET", "1"), ("GET", "1"), ("GET", "2"), ("DELETE", "2"), ("GET", None), ("GET", "2")]
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        seen = [client.request(method, url, headers={} if run is None else {"X-Run": run}).text for method, run in runs]
    assert seen == ["GET 1", "GET 1", "GET 2", "DELETE 2", "GET -", "GET 2"]
    lines = proxy.wait_audit(lambda lines: sum(line["event"] == "close" for line in lines) >= len(runs))
    assert len({line["conn"] for line in lines if line["event"] == "decision"}) == 1
    # The kept decision keeps its last request's audit lines: each request's own method on both.
    methods = [method for method, _ in runs]
    assert [line["method"] for line in lines if line["event"] == "decision"] == methods
    assert [line["method"] for line in lines if line["event"] == "close"] == methods
    assert all(line["path"] == "/" and line["status"] == 200 for line in lines if line["event"] == "close")
