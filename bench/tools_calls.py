"""Tool call throughput of one gateway replica, in-memory budgets against Redis budgets.

Starts a real `egress-gateway serve` (the test harness: fake DNS, a loopback origin serving a
small article) twice in the same run: once with the in-memory store, once with
`EGRESS_REDIS_URL` on a real `redis-server` (same machine, loopback). Each run drives a bounded
number of `POST /v1/fetch` calls at a fixed concurrency, every call under a run token and a step
id, so a reservation touches the windows, the live-id set, the step and run counters and a lease.

Reports for each store: calls/s, latency median and p99, the gateway's CPU time per call (from
/proc), and the budget store's share of a call: the median time of one reserve + release pair
measured against the same store from this process (memory: in-process; Redis: over loopback, at
concurrency 1 and at the bench's concurrency), set beside the call's median latency. The
difference of the two stores' call latencies is the same cost seen from outside.

    .venv/bin/python bench/tools_calls.py --calls 2000 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.budget import BudgetStore, MemoryBudgetStore, RedisBudgetStore
from gateway.policy.model import ToolLimits
from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import GatewayProcess, policy_document
from tests.harness.origins import HarnessLoop, OriginFactory
from tests.harness.redis_server import RedisServer
from tests.harness.run_tokens import SECRET_ENV, TEST_ORCHESTRATORS, run_token

ARTICLE = (
    "<html><head><title>Bench</title></head><body><article><h1>Bench</h1>"
    + "<p>A short paragraph of article text for the extractor.</p>" * 20
    + "</article></body></html>"
)
CALL_TIMEOUT_S = 30.0
STORE_OPS = 2000
ROOMY = 1_000_000_000
LIMITS = ToolLimits(
    per_step=ROOMY // 1000,
    per_run=ROOMY // 1000,
    concurrent=ROOMY // 1000,
    min_interval_s=0.0,
    per_minute=ROOMY,
    per_hour=ROOMY,
    per_day=ROOMY,
)


@dataclass
class Run:
    store: str
    calls: int
    failed: int
    seconds: float
    latencies_s: list[float]
    cpu_s: float

    @property
    def rate(self) -> float:
        return (self.calls - self.failed) / self.seconds

    def ms(self, quantile: float) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))] * 1000


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process (clock ticks from /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def site() -> web.Application:
    async def article(_: web.Request) -> web.Response:
        return web.Response(text=ARTICLE, content_type="text/html")

    async def robots(_: web.Request) -> web.Response:
        return web.Response(status=404, text="none")

    app = web.Application()
    app.router.add_get("/article", article)
    app.router.add_get("/robots.txt", robots)
    return app


async def drive(gateway: GatewayProcess, url: str, calls: int, concurrency: int) -> tuple[int, float, list[float]]:
    headers = {"X-Egress-Run-Token": run_token(f"bench-{uuid.uuid4().hex}"), "X-Egress-Step": "step-1"}
    latencies: list[float] = []
    failed = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(calls):
        queue.put_nowait(index)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=CALL_TIMEOUT_S) as client:

        async def worker() -> None:
            nonlocal failed
            while not queue.empty():
                queue.get_nowait()
                started = time.perf_counter()
                response = await client.post(f"{gateway.api_url}/v1/fetch", json={"url": url}, headers=headers)
                latencies.append(time.perf_counter() - started)
                if response.status_code != 200:
                    failed += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return failed, time.perf_counter() - started, latencies


async def store_op_ms(store: BudgetStore, concurrency: int) -> float:
    """Median ms of one reserve + release pair with `concurrency` pairs in flight."""
    timings: list[float] = []

    async def pair(index: int) -> None:
        started = time.perf_counter()
        granted = await store.reserve(
            principal="bench", tool="fetch", run_id="bench-run", step_id=f"s{index % 50}", limits=LIMITS
        )
        await store.release(granted)
        timings.append(time.perf_counter() - started)

    for start in range(0, STORE_OPS, concurrency):
        await asyncio.gather(*(pair(i) for i in range(start, min(start + concurrency, STORE_OPS))))
    await store.close()
    return statistics.median(timings) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="measured calls per store (100-20000)")
    parser.add_argument("--concurrency", type=int, default=16, help="calls in flight (1-64)")
    args = parser.parse_args()
    calls = max(100, min(args.calls, 20_000))
    concurrency = max(1, min(args.concurrency, 64))

    budget = {"per_step": ROOMY // 1000, "per_run": ROOMY // 1000, "concurrent": ROOMY // 1000}
    budget |= {"per_minute": ROOMY, "per_hour": ROOMY, "per_day": ROOMY}
    runs: list[Run] = []
    store_ms: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="tools-calls-") as tmp:
        dns = FakeDNS().start()
        loop = HarnessLoop()
        pki = TestPKI(Path(tmp))
        origins = OriginFactory(loop, pki, dns)
        redis = RedisServer(Path(tmp))
        redis.start()
        try:
            origin = origins.start(site(), names=["bench.example.org"], tls=False)
            principal = {"egress": {"allow_domains": ["*"]}, "tools": {"fetch": True}, "budgets": {"fetch": budget}}
            policy = policy_document(
                allow_cidrs=[origin.cidr],
                ports=[80, 443, origin.port],
                principals={"default": principal},
                orchestrators=TEST_ORCHESTRATORS,
            )
            for store, env in (("memory", {}), ("redis", {"EGRESS_REDIS_URL": redis.url})):
                workdir = Path(tmp) / store
                workdir.mkdir()
                gateway = GatewayProcess(
                    workdir,
                    policy,
                    nameserver=dns.nameserver,
                    ca_bundle=pki.ca_path,
                    env={**SECRET_ENV, **env, "EGRESS_AUDIT_LOG": "off"},
                ).start()
                try:
                    asyncio.run(drive(gateway, origin.url("/article"), 100, concurrency))  # warm-up
                    cpu_before = cpu_seconds(gateway.pid)
                    failed, seconds, latencies = asyncio.run(drive(gateway, origin.url("/article"), calls, concurrency))
                    cpu = cpu_seconds(gateway.pid) - cpu_before
                    runs.append(Run(store, calls, failed, seconds, latencies, cpu))
                finally:
                    gateway.stop()
            store_ms["memory"] = (
                asyncio.run(store_op_ms(MemoryBudgetStore(), 1)),
                asyncio.run(store_op_ms(MemoryBudgetStore(), concurrency)),
            )
            store_ms["redis"] = (
                asyncio.run(store_op_ms(RedisBudgetStore(redis.url, namespace="bench1"), 1)),
                asyncio.run(store_op_ms(RedisBudgetStore(redis.url, namespace="bench2"), concurrency)),
            )
        finally:
            redis.stop()
            origins.stop_all()
            loop.stop()
            dns.stop()

    print(f"{calls} calls per store, concurrency {concurrency}, plain-HTTP loopback origin, 2.6 KB page")
    print(
        "| store | calls/s | failed | median ms | p99 ms | gateway CPU ms/call | "
        "reserve+release ms (c=1) | reserve+release ms (c=N) | store share of median call |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        single, loaded = store_ms[run.store]
        share = loaded / run.ms(0.5) * 100
        print(
            f"| {run.store} | {run.rate:.0f} | {run.failed} | {run.ms(0.5):.2f} | {run.ms(0.99):.2f} | "
            f"{run.cpu_s / run.calls * 1000:.3f} | {single:.3f} | {loaded:.3f} | {share:.1f} % |"
        )
    memory, redis_run = runs
    print(
        f"redis / memory: {redis_run.rate / memory.rate:.2f}x the rate; median call "
        f"{redis_run.ms(0.5) - memory.ms(0.5):+.2f} ms, CPU per call "
        f"{(redis_run.cpu_s - memory.cpu_s) / calls * 1000:+.3f} ms"
    )
    return 0 if all(run.failed == 0 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
