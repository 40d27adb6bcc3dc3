"""Event-loop stall benchmark: does a 2 MiB page conversion stall the gateway's event loop?

Starts a real `egress-gateway serve` (the test harness: fake DNS, test CA, a loopback origin) and
an origin serving a ~2 MiB HTML page (the biggest fixture page, read by path, padded to size).
A client pings the gateway's admin /healthz every ~2 ms; every answer needs the gateway's event
loop, so the slowest ping is the loop's longest stall as seen from outside. Measured twice in the
same run: with nothing else running (reference), and while the page is fetched through
/v1/fetch and converted (one unmeasured warm-up fetch first starts the extraction workers).

    .venv/bin/python bench/fetch_stall.py --pages ../shared/fixtures/pages
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import GatewayProcess, policy_document
from tests.harness.origins import HarnessLoop, OriginFactory

PAGE_BYTES = 2 * 1024 * 1024 - 16 * 1024  # just under the default 2 MiB wire and decoded caps
PING_INTERVAL_S = 0.002
MAX_PINGS_PER_PHASE = 20_000
FETCH_TIMEOUT_S = 60.0
TARGET_STALL_MS = 20.0


@dataclass
class Pings:
    latencies_s: list[float]
    gaps_s: list[float]  # between consecutive answers

    @property
    def worst_ms(self) -> float:
        return max(self.latencies_s, default=0.0) * 1000

    @property
    def worst_gap_ms(self) -> float:
        return max(self.gaps_s, default=0.0) * 1000

    @property
    def p99_ms(self) -> float:
        if len(self.latencies_s) < 2:
            return self.worst_ms
        return statistics.quantiles(self.latencies_s, n=100, method="inclusive")[98] * 1000


def padded_page(pages: Path) -> bytes:
    """The biggest fixture page, padded with article paragraphs before </body> to PAGE_BYTES."""
    biggest = max(pages.glob("*/source.html"), key=lambda path: path.stat().st_size)
    html = biggest.read_bytes()[:PAGE_BYTES]
    paragraph = (
        b"<p>Padding paragraph with <a href='/more'>a link</a> and <em>inline markup</em> so the converter "
        b"walks real nodes: the quick brown fox jumps over the lazy dog.</p>\n"
    )
    missing = max(0, PAGE_BYTES - len(html) - 32)
    padding = b"<article>" + paragraph * (missing // len(paragraph)) + b"</article>"
    cut = html.rfind(b"</body>")
    if cut < 0:
        return html + padding
    return html[:cut] + padding + html[cut:]


def ping_while(client: httpx.Client, url: str, running: threading.Event | None, duration_s: float) -> Pings:
    """Ping every PING_INTERVAL_S until `running` clears (or for duration_s when it is None)."""
    latencies: list[float] = []
    gaps: list[float] = []
    started = time.perf_counter()
    last_answer = started
    while len(latencies) < MAX_PINGS_PER_PHASE:
        if running is None and time.perf_counter() - started >= duration_s:
            break
        if running is not None and not running.is_set():
            break
        sent = time.perf_counter()
        response = client.get(url)
        answered = time.perf_counter()
        response.raise_for_status()
        latencies.append(answered - sent)
        gaps.append(answered - last_answer)
        last_answer = answered
        pause = PING_INTERVAL_S - (time.perf_counter() - sent)
        if pause > 0:
            time.sleep(pause)
    return Pings(latencies, gaps)


def fetch_in_background(api_url: str, page_url: str) -> tuple[threading.Thread, threading.Event, list[float]]:
    running = threading.Event()
    running.set()
    took: list[float] = []

    def fetch() -> None:
        try:
            started = time.perf_counter()
            response = httpx.post(f"{api_url}/v1/fetch", json={"url": page_url}, timeout=FETCH_TIMEOUT_S)
            response.raise_for_status()
            took.append(time.perf_counter() - started)
        finally:
            running.clear()

    thread = threading.Thread(target=fetch, name="bench-fetch", daemon=True)
    thread.start()
    return thread, running, took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=Path, default=Path("../shared/fixtures/pages"))
    parser.add_argument("--rounds", type=int, default=5, help="measured fetches of the big page (1-20)")
    args = parser.parse_args()
    rounds = max(1, min(args.rounds, 20))
    page = padded_page(args.pages)

    with tempfile.TemporaryDirectory(prefix="fetch-stall-") as tmp:
        dns = FakeDNS().start()
        loop = HarnessLoop()
        pki = TestPKI(Path(tmp))
        origins = OriginFactory(loop, pki, dns)
        gateway: GatewayProcess | None = None
        try:

            async def big(_: web.Request) -> web.Response:
                return web.Response(body=page, content_type="text/html", charset="utf-8")

            app = web.Application()
            app.router.add_get("/big", big)
            origin = origins.start(app, names=["big.example.org"])
            policy = policy_document(allow_cidrs=[origin.cidr], ports=[80, 443, origin.port])
            workdir = Path(tmp) / "gateway"
            workdir.mkdir()
            gateway = GatewayProcess(workdir, policy, nameserver=dns.nameserver, ca_bundle=pki.ca_path).start()
            healthz = f"{gateway.admin_url}/healthz"
            page_url = origin.url("/big")
            with httpx.Client(timeout=10) as client:
                warm, _, _ = fetch_in_background(gateway.api_url, page_url)
                warm.join(FETCH_TIMEOUT_S)
                measured: list[Pings] = []
                fetch_seconds: list[float] = []
                for _ in range(rounds):
                    thread, running, took = fetch_in_background(gateway.api_url, page_url)
                    measured.append(ping_while(client, healthz, running, 0))
                    thread.join(FETCH_TIMEOUT_S)
                    fetch_seconds.extend(took)
                phase_s = max(statistics.mean(fetch_seconds) if fetch_seconds else 1.0, 0.5)
                reference = [ping_while(client, healthz, None, phase_s) for _ in range(rounds)]
        finally:
            if gateway is not None:
                gateway.stop()
            origins.stop_all()
            loop.stop()
            dns.stop()

    def row(label: str, runs: list[Pings]) -> str:
        pings = sum(len(run.latencies_s) for run in runs)
        worst = max(run.worst_ms for run in runs)
        gap = max(run.worst_gap_ms for run in runs)
        p99 = max(run.p99_ms for run in runs)
        return f"| {label} | {pings} | {p99:.1f} | {worst:.1f} | {gap:.1f} |"

    print(
        f"page: {len(page):,} bytes; {rounds} measured fetches, {len(fetch_seconds)} succeeded; "
        f"mean fetch+convert {statistics.mean(fetch_seconds) * 1000 if fetch_seconds else 0:.0f} ms"
    )
    print("| phase | pings | p99 ms | longest stall ms | longest gap ms |")
    print("|---|---|---|---|---|")
    print(row("reference (no conversion)", reference))
    print(row("during 2 MiB fetch + conversion", measured))
    worst = max(run.worst_ms for run in measured)
    verdict = "within" if worst < TARGET_STALL_MS else "OVER"
    print(f"longest stall during conversion: {worst:.1f} ms ({verdict} the {TARGET_STALL_MS:g} ms target)")
    return 0 if len(fetch_seconds) == rounds else 1


if __name__ == "__main__":
    sys.exit(main())
