"""Footprint benchmark: PSS of the gateway's whole process tree, idle and after a mixed load.

Starts a real `egress-gateway serve` (harness: fake DNS, test CA, loopback origins) with default
settings and reports the proportional set size (PSS, from /proc/PID/smaps_rollup) summed over the
daemon and every descendant (extraction worker included): idle after start, and after a bounded
mixed load of proxy tunnels, plain HTTP requests through the proxy, 100 web_fetch calls of real
fixture pages (the largest included) and 20 searches against a harness engine. squid and
tinyproxy (Debian packages) are measured in the same run, idle and after the proxy part of the
load. A second table gives, for the same moments, the tree's anonymous memory (what each pod
pays whatever else runs on its node) and an estimate of the tree alone on a node (every mapped
file's resident pages counted once, in full): PSS shares libpython's pages with every other
process mapping them, which flatters any Python program on a machine running others.
Start-up to ready is timed from the fork to the first 200 of /readyz (the harness's 50 ms
polls; bench/startup.py times it precisely, beside a reference).

    .venv/bin/python bench/footprint.py --pages ../shared/fixtures/pages
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import httpx
import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import GatewayProcess, policy_document
from tests.harness.origins import HarnessLoop, OriginFactory

TUNNELS = 300
PLAIN_REQUESTS = 300
FETCHES = 100
SEARCHES = 20
CONCURRENCY = 8
TARGET_IDLE_MB = 45.0
TARGET_LOADED_MB = 60.0
TARGET_READY_S = 1.0
IDLE_EXIT_WAIT_S = 62.0  # the default EGRESS_EXTRACT_IDLE_EXIT_S and a margin


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_port(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


def start_squid(work: Path) -> tuple[subprocess.Popen[bytes], int]:
    """squid as bench/proxy.py runs it: permissive, no cache, one worker."""
    port = _free_port()
    conf = work / "squid.conf"
    conf.write_text(
        f"http_port 127.0.0.1:{port}\nhttp_access allow all\ncache deny all\ncache_mem 8 MB\naccess_log none\n"
        f"cache_log {work}/squid.log\npid_filename {work}/squid.pid\ncoredump_dir {work}\nworkers 1\n"
        "shutdown_lifetime 0 seconds\n"
    )
    proc = subprocess.Popen(["squid", "-N", "-f", str(conf)], stderr=subprocess.DEVNULL)
    _wait_port(port)
    return proc, port


def start_tinyproxy(work: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    conf = work / "tinyproxy.conf"
    conf.write_text(f"Port {port}\nListen 127.0.0.1\nTimeout 600\nMaxClients 4096\nLogLevel Critical\n")
    proc = subprocess.Popen(["tinyproxy", "-d", "-c", str(conf)], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    _wait_port(port)
    return proc, port


def descendants(root: int) -> list[int]:
    """`root` and every process below it, from the parent links in /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_pss_mb(root: int) -> tuple[float, int]:
    pids = descendants(root)
    return sum(pss_kib(pid) for pid in pids) / 1024, len(pids)


def tree_alone_mb(root: int) -> tuple[float, float]:
    """(anonymous, alone) MB: the tree's anonymous memory (PSS, so pages a fork shares inside the
    tree count once), which every pod pays whatever else runs on its node; and what the tree would
    hold alone on a node: that plus every file it maps counted in full, once for the tree (the
    largest resident size among its processes, per file). PSS splits a file's pages with every
    process on the machine that maps it, so libpython's and libcrypto's pages cost a gateway less
    here, beside other Python processes (or on a node running many sidecars of one image), than
    in a pod alone on its node."""
    anon_kib = 0
    file_kib: dict[str, int] = {}
    for pid in descendants(root):
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
            lines = Path(f"/proc/{pid}/smaps").read_text().splitlines()
        except OSError:
            continue
        anon_kib += sum(int(line.split()[1]) for line in rollup if line.startswith("Pss_Anon:"))
        # Per file, this process's resident pages that are the file's own (a mapping's
        # copied-on-write pages are anonymous and already in Pss_Anon).
        own: dict[str, int] = {}
        path = ""
        for line in lines:
            fields = line.split()
            if not fields[0].endswith(":"):
                path = fields[5] if len(fields) > 5 and fields[5].startswith("/") else ""
            elif path and fields[0] == "Rss:":
                own[path] = own.get(path, 0) + int(fields[1])
            elif path and fields[0] == "Anonymous:":
                own[path] -= int(fields[1])
        for name, kib in own.items():
            file_kib[name] = max(file_kib.get(name, 0), kib)
    return anon_kib / 1024, (anon_kib + sum(file_kib.values())) / 1024


