"""The duties floor: `proxy_floor.py` plus each per-operation duty of the gateway, done the cheapest
way Python allows, so the bench can say what a policy-enforcing Python proxy costs at least,
between the bare floor and the gateway.

Not a proxy anyone should run: it knows one origin address (it trusts that every allowed name
resolves there), and it has none of the gateway's error handling, reload, drain, flow control or
smuggling defences. Each duty is one or two Python statements where the gateway spends layers:

Per CONNECT:
- the head is found and its request line split; `Proxy-Authorization` picks the principal from a
  dict (none: the default principal); a head that is no CONNECT or no HTTP/1.1 gets a 400;
- the authority is looked up in a dict of already-parsed authorities, or split and its port
  range-checked once;
- the decision is one dict lookup per (principal, authority, generation), computed on a miss
  from the principal's allowed suffixes and the address guard (`ipaddress`), then remembered;
- the principal's tunnel count is checked and incremented (decremented at close);
- the head deadline (which also bounds the dial) is one entry in a wheel of one-second slots (a
  dict of sets), filed at accept and discarded when the tunnel is up, one loop timer for all;
- the 200 is written, then the first client bytes are checked for a TLS handshake record before
  they are passed on (no SNI parse: the bench sends none);
- bytes each way are counted;
- an allow line at the decision and a close line at the end, each one `%` format of a prefix
  serialized once per decision (orjson) with the time, connection id and counts, appended to a
  list written out every 64 lines or 50 ms;
- counters as plain ints.

Per absolute-URI request (`GET` or `HEAD` without a body, which is what the bench sends):
- the request line split and the URL's authority and path taken apart, the same principal,
  authority and decision lookups as a CONNECT, the head rewritten to origin form without the
  hop-by-hop fields and the proxy credential;
- an upstream connection taken from a pool per decided address, or dialed;
- the response head found, its status read, its hop-by-hop fields dropped and its
  `Content-Length` read, the body counted to that length, and the connection pooled again at the
  response's end (a response without a length is passed through until the origin closes);
- the same allow line, and a close line with method, path, status and counts.

    python bench/proxy_duties.py PORT ORIGIN_IP [AUDIT_PATH]
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import sys
import time

import orjson
import uvloop

CONNECT_ESTABLISHED = b"HTTP/1.1 200 Connection Established\r\n\r\n"
BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
FORBIDDEN = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
HOP_BY_HOP = frozenset(
    (b"connection", b"proxy-connection", b"keep-alive", b"proxy-authorization", b"te", b"trailer", b"upgrade")
)
HEAD_TIMEOUT_S = 10
ALLOWED_SUFFIXES = {"default": (".example.org",)}
CREDENTIALS: dict[bytes, str] = {}
MAX_TUNNELS_PER_PRINCIPAL = 4096
FLUSH_LINES = 64
FLUSH_AFTER_S = 0.05
TLS_HANDSHAKE = 0x16
END_OF_HEAD = b"\r\n\r\n"


class Wheel:
    """One-second slots of entries due then: filing and discarding an entry is a set operation."""

    def __init__(self) -> None:
        self.slots: dict[int, set[ClientSide]] = {}
        asyncio.get_running_loop().call_later(1.0, self.tick)

    def file(self, entry: ClientSide, at: float) -> int:
        slot = int(at) + 1
        self.slots.setdefault(slot, set()).add(entry)
        return slot

    def discard(self, entry: ClientSide, slot: int) -> None:
        entries = self.slots.get(slot)
        if entries is not None:
            entries.discard(entry)

    def tick(self) -> None:
        now = int(time.monotonic())
        for slot in [slot for slot in self.slots if slot <= now]:
            for entry in self.slots.pop(slot):
                entry.expired()
        asyncio.get_running_loop().call_later(1.0, self.tick)


class Audit:
    """Lines appended to a list and written out in batches."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the process
        self.lines: list[bytes] = []
        self.flush_armed = False

    def append(self, line: bytes) -> None:
        self.lines.append(line)
        if len(self.lines) >= FLUSH_LINES:
            self.flush()
        elif not self.flush_armed:
            self.flush_armed = True
            asyncio.get_running_loop().call_later(FLUSH_AFTER_S, self.flush)

    def flush(self) -> None:
        self.flush_armed = False
        if self.lines:
            self.file.write(b"".join(self.lines))
            self.lines.clear()


