"""Transparent-interception benchmark: the transparent listener beside the forward proxy, and the
policy-aware DNS listener beside dnsmasq, in one run, in a real pod namespace.

The topology is the netns tests' own (tests/transparent/netns.py): a pod namespace with the rules
applied by `redirect --apply` and the gateway under its own uid, an internet namespace with the
aiohttp origins (HTTP :80 and TLS :443 on 203.0.113.10) and dnsmasq as a fast authoritative DNS
(203.0.113.2:53). Load generators run in the pod as the agent uid, with no proxy settings for the
transparent path and an explicit CONNECT / absolute-URI request for the proxy path, against the
same origin, so the ratio is the cost of SO_ORIGINAL_DST + first-flight peek + per-port
principal against CONNECT parsing. DNS: queries for an allowed name through the listener (sent to
the upstream's address; the rules redirect them) against dnsmasq in the pod as an unfiltered,
uncached forwarder to the same upstream. Every loop is bounded by time; figures are printed.

    sudo .venv/bin/python bench/transparent.py [--seconds 5]

Needs root, iproute2, nftables and dnsmasq (`scripts/install-system-deps.sh`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from dnslib import DNSRecord

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.transparent.conftest import WORLD, transparent_policy  # noqa: E402
from tests.transparent.netns import AGENT_UID, DNS_V4, GATEWAY_UID, INET_V4, ORIGIN_V4, Topology  # noqa: E402

NAME = "docs.example.org"
CONCURRENCY = 16
DNS_WORKERS = 16
DNSMASQ_PORT = 5353
DNSMASQ_CACHED_PORT = 5354


def client_hello(name: str) -> bytes:
    """A real ClientHello for `name`, made once and replayed (each origin answers it afresh)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=name)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()  # wants the ServerHello; the ClientHello is already written
    return outgoing.read()


# load generators (run inside the pod as the agent uid) --------------------------------------------
async def _setup_once(mode: str, hello: bytes) -> None:
    if mode == "transparent":
        reader, writer = await asyncio.open_connection(ORIGIN_V4, 443)
    else:
        reader, writer = await asyncio.open_connection("127.0.0.1", 3128)
        writer.write(f"CONNECT {NAME}:443 HTTP/1.1\r\nHost: {NAME}:443\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(head.decode(errors="replace"))
    writer.write(hello)
    if not await reader.read(1):
        raise RuntimeError("no ServerHello")
    writer.close()


async def load_setup(mode: str, seconds: float) -> dict[str, Any]:
    """Tunnels set up per second: connect, ClientHello through, the origin's first byte back."""
    hello = client_hello(NAME)
    deadline = time.monotonic() + seconds
    done = errors = 0

    async def worker() -> None:
        nonlocal done, errors
        while time.monotonic() < deadline:
            try:
                await _setup_once(mode, hello)
                done += 1
            except (OSError, RuntimeError, asyncio.IncompleteReadError):
                errors += 1

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return {"per_s": done / (time.monotonic() - started), "errors": errors}


async def load_http(mode: str, seconds: float) -> dict[str, Any]:
    """Keep-alive GETs per second over CONCURRENCY connections."""
    if mode == "transparent":
        target, host, port = b"/", ORIGIN_V4, 80
    else:
        target, host, port = f"http://{NAME}/".encode(), "127.0.0.1", 3128
    request = b"GET " + target + b" HTTP/1.1\r\nHost: " + NAME.encode() + b"\r\n\r\n"
    deadline = time.monotonic() + seconds
    done = errors = 0

    async def worker() -> None:
        nonlocal done, errors
        reader, writer = await asyncio.open_connection(host, port)
        while time.monotonic() < deadline:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            if head.startswith(b"HTTP/1.1 200"):
                done += 1
            else:
                errors += 1
        writer.close()

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return {"per_s": done / (time.monotonic() - started), "errors": errors}


class _Answers(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.waiter: asyncio.Future[bytes] | None = None

    def datagram_received(self, data: bytes, addr: object) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(data)


async def load_dns(server: str, port: int, seconds: float) -> dict[str, Any]:
    """Queries answered per second, DNS_WORKERS outstanding at a time."""
    loop = asyncio.get_running_loop()
    query = bytes(DNSRecord.question(NAME, "A").pack())
    deadline = time.monotonic() + seconds
    done = errors = 0

    async def worker() -> None:
        nonlocal done, errors
        transport, proto = await loop.create_datagram_endpoint(_Answers, remote_addr=(server, port))
        while time.monotonic() < deadline:
            proto.waiter = loop.create_future()
            transport.sendto(query)
            try:
                reply = await asyncio.wait_for(proto.waiter, 2.0)
            except TimeoutError:
                errors += 1
                continue
            # NOERROR with at least one answer, read from the header: a full parse per reply would
            # cost the load generator more CPU than the servers it measures, on the same two cores.
            if len(reply) >= 12 and reply[3] & 0x0F == 0 and int.from_bytes(reply[6:8]) > 0:
                done += 1
            else:
                errors += 1
        transport.close()

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(DNS_WORKERS)))
    return {"per_s": done / (time.monotonic() - started), "errors": errors}