def tree_breakdown(root: int) -> str:
    """Each process of the tree as `name PSS`, the name from its command line."""
    parts = []
    for pid in descendants(root):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [word.decode(errors="replace") for word in argv if word]
        name = words[-1] if words and words[-1].startswith("gateway.") else " ".join(Path(w).name for w in words[1:3])
        parts.append(f"{name} {pss_kib(pid) / 1024:.1f}")
    return ", ".join(parts)


async def _tunnel(proxy_port: int, authority: str, target_host: str) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
    writer.write(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"CONNECT refused: {head[:80]!r}")
    writer.write(f"GET /small HTTP/1.1\r\nHost: {target_host}\r\nConnection: close\r\n\r\n".encode())
    await reader.read()
    writer.close()


async def _plain(proxy_port: int, authority: str) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
    writer.write(f"GET http://{authority}/small HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n".encode())
    answer = await reader.read()
    if b" 200 " not in answer.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"plain request refused: {answer[:80]!r}")
    writer.close()


async def _bounded(jobs: Iterable[object], concurrency: int) -> int:
    semaphore = asyncio.Semaphore(concurrency)
    failures = 0

    async def run(job: object) -> None:
        nonlocal failures
        async with semaphore:
            try:
                await asyncio.wait_for(job, 30)  # type: ignore[arg-type]
            except (OSError, RuntimeError, TimeoutError, asyncio.IncompleteReadError, httpx.HTTPError) as exc:
                failures += 1
                if failures == 1:
                    print(f"first failure: {exc}"[:300], file=sys.stderr)

    await asyncio.gather(*(run(job) for job in jobs))
    return failures


def proxy_load(proxy_port: int, authority: str, host: str) -> int:
    """Tunnels then plain requests through the proxy; the number that failed."""

    async def load() -> int:
        failed = await _bounded((_tunnel(proxy_port, authority, host) for _ in range(TUNNELS)), CONCURRENCY)
        return failed + await _bounded((_plain(proxy_port, authority) for _ in range(PLAIN_REQUESTS)), CONCURRENCY)

    return asyncio.run(load())


def fixture_pages(pages: Path) -> dict[str, bytes]:
    """FETCHES pages by name order, the largest always among them."""
    sources = sorted(pages.glob("*/source.html"))
    largest = max(sources, key=lambda path: path.stat().st_size)
    chosen = [largest, *[path for path in sources if path != largest][: FETCHES - 1]]
    return {path.parent.name: path.read_bytes() for path in chosen}


