"""Event-loop stall benchmark: does a 2 MiB page conversion stall the gateway's event loop?

Starts a real `egress-gateway serve` (the test harness: fake DNS, test CA, a loopback origin) and
an origin serving a ~2 MiB HTML page (the biggest fixture page, read by path, padded to size).
A client pings the gateway's admin /healthz every ~2 ms; every answer needs the gateway's event
loop, so the slowest ping is the loop's longest stall as seen from outside. Measured twice in the
same run: with nothing else running (reference), and while the page is fetched through
/v1/fetch and converted. The first fetch, which also starts the extraction workers, is reported
on its own row.

The pinger runs in its own process with the garbage collector off: in the bench's process it
shared the GIL with the origin and the fetching thread, and that process's own gen-2 collection
(~50 ms) was reported as a gateway stall.

    .venv/bin/python bench/fetch_stall.py --pages ../shared/fixtures/pages
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
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


def ping_until_stopped(client: httpx.Client, url: str, control: Connection) -> Pings:
    """Ping every PING_INTERVAL_S until the bench process sends a stop."""
    latencies: list[float] = []
    gaps: list[float] = []
    last_answer = time.perf_counter()
    while len(latencies) < MAX_PINGS_PER_PHASE and not control.poll():
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
    control.recv()
    return Pings(latencies, gaps)


def pinger_main(url: str, control: Connection) -> None:
    """The pinger process: one phase per "start" message, answered with its Pings."""
    # Nothing here lives long or forms cycles; a collection would be a stall of the pinger itself.
    gc.disable()
    with httpx.Client(timeout=10) as client:
        client.get(url).raise_for_status()  # connect before the first measured ping
        control.send("ready")
        while control.recv() == "start":
            pings = ping_until_stopped(client, url, control)
            control.send((pings.latencies_s, pings.gaps_s))


class Pinger:
    def __init__(self, url: str) -> None:
        self._control, child = multiprocessing.get_context("spawn").Pipe()
        self._process = multiprocessing.get_context("spawn").Process(
            target=pinger_main, args=(url, child), name="bench-pinger", daemon=True
        )
        self._process.start()
        # Importing httpx in a fresh process takes a while: a phase started before that is lost.
        if not self._control.poll(FETCH_TIMEOUT_S) or self._control.recv() != "ready":
            raise RuntimeError("the pinger process did not start")

    def start(self) -> None:
        self._control.send("start")

    def stop(self) -> Pings:
        self._control.send("stop")
        latencies, gaps = self._control.recv()
        return Pings(latencies, gaps)

    def close(self) -> None:
        self._control.send("exit")
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()


def fetch_in_background(api_url: str, page_url: str) -> tuple[threading.Thread, list[float]]:
    took: list[float] = []

    def fetch() -> None:
        started = time.perf_counter()
        response = httpx.post(f"{api_url}/v1/fetch", json={"url": page_url}, timeout=FETCH_TIMEOUT_S)
        response.raise_for_status()
        took.append(time.perf_counter() - started)

    thread = threading.Thread(target=fetch, name="bench-fetch", daemon=True)
    thread.start()
    return thread, took


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
            pinger = Pinger(healthz)
            try:
                # The first fetch also starts the extraction workers: measured, but reported apart.
                pinger.start()
                warm, _ = fetch_in_background(gateway.api_url, page_url)
                warm.join(FETCH_TIMEOUT_S)
                first = pinger.stop()
                measured: list[Pings] = []
                fetch_seconds: list[float] = []
                for _ in range(rounds):
                    pinger.start()
                    thread, took = fetch_in_background(gateway.api_url, page_url)
                    thread.join(FETCH_TIMEOUT_S)
                    measured.append(pinger.stop())
                    fetch_seconds.extend(took)
                phase_s = max(statistics.mean(fetch_seconds) if fetch_seconds else 1.0, 0.5)
                reference = []
                for _ in range(rounds):
                    pinger.start()
                    time.sleep(phase_s)
                    reference.append(pinger.stop())
            finally:
                pinger.close()
        finally:
            if gateway is not None:
                gateway.stop()
            origins.stop_all()
            loop.stop()
            dns.stop()

    def row(label: str, runs: list[Pings]) -> str:
        pings = sum(len(run.latencies_s) for run in runs)
        worst = [run.worst_ms for run in runs]
        gap = max(run.worst_gap_ms for run in runs)
        p99 = max(run.p99_ms for run in runs)
        return f"| {label} | {pings} | {p99:.1f} | {max(worst):.1f} | {statistics.median(worst):.1f} | {gap:.1f} |"

    print(
        f"page: {len(page):,} bytes; {rounds} measured fetches, {len(fetch_seconds)} succeeded; "
        f"mean fetch+convert {statistics.mean(fetch_seconds) * 1000 if fetch_seconds else 0:.0f} ms"
    )
    print("| phase | pings | worst round's p99 ms | longest stall ms | median round's longest ms | longest gap ms |")
    print("|---|---|---|---|---|---|")
    print(row("reference (no conversion)", reference))
    print(row("during 2 MiB fetch + conversion", measured))
    print(row("first fetch (starts the workers)", [first]))
    worst = max(run.worst_ms for run in measured)
    verdict = "within" if worst < TARGET_STALL_MS else "OVER"
    print(f"longest stall during conversion: {worst:.1f} ms ({verdict} the {TARGET_STALL_MS:g} ms target)")
    for label, runs in (("reference", reference), ("conversion", measured)):
        print(f"per-round longest, {label}: " + " ".join(f"{run.worst_ms:.1f}" for run in runs))
    return 0 if len(fetch_seconds) == rounds else 1


if __name__ == "__main__":
    sys.exit(main())
