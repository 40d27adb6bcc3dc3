"""Hostile origins cannot stall the proxy's loop or grow its memory, nor hold a request forever.

An origin that never ends its response head (one endless header line, a flood of fields, an
endless reason phrase) is cut at the response-head caps with `502 too_large`, whose message
quotes none of its bytes; while the attack runs, `/healthz` keeps answering and the daemon's RSS
stays put (bounds wide enough for a loaded 2-core machine, far below what the quadratic parser
path cost before: tens of seconds of frozen loop and hundreds of MB). An origin that drips its
head or body a byte at a time meets the total deadlines `proxy.response_head_timeout_s` and
`proxy.response_timeout_s`.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Callable

import pytest

from tests.harness import scripted_origin
from tests.harness.proxy import ProxyProcess, proxy_policy, raw_exchange
from tests.harness.scripted_origin import Handler, ScriptedFactory, ScriptedOrigin

ProxyFactory = Callable[..., ProxyProcess]
hostile = scripted_origin.scripted

ATTACK_LIMIT_BYTES = 160 * 1024 * 1024  # how much a hostile origin sends at most (the test stays bounded)
HEALTHZ_MAX_S = 1.0  # a frozen loop took tens of seconds; a loaded machine answers well under this
RSS_GROWTH_MAX_KIB = 48 * 1024  # the old path grew by hundreds of MB


def _endless(prefix: bytes, unit: bytes) -> Handler:
    """Send `prefix`, then `unit` again and again: a head that never ends."""

    def handle(origin: ScriptedOrigin, conn: socket.socket, index: int) -> None:
        if not origin.read_request(conn):
            return
        conn.sendall(prefix)
        block = unit * max(1, 65536 // len(unit))
        sent = 0
        while sent < ATTACK_LIMIT_BYTES:
            conn.sendall(block)
            sent += len(block)

    return handle


def _healthz_latency(proxy: ProxyProcess) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(f"{proxy.admin_url}/healthz", timeout=30) as response:
        response.read()
    return time.perf_counter() - started


@pytest.mark.parametrize(
    ("prefix", "unit"),
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nX-Endless: ", b"a", id="endless-header-line"),
        pytest.param(b"HTTP/1.1 200 OK\r\n", b"X-Field: v\r\n", id="field-flood"),
        pytest.param(b"HTTP/1.1 200 ", b"R", id="endless-reason-phrase"),
    ],
)
def test_endless_response_head_is_cut_502_too_large_without_stalling_the_loop(
    proxy_factory: ProxyFactory, hostile: ScriptedFactory, prefix: bytes, unit: bytes
) -> None:
    origin = hostile(_endless(prefix, unit), "endless.example.org")
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port]))
    rss_before = proxy.rss_kib()
    request = b"GET http://endless.example.org:%d/ HTTP/1.1\r\nHost: endless.example.org\r\n\r\n" % origin.port
    answers: list[bytes] = []
    attack = threading.Thread(target=lambda: answers.append(raw_exchange(proxy.port, request, timeout_s=40)))
    attack.start()
    latencies = [_healthz_latency(proxy)]
    rss_peak = proxy.rss_kib()
    while attack.is_alive():
        latencies.append(_healthz_latency(proxy))
        rss_peak = max(rss_peak, proxy.rss_kib())
        time.sleep(0.05)
    attack.join()
    latencies.append(_healthz_latency(proxy))
    rss_peak = max(rss_peak, proxy.rss_kib())
    assert max(latencies) < HEALTHZ_MAX_S, latencies
    assert rss_peak - rss_before < RSS_GROWTH_MAX_KIB, (rss_before, rss_peak)
    answer = answers[0]
    assert answer.startswith(b"HTTP/1.1 502 "), answer[:200]
    assert b"X-Egress-Code: too_large" in answer
    body = answer.split(b"\r\n\r\n", 1)[1]
    assert unit.strip()[:1] * 8 not in body  # the message quotes none of the origin's bytes


def _drip(prefix: bytes, drip: bytes, interval_s: float) -> Handler:
    def handle(origin: ScriptedOrigin, conn: socket.socket, index: int) -> None:
        if not origin.read_request(conn):
            return
        conn.sendall(prefix)
        for _ in range(200):
            time.sleep(interval_s)
            conn.sendall(drip)

    return handle


def test_origin_dripping_its_head_meets_the_response_head_deadline_504(
    proxy_factory: ProxyFactory, hostile: ScriptedFactory
) -> None:
    origin = hostile(_drip(b"HTTP/1.1 200 OK\r\nX-Drip: ", b"d", 0.2), "drip-head.example.org")
    policy = proxy_policy(
        [origin.cidr], ports=[origin.port], proxy={"idle_timeout_s": 30, "response_head_timeout_s": 1.5}
    )
    proxy = proxy_factory(policy)
    request = b"GET http://drip-head.example.org:%d/ HTTP/1.1\r\nHost: drip-head.example.org\r\n\r\n" % origin.port
    answer = raw_exchange(proxy.port, request, timeout_s=20)
    assert answer.startswith(b"HTTP/1.1 504 "), answer[:200]
    assert b"response_head_timeout_s" in answer


def test_origin_dripping_its_body_meets_the_response_deadline(
    proxy_factory: ProxyFactory, hostile: ScriptedFactory
) -> None:
    origin = hostile(_drip(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", b"b", 0.2), "drip-body.example.org")
    policy = proxy_policy([origin.cidr], ports=[origin.port], proxy={"idle_timeout_s": 30, "response_timeout_s": 2})
    proxy = proxy_factory(policy)
    request = b"GET http://drip-body.example.org:%d/ HTTP/1.1\r\nHost: drip-body.example.org\r\n\r\n" % origin.port
    answer = raw_exchange(proxy.port, request, timeout_s=20)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert len(answer.split(b"\r\n\r\n", 1)[1]) < 1000  # cut, not completed
    lines = proxy.wait_audit(lambda lines: any(line.get("close_reason") == "timeout" for line in lines))
    assert any(line.get("close_reason") == "timeout" for line in lines)