def tool_load(api_url: str, page_url: str, names: list[str]) -> tuple[int, int]:
    """FETCHES web_fetch calls and SEARCHES searches, CONCURRENCY at a time; (fetch, search) failures."""

    async def load() -> tuple[int, int]:
        async with httpx.AsyncClient(timeout=60) as client:

            async def fetch(name: str) -> None:
                response = await client.post(f"{api_url}/v1/fetch", json={"url": page_url + name})
                if response.status_code != 200:
                    raise RuntimeError(response.text[:200])

            async def search(index: int) -> None:
                response = await client.post(f"{api_url}/v1/search", json={"query": f"footprint query {index}"})
                if response.status_code != 200:
                    raise RuntimeError(response.text[:200])

            fetch_failed = await _bounded((fetch(name) for name in names), CONCURRENCY)
            search_failed = await _bounded((search(index) for index in range(SEARCHES)), CONCURRENCY)
            return fetch_failed, search_failed

    return asyncio.run(load())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=Path, default=Path("../shared/fixtures/pages"))
    parser.add_argument("--settle-s", type=float, default=1.0, help="pause before each measurement")
    parser.add_argument(
        "--wait-idle-exit", action="store_true", help="also measure after the extraction worker's idle exit (~62 s)"
    )
    parser.add_argument(
        "--gateway-path", type=Path, default=None, help="run the gateway package of another checkout (PYTHONPATH)"
    )
    args = parser.parse_args()
    pages = fixture_pages(args.pages)
    rows: list[tuple[str, float, int, float, int, str]] = []
    alone: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {}
    notes: list[str] = []

    with tempfile.TemporaryDirectory(prefix="footprint-") as tmp:
        work = Path(tmp)
        work.chmod(0o777)  # squid drops to the proxy user and writes its log here
        dns = FakeDNS().start()
        loop = HarnessLoop()
        pki = TestPKI(work)
        origins = OriginFactory(loop, pki, dns)
        gateway: GatewayProcess | None = None
        others: list[subprocess.Popen[bytes]] = []
        try:

            async def page(request: web.Request) -> web.Response:
                return web.Response(body=pages[request.match_info["name"]], content_type="text/html")

            async def small(_: web.Request) -> web.Response:
                return web.Response(text="ok " * 100)

            async def results(request: web.Request) -> web.Response:
                query = request.query.get("q", "")
                items = [
                    {"url": f"https://result{index}.example.net/{index}", "title": f"{query} {index}", "content": "x"}
                    for index in range(10)
                ]
                return web.Response(body=orjson.dumps(items), content_type="application/json")

            site = web.Application()
            site.router.add_get("/page/{name}", page)
            site.router.add_get("/small", small)
            site_origin = origins.start(site, names=["pages.example.org"])
            engine = web.Application()
            engine.router.add_get("/search", results)
            engine_origin = origins.start(engine, names=["engine.example.org"])
            plain = web.Application()
            plain.router.add_get("/small", small)
            plain_origin = origins.start(plain, names=["plain.example.org"], tls=False)

            policy = policy_document(
                allow_cidrs=[site_origin.cidr, engine_origin.cidr, plain_origin.cidr],
                ports=[80, 443, site_origin.port, engine_origin.port, plain_origin.port],
                fetch={"robots": "ignore"},
                principals={
                    "default": {
                        "egress": {"allow_domains": ["*"]},
                        "tools": {"search": True, "fetch": True},
                        "budgets": {
                            tool: {"per_step": 10_000, "per_run": 10_000, "concurrent": 64, "min_interval_s": 0}
                            for tool in ("search", "fetch")
                        },
                    }
                },
            )
            env = {
                **({"PYTHONPATH": str(args.gateway_path.resolve())} if args.gateway_path else {}),
                "EGRESS_SEARCH_ENGINES": "template",
                "EGRESS_SEARCH_URL": engine_origin.url("/search", "engine.example.org") + "?q={query}&n={limit}",
            }
            gateway_dir = work / "gateway"
            gateway_dir.mkdir()
            gateway = GatewayProcess(gateway_dir, policy, nameserver=dns.nameserver, ca_bundle=pki.ca_path, env=env)
            started = time.perf_counter()
            gateway.start()
            ready_s = time.perf_counter() - started
            time.sleep(args.settle_s)
            idle, idle_n = tree_pss_mb(gateway.pid)
            idle_alone = tree_alone_mb(gateway.pid)
            authority = f"plain.example.org:{plain_origin.port}"
            load_started = time.perf_counter()
            proxy_failed = proxy_load(gateway.proxy_port, authority, "plain.example.org")
            after_proxy, _ = tree_pss_mb(gateway.pid)
            notes.append(f"gateway tree after the proxy part alone: {after_proxy:.1f} MB PSS")
            fetch_failed, search_failed = tool_load(
                gateway.api_url, site_origin.url("/page/", "pages.example.org"), list(pages)
            )
            load_s = time.perf_counter() - load_started
            time.sleep(args.settle_s)
            loaded, loaded_n = tree_pss_mb(gateway.pid)
            alone["egress-gateway (defaults)"] = (idle_alone, tree_alone_mb(gateway.pid))
            notes.append(f"gateway tree after load (MB PSS): {tree_breakdown(gateway.pid)}")
            if args.wait_idle_exit:
                time.sleep(IDLE_EXIT_WAIT_S)
                after_exit, after_exit_n = tree_pss_mb(gateway.pid)
                notes.append(f"gateway tree {IDLE_EXIT_WAIT_S:g} s after the load: {after_exit:.1f} MB PSS, "
                             f"{after_exit_n} process(es)")  # fmt: skip
            rows.append(("egress-gateway (defaults)", idle, idle_n, loaded, loaded_n, "mixed"))
            notes.append(
                f"gateway: ready in {ready_s * 1000:.0f} ms (target < {TARGET_READY_S * 1000:.0f}); mixed load "
                f"{load_s:.1f} s; failures: proxy {proxy_failed}, fetch {fetch_failed}/{len(pages)}, "
                f"search {search_failed}/{SEARCHES}"
            )
            gateway.stop()
            gateway = None

            plain_ip_authority = f"{plain_origin.ip}:{plain_origin.port}"
            for name, starter in (("squid", start_squid), ("tinyproxy", start_tinyproxy)):
                if shutil.which(name) is None:
                    notes.append(f"{name}: not installed (apt-get install -y {name})")
                    continue
                own = work / name
                own.mkdir()
                own.chmod(0o777)
                proc, port = starter(own)
                others.append(proc)
                time.sleep(args.settle_s)
                idle_other, idle_other_n = tree_pss_mb(proc.pid)
                idle_other_alone = tree_alone_mb(proc.pid)
                failed = proxy_load(port, plain_ip_authority, plain_origin.ip)
                time.sleep(args.settle_s)
                loaded_other, loaded_other_n = tree_pss_mb(proc.pid)
                alone[name] = (idle_other_alone, tree_alone_mb(proc.pid))
                rows.append((name, idle_other, idle_other_n, loaded_other, loaded_other_n, "proxy part"))
                notes.append(f"{name}: proxy failures {failed}")
                proc.terminate()
                proc.wait(15)
        finally:
            if gateway is not None:
                gateway.stop()
            for proc in others:
                if proc.poll() is None:
                    proc.kill()
            origins.stop_all()
            loop.stop()
            dns.stop()

    print(f"load: {TUNNELS} tunnels, {PLAIN_REQUESTS} plain HTTP, {len(pages)} web_fetch, {SEARCHES} searches")
    print("| process tree | idle PSS MB | processes | PSS MB after load | processes | load |")
    print("|---|---|---|---|---|---|")
    for name, idle_mb, idle_count, loaded_mb, loaded_count, load in rows:
        print(f"| {name} | {idle_mb:.1f} | {idle_count} | {loaded_mb:.1f} | {loaded_count} | {load} |")
    print("| process tree | anonymous MB idle | after load | alone on a node MB idle | after load |")
    print("|---|---|---|---|---|")
    for name, ((anon_idle_mb, alone_idle_mb), (anon_loaded_mb, alone_loaded_mb)) in alone.items():
        print(f"| {name} | {anon_idle_mb:.1f} | {anon_loaded_mb:.1f} | {alone_idle_mb:.1f} | {alone_loaded_mb:.1f} |")
    for note in notes:
        print(note)
    gateway_row = rows[0] if rows else None
    if gateway_row is not None:
        print(
            f"targets: idle {gateway_row[1]:.1f} MB ({'within' if gateway_row[1] <= TARGET_IDLE_MB else 'OVER'} "
            f"{TARGET_IDLE_MB:g}), after load {gateway_row[3]:.1f} MB "
            f"({'within' if gateway_row[3] <= TARGET_LOADED_MB else 'OVER'} {TARGET_LOADED_MB:g})"
        )
    return 0 if os.geteuid() >= 0 else 1


if __name__ == "__main__":
    sys.exit(main())
