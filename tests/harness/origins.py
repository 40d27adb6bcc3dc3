"""Loopback origins: aiohttp servers on 127.0.0.2-254 with trustme certificates.

They run on a dedicated event loop in a background thread so both async tests (in-process
gateway) and blocking tests (curl against a gateway subprocess) can use them. Each origin gets
its own loopback address; the policy names that exact /32 as an exception, so the rest of
127.0.0.0/8 stays denied and deny tests stay meaningful.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from aiohttp import web

from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS

T = TypeVar("T")


class HarnessLoop:
    """An event loop in a daemon thread; `run` executes a coroutine there and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="harness-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout_s)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


@dataclass
class Origin:
    ip: str
    port: int
    names: tuple[str, ...]
    tls: bool
    runner: web.AppRunner
    listener: socket.socket

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def name(self) -> str:
        return self.names[0]

    def url(self, path: str = "/", name: str | None = None) -> str:
        return f"{self.scheme}://{name or self.name}:{self.port}{path}"

    @property
    def cidr(self) -> str:
        return f"{self.ip}/32"


def listening_socket(ip: str, port: int) -> socket.socket:
    """Bound here, listened on by the server: the harness holds it to stop accepting before the
    server closes (`OriginFactory.stop`). Port 0 picks a free one."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((ip, port))
    sock.setblocking(False)
    return sock


def unanswering_listener(ip: str = "127.0.0.1") -> tuple[socket.socket, list[socket.socket]]:
    """A listener whose accept queue is full, and the sockets filling it (close them all after):
    the kernel drops further SYNs, so a connect to it hangs until its own timeout."""
    listener = socket.socket()
    listener.bind((ip, 0))
    listener.listen(0)
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(listener.getsockname())
        fillers.append(filler)
    return listener, fillers


async def stop_serving(runner: web.AppRunner, listener: socket.socket) -> None:
    """Stop an origin without losing a connection the kernel accepted but the loop had not yet.

    The loop accepts a connection in one callback and builds its transport in a task that runs
    one iteration later. asyncio 3.11's `Server.close()` in between makes that task fail halfway
    (the server is gone), and the half-built transport is collected later as an "unclosed
    transport" ResourceWarning in whichever test is running then. So: accept nothing more, let
    every accepted connection become a transport and reach aiohttp (two iterations: the task's
    first step, then `connection_made`), and only then close, which closes those too.
    """
    asyncio.get_running_loop().remove_reader(listener.fileno())
    for _ in range(2):
        await asyncio.sleep(0)
    await runner.cleanup()


class OriginFactory:
    """Starts origins for a test session and routes their names through the fake DNS."""

    # The loopback addresses handed out and not yet given back, across the session's factories.
    # The suite starts more origins than 127.0.0.2-254 holds, but never that many at once: each
    # test's addresses come back when it ends (`stop_all`) and are handed out again in turn, so a
    # recently used address is the last to be reused.
    _in_use: ClassVar[set[str]] = set()
    _cursor: ClassVar[list[int]] = [2]

    def __init__(self, loop: HarnessLoop, pki: TestPKI, dns: FakeDNS) -> None:
        self._loop = loop
        self._pki = pki
        self._dns = dns
        self._origins: list[Origin] = []
        self._handed_out: list[str] = []

    def next_ip(self) -> str:
        for _ in range(253):
            index = self._cursor[0]
            self._cursor[0] = 2 if index >= 254 else index + 1
            ip = f"127.0.0.{index}"
            if ip not in self._in_use:
                self._in_use.add(ip)
                self._handed_out.append(ip)
                return ip
        raise RuntimeError("the harness ran out of loopback addresses (253 origins alive at once)")

    def start(
        self,
        app: web.Application,
        names: Sequence[str] = ("docs.example.org",),
        *,
        tls: bool = True,
        ip: str | None = None,
        port: int | None = None,
        register_dns: bool = True,
        cert_names: Sequence[str] | None = None,
    ) -> Origin:
        ip = ip or self.next_ip()
        listener = listening_socket(ip, port or 0)
        context = self._pki.server_context(*(cert_names or names)) if tls else None

        async def _start() -> web.AppRunner:
            runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
            await runner.setup()
            await web.SockSite(runner, listener, ssl_context=context).start()
            return runner

        try:
            runner = self._loop.run(_start())
        except BaseException:
            listener.close()
            raise
        origin = Origin(ip, listener.getsockname()[1], tuple(names), tls, runner, listener)
        self._origins.append(origin)
        if register_dns:
            for name in names:
                self._dns.add(name, ip)
        return origin

    def stop(self, origin: Origin) -> None:
        self._loop.run(stop_serving(origin.runner, origin.listener))
        self._origins.remove(origin)

    def stop_all(self) -> None:
        for origin in list(self._origins):
            self.stop(origin)
        self._in_use.difference_update(self._handed_out)
        self._handed_out.clear()
