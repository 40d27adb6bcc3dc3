"""Outbound secret-scanning cost per request, beside the same request with scanning off (issue 26).

Drives the gateway's own `OutboundGuard` (the object the proxy, the tools and the DNS listener
call) in-process, on one request shape at a time, alternating scanning on and off in one run:

- `url+headers`: a 180-character URL with a query and 12 header lines (`screen_request`);
- `body 1 KiB`, `body 64 KiB`, `body 1 MiB`: the same plus a body fed in 64 KiB reads, as the
  proxy's `data_received` hands them over, through `BodyGuard` to its verdict;
- `hostile 1 MiB`: a body built to be slow for the scanner (every line a near-miss of several
  tier-2 and tier-3 rules, a placeholder prefix repeated), for the event loop's longest stall:
  the longest single `feed` of a 256 KiB read (the most asyncio hands over at once) and of the
  whole MiB in one call.

"Off" is the same guard and request under a policy with no credentials and no `scan:` (the
check the proxy makes on every request when scanning is off). "On" holds 20 credentials (tier 1:
40 needles) and `scan: {}` (tiers 2 and 3 on). Targets: at most 40 µs for a URL and its headers,
at most 1 ms per 64 KiB of body, no stall over 20 ms on the hostile MiB.

    .venv/bin/python bench/scan.py --rounds 5
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gateway.credentials.guard import OutboundGuard
from gateway.credentials.screen import RequestFacts
from gateway.credentials.store import SecretStore
from gateway.observe.audit import AuditLog
from gateway.policy.load import parse_policy
from gateway.policy.model import Policy, Principal

READ_BYTES = 64 * 1024
LARGEST_READ_BYTES = 256 * 1024
TARGET_HEAD_US = 40.0
TARGET_PER_64K_MS = 1.0
TARGET_STALL_MS = 20.0
CREDENTIALS = 20

URL = (
    b"http://api.example.org:8080/v2/repos/example-org/example-repo/issues/1234/comments"
    b"?page=3&per_page=100&sort=created&direction=desc&since=2026-11-30T10:00:00Z&q=build+failure"
)
FIELDS = b"".join(
    b"\r\n" + line
    for line in (
        b"User-Agent: python-httpx/0.28.1",
        b"Accept: application/json",
        b"Accept-Encoding: gzip, deflate, br",
        b"Content-Type: application/json",
        b"X-Request-Id: 6f1c2b7e-0d4a-4b8e-9f3a-2c1d0e5f6a7b",
        b"X-Trace: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        b"Cookie: session=abc123; theme=dark; lang=en",
        b"Referer: http://www.example.org/some/page",
        b"Cache-Control: no-cache",
        b"Pragma: no-cache",
        b"X-Client: agent/1.0",
        b"Accept-Language: en-US,en;q=0.9",
    )
)


def _prose(size: int) -> bytes:
    unit = b'{"title": "Build failure on main", "body": "The nightly job failed at step 4; see log.", "n": 12}\n'
    return (unit * (size // len(unit) + 1))[:size]


def _hostile(size: int) -> bytes:
    # Near-misses: each prefix a rule anchors on, cut one character short of a match.
    unit = (
        b"AKIA" + b"A" * 15 + b" ghp_" + b"a" * 35 + b" xoxb-" + b" sk-proj-" + b"x" * 19 + b" AIza" + b"b" * 34
        + b" eyJ" + b"c" * 9 + b" -----BEGIN X PRIVATE KE aws_secret_access_key= egph_ api_key=" + b"d" * 31 + b"\n"
    )  # fmt: skip
    return (unit * (size // len(unit) + 1))[:size]


def _policy(tmp: Path, scanning: bool) -> Policy:
    if not scanning:
        return parse_policy("version: 1\nprincipals:\n  default: {egress: {allow_domains: ['*']}}\n")
    (tmp / "key").write_bytes(os.urandom(48))
    entries = []
    for index in range(CREDENTIALS):
        (tmp / f"value{index}").write_text(f"corp-secret-{index:02d}-" + os.urandom(16).hex())
        entries.append(
            f"    - {{name: c{index}, source: {{file: {tmp}/value{index}}}, inject: bearer, "
            f"bind: {{hosts: [svc{index}.example]}}}}\n"
        )
    return parse_policy(
        "version: 1\ndefaults:\n  scan: {}\nprincipals:\n  default: {egress: {allow_domains: ['*']}}\n"
        f"credentials:\n  placeholder_key: {{file: {tmp}/key}}\n  entries:\n" + "".join(entries)
    )


def _guard(policy: Policy) -> OutboundGuard:
    store = SecretStore({})
    store.load(policy.credentials)
    return OutboundGuard(store, AuditLog("off"))


FACTS = RequestFacts("http", "default", "http", "api.example.org", 8080, "POST", "/v2/repos")


def _request(guard: OutboundGuard, policy: Policy, principal: Principal, body: bytes | None) -> None:
    refusal = guard.screen_request(FACTS, policy, principal, url=URL, fields=FIELDS)
    assert refusal is None
    if body is None:
        return
    scan = guard.body(FACTS, policy, principal, None)
    if scan is None:
        return
    for start in range(0, len(body), READ_BYTES):
        scan.feed(body[start : start + READ_BYTES])
    assert scan.verdict() is None


def _per_call_s(call: Callable[[], None], budget_s: float, max_calls: int) -> float:
    """Median of batches' per-call time, within a time budget and a call cap."""
    batch = 1
    started = time.perf_counter()
    call()
    first = time.perf_counter() - started
    if first > 0:
        batch = max(1, min(max_calls // 10, int(0.02 / first)))
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    calls = 0
    while time.perf_counter() < deadline and calls < max_calls:
        started = time.perf_counter()
        for _ in range(batch):
            call()
        samples.append((time.perf_counter() - started) / batch)
        calls += batch
    return statistics.median(samples)


def _longest_feed_s(guard: OutboundGuard, policy: Policy, principal: Principal, body: bytes, read: int) -> float:
    longest = 0.0
    scan = guard.body(FACTS, policy, principal, None)
    assert scan is not None
    for start in range(0, len(body), read):
        began = time.perf_counter()
        scan.feed(body[start : start + read])
        longest = max(longest, time.perf_counter() - began)
    return longest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternations of on and off (each bounded in time)")
    parser.add_argument("--seconds", type=float, default=0.5, help="time budget per shape, side and round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_text:
        tmp = Path(tmp_text)
        sides = {"off": _policy(tmp, False), "on": _policy(tmp, True)}
        guards = {name: _guard(policy) for name, policy in sides.items()}
        shapes: dict[str, bytes | None] = {
            "url+headers": None,
            "body 1 KiB": _prose(1024),
            "body 64 KiB": _prose(64 * 1024),
            "body 1 MiB": _prose(1024 * 1024),
        }
        results: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for shape, body in shapes.items():
                for side in ("off", "on"):
                    policy = sides[side]
                    principal = policy.principals["default"]
                    guard = guards[side]
                    per_call = _per_call_s(
                        functools.partial(_request, guard, policy, principal, body), args.seconds, 20_000
                    )
                    results.setdefault((shape, side), []).append(per_call)
        print(f"{'shape':<14} {'off µs':>10} {'on µs':>10} {'scan µs':>10} {'µs/64KiB':>10}")
        for shape, body in shapes.items():
            off = statistics.median(results[(shape, "off")]) * 1e6
            on = statistics.median(results[(shape, "on")]) * 1e6
            per_64k = (on - off) / max(len(body or b"") / (64 * 1024), 1) if body else float("nan")
            print(f"{shape:<14} {off:>10.1f} {on:>10.1f} {on - off:>10.1f} {per_64k:>10.1f}")
        policy, principal = sides["on"], sides["on"].principals["default"]
        hostile = _hostile(1024 * 1024)
        stall_read = max(
            _longest_feed_s(guards["on"], policy, principal, hostile, LARGEST_READ_BYTES) for _ in range(args.rounds)
        )
        stall_whole = max(
            _longest_feed_s(guards["on"], policy, principal, hostile, len(hostile)) for _ in range(args.rounds)
        )
        head_us = (
            statistics.median(results[("url+headers", "on")]) - statistics.median(results[("url+headers", "off")])
        ) * 1e6
        body_64k_ms = (
            statistics.median(results[("body 64 KiB", "on")]) - statistics.median(results[("body 64 KiB", "off")])
        ) * 1e3
        print(
            f"hostile 1 MiB: longest 256 KiB read {stall_read * 1e3:.1f} ms, "
            f"whole MiB in one call {stall_whole * 1e3:.1f} ms"
        )
        print(
            f"targets: url+headers {head_us:.1f} µs (≤ {TARGET_HEAD_US:.0f}), 64 KiB body {body_64k_ms:.2f} ms "
            f"(≤ {TARGET_PER_64K_MS:.0f}), stall {stall_read * 1e3:.1f} ms per read (≤ {TARGET_STALL_MS:.0f})"
        )


if __name__ == "__main__":
    main()