class Decision:
    """An allowed (principal, authority): where to dial, and its audit lines' shared members."""

    __slots__ = ("address", "allow_prefix", "close_prefix", "kind", "pool", "port")

    def __init__(self, kind: str, principal: str, host: str, port: int, address: str) -> None:
        self.kind = kind
        self.address = address
        self.port = port
        self.pool: list[UpstreamSide] = []
        members = orjson.dumps({"principal": principal, "host": host, "port": port, "address": address})[1:-1]
        self.allow_prefix = b'{"event":"%s","decision":"allow",%s' % (kind.encode(), members)
        self.close_prefix = b'{"event":"close","kind":"%s",%s' % (kind.encode(), members)


class Duties:
    """The state every connection shares: caches, counts, the audit list, the wheel."""

    def __init__(self, origin_ip: str, audit_path: str) -> None:
        self.origin_ip = origin_ip
        self.authorities: dict[bytes, tuple[str, int] | None] = {}
        self.decisions: dict[tuple[str, str, bytes, int], Decision | None] = {}
        self.generation = 1
        self.tunnels: dict[str, int] = {}
        self.audit = Audit(audit_path)
        self.wheel = Wheel()
        self.ids = itertools.count(1)
        self.allowed = self.closed = self.bytes_relayed = 0

    def authority(self, text: bytes, default_port: int) -> tuple[str, int] | None:
        if text in self.authorities:
            return self.authorities[text]
        host, colon, port_text = text.rpartition(b":")
        if not colon:
            host, port_text = text, str(default_port).encode()
        parsed = None
        if host and port_text.isdigit() and 0 < int(port_text) < 65536:
            parsed = (host.decode("ascii", "replace").lower(), int(port_text))
        self.authorities[text] = parsed
        return parsed

    def decide(self, kind: str, principal: str, text: bytes, default_port: int) -> Decision | None:
        key = (kind, principal, text, self.generation)
        if key in self.decisions:
            return self.decisions[key]
        decision = None
        authority = self.authority(text, default_port)
        # The bench's DNS answer for every allowed name is the origin's address.
        address = ipaddress.ip_address(self.origin_ip)
        if (
            authority is not None
            and authority[0].endswith(ALLOWED_SUFFIXES.get(principal, ()))
            and (address.is_global or address.is_loopback)
        ):
            decision = Decision(kind, principal, authority[0], authority[1], self.origin_ip)
        self.decisions[key] = decision
        return decision


