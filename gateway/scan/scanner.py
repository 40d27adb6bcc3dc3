"""The outbound scanner: every tier over a URL, a header, a query or a streamed body window.

Pure: bytes and strings in, `Finding`s out. A finding names the rule and where it was found (the
URL, a header's name, an offset into the decoded body), never the matched text, so it can go
into an audit line as it is. A body is scanned as it streams: each chunk is read together with
the last `overlap` bytes of the one before, so a token split across chunks (or TCP segments) is
found once, at its offset in the body, as long as it starts inside the window. Bodies under a
`Content-Encoding` of gzip, deflate or br are decoded within the window (and a ratio cap) first.
Never decides what a finding means (`gateway/credentials/screen.py` does), never touches a socket.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from gateway.egress.decompress import StreamingDecode
from gateway.errors import GatewayError
from gateway.scan.exact import ExactHit, ExactNeedles
from gateway.scan.rules import COMPILED, MAX_TOKEN_BYTES, CompiledRules

# URL parts shorter than this carry too little to judge by entropy; longer ones are cut here.
MIN_ENTROPY_CHARS = 32
MAX_ENTROPY_CHARS = 512
# Bits per character: random base62/base64 of 32+ characters sits at 4.6-5.2; a git SHA (hex)
# cannot pass 4.0, a UUID sits at 3.6, English prose about 4.2 (the research notes' figures).
MIN_ENTROPY_BITS = 4.5
# Findings kept per piece or body: an agent pasting a key file does not need 50,000 lines.
MAX_FINDINGS = 64
_URL_SEPARATORS = bytes.maketrans(b"/?&=#;,:@+", b"          ")
# Where a finding was seen.
URL, HEADER, BODY, QUERY, DNS = "url", "header", "body", "query", "dns"


@dataclass(frozen=True, slots=True)
class Finding:
    rule: str  # `tier1.placeholder`, `tier1.secret_value`, `tier2.github_token`, ...
    tier: int
    where: str  # url | header | body | query | dns
    header: str | None = None  # the header's name, for `where == "header"`
    offset: int | None = None  # into the URL, the header's value, the query or the decoded body
    credential: str | None = None  # tier 1: the credential whose value or placeholder it is

    def audit(self) -> dict[str, object]:
        out: dict[str, object] = {"rule": self.rule, "tier": self.tier, "where": self.where}
        if self.header is not None:
            out["header"] = self.header
        if self.offset is not None:
            out["offset"] = self.offset
        if self.credential is not None:
            out["credential"] = self.credential
        return out


def _tier1(hit: ExactHit, where: str, header: str | None, offset: int) -> Finding:
    rule = "tier1.placeholder" if hit.kind == "placeholder" else "tier1.secret_value"
    return Finding(rule, 1, where, header, offset, hit.credential)


def shannon_bits(text: str) -> float:
    counts = Counter(text)
    total = len(text)
    return -sum(n / total * math.log2(n / total) for n in counts.values())


def high_entropy_offsets(url: bytes) -> list[int]:
    """Offsets of URL components (path segments, query names and values) that look random."""
    out: list[int] = []
    if len(url) < MIN_ENTROPY_CHARS:
        return out
    position = 0
    for piece in url.translate(_URL_SEPARATORS).split(b" "):
        if len(piece) >= MIN_ENTROPY_CHARS:
            bits = shannon_bits(piece[:MAX_ENTROPY_CHARS].decode("latin-1"))
            if bits >= MIN_ENTROPY_BITS:
                out.append(position)
        position += len(piece) + 1
    return out


class Scanner:
    """The tiers to run (a tier whose action is `off` is not run) over one snapshot of needles."""

    __slots__ = ("needles", "overlap", "rules", "tier1", "tier3")

    def __init__(self, needles: ExactNeedles, *, tier1: bool = True, tier2: bool = True, tier3: bool = True) -> None:
        self.needles = needles
        self.tier1 = tier1 and not needles.empty
        self.tier3 = tier3
        self.rules: CompiledRules | None = COMPILED.get((tier2, tier3))
        self.overlap = max(MAX_TOKEN_BYTES, needles.max_length)

    def scan_piece(self, data: bytes, where: str, header: str | None, base: int, new_from: int) -> list[Finding]:
        """Matches in `data` ending past `new_from`; offsets reported as `base` + position."""
        hits = self.needles.find(data) if self.tier1 else []
        out = [_tier1(hit, where, header, base + hit.start) for hit in hits if hit.end > new_from]
        # A shape-preserving placeholder (`ghp_egph...`) is tier 1's, not also a GitHub token.
        spans = [(hit.start, hit.end) for hit in hits if hit.kind == "placeholder"]
        if self.rules is not None:
            for rule, tier, start, end in self.rules.find(data):
                if end > new_from and not any(s < end and start < e for s, e in spans):
                    out.append(Finding(rule, tier, where, header, base + start))
        return out[:MAX_FINDINGS]

    def scan_text(self, text: str | bytes, where: str, header: str | None = None) -> list[Finding]:
        """A URL, a header's value, a search query: one piece, scanned whole."""
        data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
        findings = self.scan_piece(data, where, header, 0, 0)
        if where in (URL, QUERY) and self.tier3:
            findings.extend(self._entropy(data, where, findings))
        return findings

    def _entropy(self, url: bytes, where: str, findings: list[Finding]) -> list[Finding]:
        # A placeholder is random by design: tier 1 judges it, entropy does not count it twice.
        held = [(f.offset or 0, (f.offset or 0) + self.needles.max_length) for f in findings if f.tier == 1]
        return [
            Finding("tier3.high_entropy_url", 3, where, None, at)
            for at in high_entropy_offsets(url)
            if not any(start <= at < end for start, end in held)
        ]

    def scan_head(self, url: bytes, fields: bytes) -> list[Finding]:
        """A request's URL and its header field lines (each `CRLF name: value`), read in one
        pass; a finding past the URL is placed by its header's name and the offset into its value."""
        found = self.scan_piece(url + fields, URL, None, 0, 0)
        cut = len(url)
        in_url = [f for f in found if (f.offset or 0) < cut]
        out = in_url + [_in_header(fields, f, cut) for f in found if (f.offset or 0) >= cut]
        if self.tier3:
            out.extend(self._entropy(url, URL, in_url))
        return out

    def scan_dns_name(self, name: str) -> list[Finding]:
        """Placeholders in a DNS name, in any case and across labels (tier 1 only: a name is
        too short and too constrained for the token formats)."""
        return [
            Finding("tier1.placeholder", 1, DNS, credential=credential)
            for credential in self.needles.find_in_dns_name(name)
        ]

    def body(self, window_bytes: int, content_encoding: str | None = None) -> BodyScan:
        return BodyScan(self, window_bytes, content_encoding)