def child_main(args: list[str]) -> None:
    import uvloop  # noqa: PLC0415

    kind, mode, seconds = args[0], args[1], float(args[2])
    if kind == "setup":
        result = uvloop.run(load_setup(mode, seconds))
    elif kind == "http":
        result = uvloop.run(load_http(mode, seconds))
    else:
        server, port = {
            "gateway": (DNS_V4, 53),
            "dnsmasq": ("127.0.0.1", DNSMASQ_PORT),
            "dnsmasq-cached": ("127.0.0.1", DNSMASQ_CACHED_PORT),
        }[mode]
        result = uvloop.run(load_dns(server, port, seconds))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


# orchestration ------------------------------------------------------------------------------------
def run_child(pod: Topology, *args: str) -> dict[str, Any]:
    result = pod.agent(sys.executable, str(Path(__file__).resolve()), "--child", *args, uid=AGENT_UID)
    if result.returncode != 0:
        raise RuntimeError(result.stderr)
    parsed: dict[str, Any] = orjson.loads(result.stdout)
    return parsed


def start_dnsmasq(namespace: str, *args: str, uid: int | None = None) -> subprocess.Popen[bytes]:
    prefix = ["ip", "netns", "exec", namespace]
    if uid is not None:
        prefix += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    command = [*prefix, "dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts", "--bind-interfaces"]
    process = subprocess.Popen([*command, "--pid-file=", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.5)
    if process.poll() is not None:
        raise RuntimeError(f"dnsmasq exited: {process.stderr.read().decode() if process.stderr else ''}")
    return process


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best of each is kept")
    parser.add_argument("--only", choices=("setup", "http", "dns"), help="measure one kind only")
    options = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("dnsmasq") is None:
        sys.exit("needs root and dnsmasq (scripts/install-system-deps.sh)")
    pod = Topology("bench")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        pod.build()
        pod.start_world(WORLD)
        # A fast authoritative upstream, so the forwarders, not the upstream, are what is measured.
        processes.append(
            start_dnsmasq(
                pod.inet,
                f"--listen-address={INET_V4}",
                "--port=53",
                f"--address=/{NAME}/{ORIGIN_V4}",
                # TTL 300 s as a real name has: the gateway's DNS cache is exercised as in production.
                "--local-ttl=300",
                "--user=root",
            )
        )
        policy = transparent_policy()
        policy["proxy"] = {"max_tunnels_per_principal": 4096}
        pod.start_gateway(policy, env={"EGRESS_NAMESERVERS": f"{INET_V4}:53", "EGRESS_AUDIT_LOG": "off"})
        pod.redirect("--apply")
        # The unfiltered reference: dnsmasq in the pod, uncached, as the exempt uid (its own upstream
        # queries must not be redirected back into the gateway's listener).
        processes.append(
            start_dnsmasq(
                pod.pod,
                "--listen-address=127.0.0.1",
                f"--port={DNSMASQ_PORT}",
                f"--server={INET_V4}",
                "--cache-size=0",
                uid=GATEWAY_UID,
            )
        )
        # And the same dnsmasq with its cache, the fair reference for the listener's answers from
        # the gateway's own resolver cache.
        processes.append(
            start_dnsmasq(
                pod.pod,
                "--listen-address=127.0.0.1",
                f"--port={DNSMASQ_CACHED_PORT}",
                f"--server={INET_V4}",
                "--cache-size=10000",
                uid=GATEWAY_UID,
            )
        )
        seconds = str(options.seconds)
        results: dict[str, dict[str, Any]] = {}
        plan: tuple[tuple[str, tuple[str, ...]], ...] = (
            ("setup", ("proxy", "transparent")),
            ("http", ("proxy", "transparent")),
            ("dns", ("dnsmasq", "dnsmasq-cached", "gateway")),
        )
        plan = tuple(entry for entry in plan if options.only in (None, entry[0]))
        for kind, modes in plan:
            for mode in modes:
                run_child(pod, kind, mode, "1")  # warm-up: DNS cache, pooled connections
        # Interleaved rounds, best of each: the machine is shared, and a busy neighbour should
        # not decide which side wins.
        for _ in range(options.rounds):
            for kind, modes in plan:
                for mode in modes:
                    figures = run_child(pod, kind, mode, seconds)
                    best = results.get(f"{kind} {mode}")
                    if best is None or figures["per_s"] > best["per_s"]:
                        results[f"{kind} {mode}"] = figures
    finally:
        for process in processes:
            process.terminate()
            process.wait(10)
        pod.destroy()
    for label, figures in results.items():
        print(f"{label:22s} {figures['per_s']:10.0f}/s  errors {figures['errors']}")
    for kind, reference, measured in (
        ("tunnel setup", "setup proxy", "setup transparent"),
        ("HTTP requests", "http proxy", "http transparent"),
        ("DNS queries", "dns dnsmasq", "dns gateway"),
        ("DNS queries", "dns dnsmasq-cached", "dns gateway"),
    ):
        if measured not in results or reference not in results:
            continue
        ratio = results[measured]["per_s"] / results[reference]["per_s"]
        print(f"{kind}: {measured} / {reference} = {ratio:.2f}")


if __name__ == "__main__":
    main()
