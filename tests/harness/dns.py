"""A scriptable fake DNS server (dnslib) on 127.0.0.1 at a random port.

Tests route real-looking names (docs.example.org, html.duckduckgo.com) to loopback origins
through it, and script failures: NXDOMAIN, SERVFAIL, silence, and answer sequences for
rebinding (public first, private next).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from dnslib import AAAA, CNAME, QTYPE, RCODE, RR, A, DNSError, DNSLabel, DNSRecord
from dnslib.server import BaseResolver, DNSLogger, DNSServer


@dataclass
class _Script:
    answers: list[list[str]]  # each entry: addresses and "cname:target" items
    ttl: int = 0
    failure: str | None = None  # NXDOMAIN, SERVFAIL, silence
    delay_s: float = 0.0  # a slow resolver: answer only after this long
    served: dict[str, int] = field(default_factory=dict)

    def next_answer(self, qtype: str) -> list[str]:
        index = self.served.get(qtype, 0)
        self.served[qtype] = index + 1
        return self.answers[min(index, len(self.answers) - 1)]


class _ScriptedResolver(BaseResolver):  # type: ignore[misc]
    def __init__(self) -> None:
        self.scripts: dict[str, _Script] = {}
        self.lock = threading.Lock()
        self.queries: list[tuple[str, str]] = []

    def resolve(self, request: DNSRecord, handler: object) -> DNSRecord:
        reply = request.reply()
        qname = str(request.q.qname).rstrip(".").lower()
        qtype = QTYPE[request.q.qtype]
        with self.lock:
            self.queries.append((qname, qtype))
            script = self.scripts.get(qname)
            if script is None:
                reply.header.rcode = RCODE.NXDOMAIN
                return reply
            if script.failure == "silence":
                raise DNSError("scripted silence")
            if script.failure == "SERVFAIL":
                reply.header.rcode = RCODE.SERVFAIL
                return reply
            if script.failure == "NXDOMAIN":
                reply.header.rcode = RCODE.NXDOMAIN
                return reply
            items = script.next_answer(qtype)
            ttl = script.ttl
            delay_s = script.delay_s
        if delay_s:
            time.sleep(delay_s)  # dnslib serves each query on its own thread
        self._answer(reply, qname, qtype, items, ttl, depth=0)
        return reply

    def _answer(self, reply: DNSRecord, qname: str, qtype: str, items: list[str], ttl: int, depth: int) -> None:
        for item in items:
            if item.startswith("cname:"):
                target = item[len("cname:") :]
                reply.add_answer(RR(DNSLabel(qname), QTYPE.CNAME, rdata=CNAME(target), ttl=ttl))
                # A recursive resolver returns the whole chain in one answer.
                target_script = self.scripts.get(target)
                if target_script is not None and depth < 8:
                    self._answer(reply, target, qtype, target_script.next_answer(qtype), target_script.ttl, depth + 1)
            elif ":" in item and qtype == "AAAA":
                reply.add_answer(RR(DNSLabel(qname), QTYPE.AAAA, rdata=AAAA(item), ttl=ttl))
            elif ":" not in item and qtype == "A":
                reply.add_answer(RR(DNSLabel(qname), QTYPE.A, rdata=A(item), ttl=ttl))


class FakeDNS:
    """Start with `start()`; script with `add`, `sequence`, `fail`; give `.nameserver` to the gateway."""

    def __init__(self) -> None:
        self._resolver = _ScriptedResolver()
        self.port = _free_udp_port()
        # Only the server's own errors are printed: dnslib's `log="-"` keeps every default hook
        # (a bare "-" disables nothing), which printed each query and answer.
        quiet = DNSLogger(log="error", prefix=False)
        self._server = DNSServer(self._resolver, port=self.port, address="127.0.0.1", logger=quiet)

    @property
    def nameserver(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def queries(self) -> list[tuple[str, str]]:
        with self._resolver.lock:
            return list(self._resolver.queries)

    def start(self) -> FakeDNS:
        self._server.start_thread()
        return self

    def stop(self) -> None:
        self._server.stop()
        self._server.server.server_close()

    def add(self, name: str, *answers: str, ttl: int = 0, delay_s: float = 0.0) -> None:
        """Answer `name` with these addresses (and `cname:target` items), every time."""
        self.sequence(name, [list(answers)], ttl=ttl, delay_s=delay_s)

    def sequence(self, name: str, answers: Sequence[Sequence[str]], *, ttl: int = 0, delay_s: float = 0.0) -> None:
        """Answer each successive query with the next set; the last one repeats."""
        with self._resolver.lock:
            self._resolver.scripts[name.lower()] = _Script([list(a) for a in answers], ttl, delay_s=delay_s)

    def fail(self, name: str, failure: str) -> None:
        assert failure in {"NXDOMAIN", "SERVFAIL", "silence"}
        with self._resolver.lock:
            self._resolver.scripts[name.lower()] = _Script([[]], 0, failure)

    def remove(self, name: str) -> None:
        with self._resolver.lock:
            self._resolver.scripts.pop(name.lower(), None)


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