class UpstreamSide(asyncio.Protocol):
    """The origin's side: a tunnel's bytes, or one pooled connection's responses, re-framed."""

    __slots__ = ("body_left", "client", "head", "pool", "status", "transport")
    transport: asyncio.Transport

    def __init__(self, client: ClientSide) -> None:
        self.client = client
        self.pool: list[UpstreamSide] | None = None  # the pool it is parked in
        self.head = b""
        self.body_left = -1  # -1: reading a head; -2: no length, until the origin closes
        self.status = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        client = self.client
        client.down += len(data)
        if client.tunnel:
            client.transport.write(data)
            return
        if self.body_left == -1:
            self.head += data
            end = self.head.find(END_OF_HEAD)
            if end < 0:
                return
            head, data = self.head[:end], self.head[end + 4 :]
            self.head = b""
            lines = head.split(b"\r\n")
            self.status = int(lines[0][9:12])
            kept = [lines[0]]
            self.body_left = -2
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.lower()
                if name in HOP_BY_HOP:
                    continue
                if name == b"content-length":
                    self.body_left = int(value)
                kept.append(line)
            if client.method == b"HEAD":
                self.body_left = 0
            kept.append(b"\r\n")
            client.transport.write(b"\r\n".join(kept) + data)
        else:
            client.transport.write(data)
        if self.body_left >= 0:
            self.body_left -= len(data)
            if self.body_left <= 0:
                self.body_left = -1
                client.response_done(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.pool is not None:
            self.pool.remove(self)
        elif self.client.tunnel or self.body_left == -2:
            self.client.transport.close()


class ClientSide(asyncio.Protocol):
    """A client connection: one CONNECT, or absolute-URI requests one at a time."""

    __slots__ = (
        "conn",
        "decision",
        "down",
        "duties",
        "method",
        "opened_at",
        "path",
        "pending",
        "principal",
        "slot",
        "transport",
        "tunnel",
        "up",
        "upstream",
        "vetted",
    )
    transport: asyncio.Transport

    def __init__(self, duties: Duties) -> None:
        self.duties = duties
        self.upstream: asyncio.Transport | None = None
        self.pending = b""
        self.tunnel = False
        self.vetted = False
        self.decision: Decision | None = None
        self.principal = ""
        self.method = b""
        self.path = b""
        self.up = self.down = 0
        self.conn = 0
        self.opened_at = 0.0
        self.slot = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass
        self.conn = next(self.duties.ids)
        self.opened_at = time.monotonic()
        self.slot = self.duties.wheel.file(self, self.opened_at + HEAD_TIMEOUT_S)

    def expired(self) -> None:
        if self.upstream is None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.tunnel and self.upstream is not None:
            if not self.vetted:
                if data[0] != TLS_HANDSHAKE:
                    self.transport.abort()
                    return
                self.vetted = True
            self.up += len(data)
            self.upstream.write(data)
            return
        self.pending += data
        if self.tunnel or self.decision is not None:
            return  # dialing, or a response is owed: the next head waits
        end = self.pending.find(END_OF_HEAD)
        if end < 0:
            return
        head, self.pending = self.pending[: end + 4], self.pending[end + 4 :]
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or parts[2] != b"HTTP/1.1":
            self.refuse(BAD_REQUEST)
            return
        principal = "default"
        for line in lines[1:]:
            if line[:20].lower() == b"proxy-authorization:":
                principal = CREDENTIALS.get(line[20:].strip(), "")
        if parts[0] == b"CONNECT":
            self.connect(principal, parts[1])
        elif parts[0] in (b"GET", b"HEAD") and parts[1].startswith(b"http://"):
            self.forward(principal, parts[0], parts[1], lines[1:-2])
        else:
            self.refuse(BAD_REQUEST)

    def connect(self, principal: str, target: bytes) -> None:
        duties = self.duties
        decision = duties.decide("connect", principal, target, 443)
        count = duties.tunnels.get(principal, 0)
        if decision is None or count >= MAX_TUNNELS_PER_PRINCIPAL:
            self.refuse(FORBIDDEN)
            return
        duties.tunnels[principal] = count + 1
        self.principal = principal
        self.decision = decision
        self.tunnel = True
        self.allowed(decision)
        asyncio.get_running_loop().create_task(self.dial(decision))

    def forward(self, principal: str, method: bytes, url: bytes, fields: list[bytes]) -> None:
        authority, _, path = url[7:].partition(b"/")
        decision = self.duties.decide("http", principal, authority, 80)
        if decision is None:
            self.refuse(FORBIDDEN)
            return
        self.decision = decision
        self.method = method
        self.path = b"/" + path
        self.allowed(decision)
        kept = [method + b" " + self.path + b" HTTP/1.1"]
        for line in fields:
            if line.partition(b":")[0].lower() not in HOP_BY_HOP:
                kept.append(line)
        kept.append(b"\r\n")
        request = b"\r\n".join(kept)
        if decision.pool:
            upstream = decision.pool.pop()
            upstream.pool = None
            upstream.client = self
            upstream.transport.write(request)
        else:
            asyncio.get_running_loop().create_task(self.dial(decision, request))

    def allowed(self, decision: Decision) -> None:
        self.duties.wheel.discard(self, self.slot)
        self.duties.allowed += 1
        self.duties.audit.append(decision.allow_prefix + b',"ts":%.6f,"conn":%d}\n' % (time.time(), self.conn))

    def refuse(self, answer: bytes) -> None:
        self.transport.write(answer)
        self.transport.close()

    async def dial(self, decision: Decision, request: bytes = b"") -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_connection(lambda: UpstreamSide(self), decision.address, decision.port)
        if request:
            transport.write(request)
            return
        self.upstream = transport
        self.transport.write(CONNECT_ESTABLISHED)
        if self.pending:
            pending, self.pending = self.pending, b""
            self.data_received(pending)

    def response_done(self, upstream: UpstreamSide) -> None:
        decision = self.decision
        assert decision is not None
        self.decision = None
        decision.pool.append(upstream)
        upstream.pool = decision.pool
        self.closed(decision, b',"method":"%s","path":"%s","status":%d' % (self.method, self.path, upstream.status))
        self.up = self.down = 0
        if self.pending:
            pending, self.pending = self.pending, b""
            self.data_received(pending)

    def closed(self, decision: Decision, members: bytes = b"") -> None:
        duties = self.duties
        duties.closed += 1
        duties.bytes_relayed += self.up + self.down
        duties.audit.append(
            decision.close_prefix
            + members
            + b',"ts":%.6f,"conn":%d,"bytes_up":%d,"bytes_down":%d,"duration_ms":%.1f}\n'
            % (time.time(), self.conn, self.up, self.down, (time.monotonic() - self.opened_at) * 1000)
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.duties.wheel.discard(self, self.slot)
        if self.upstream is not None:
            self.upstream.close()
        if self.tunnel and self.decision is not None:
            self.duties.tunnels[self.principal] -= 1
            self.closed(self.decision)


async def serve(port: int, origin_ip: str, audit_path: str) -> None:
    loop = asyncio.get_running_loop()
    duties = Duties(origin_ip, audit_path)
    server = await loop.create_server(lambda: ClientSide(duties), "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "/dev/null"))