def _in_header(fields: bytes, finding: Finding, cut: int) -> Finding:
    at = (finding.offset or 0) - cut
    line_start = fields.rfind(b"\n", 0, at) + 1
    colon = fields.find(b":", line_start)
    name = fields[line_start:colon].strip().decode("latin-1").lower() if 0 <= colon < at else "?"
    value_start = colon + 1 if 0 <= colon < at else line_start
    while value_start < len(fields) and fields[value_start] in b" \t":
        value_start += 1
    return Finding(finding.rule, finding.tier, HEADER, name, max(at - value_start, 0), finding.credential)


class BodyScan:
    """One request body scanned as it streams, up to `window_bytes` of decoded content."""

    __slots__ = ("_decode", "_reported", "_scanner", "_tail", "done_bytes", "findings", "truncated", "window_bytes")

    def __init__(self, scanner: Scanner, window_bytes: int, content_encoding: str | None) -> None:
        self._scanner = scanner
        self.window_bytes = window_bytes
        self._tail = b""
        self.done_bytes = 0  # decoded body bytes scanned so far
        self.findings: list[Finding] = []
        self.truncated = False  # the body went past the window: the rest is not scanned
        self._reported: set[tuple[str, int]] = set()
        encoding = (content_encoding or "").strip().lower()
        self._decode: StreamingDecode | None = None
        if encoding not in ("", "identity"):
            try:
                self._decode = StreamingDecode(encoding, max_decoded_bytes=window_bytes)
            except GatewayError:
                self._undecodable()

    def _undecodable(self) -> None:
        # A body the scanner cannot read is treated as a tier 2 finding: under `deny` it does not
        # leave (pipelock refuses compressed bodies it cannot read for the same reason).
        self.findings.append(Finding("scan.undecodable_body", 2, BODY, offset=self.done_bytes))
        self.truncated = True

    def feed(self, chunk: bytes) -> list[Finding]:
        """Scan the next wire bytes; returns the findings they added."""
        if self.truncated or not chunk:
            return []
        data = chunk
        if self._decode is not None:
            try:
                data = self._decode.feed(chunk)
            except GatewayError:
                self._undecodable()
                return self.findings[-1:]
            if self._decode.capped:
                self.truncated = True
        room = self.window_bytes - self.done_bytes
        if len(data) >= room:
            data = data[:room]
            self.truncated = True
        if not data:
            return []
        base = self.done_bytes - len(self._tail)
        joined = self._tail + data
        found = [
            finding
            for finding in self._scanner.scan_piece(joined, BODY, None, base, len(self._tail))
            if (finding.rule, finding.offset or 0) not in self._reported
        ][: MAX_FINDINGS - len(self.findings)]
        for finding in found:
            self._reported.add((finding.rule, finding.offset or 0))
        self.findings.extend(found)
        self.done_bytes += len(data)
        self._tail = joined[-self._scanner.overlap :]
        return found
