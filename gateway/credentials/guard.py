"""The outbound guard the listeners call: scan what a request carries, judge it, audit and count it.

One `OutboundGuard` per daemon, holding the `SecretStore` and the audit log. Each surface asks it
at the point where it already reads the request, before anything is sent: the proxy's plain
HTTP requests (URL, header fields, then the body through a `BodyGuard` that holds the window),
the `web_fetch` URL, the `web_search` query, a DNS name on the policy-aware listener. A
refusal is a `GatewayError` the surface answers as it answers any other; every finding, refused
or reported, leaves one `security` audit line naming its rules and places, never the text.

Costs nothing when the policy holds no credential and the principal has no `scan:` section.
Never opens a socket, never writes to a client.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway.credentials.inject import Scrubber, inject_credentials
from gateway.credentials.screen import RequestFacts, Screening, bound_to, judge, scan_settings_for
from gateway.credentials.store import HeldSecrets, SecretStore
from gateway.errors import GatewayError
from gateway.observe import metrics
from gateway.observe.audit import AuditLog
from gateway.policy.model import Policy, Principal, ScanSettings
from gateway.scan.scanner import QUERY, URL, BodyScan, Finding, Scanner


class OutboundGuard:
    """Scan, judge, audit: the one object every surface asks about an outbound request."""

    def __init__(self, store: SecretStore, audit: AuditLog) -> None:
        self.store = store
        self.audit = audit

    @property
    def held(self) -> HeldSecrets:
        return self.store.current

    def settings_for(self, policy: Policy, principal: Principal) -> ScanSettings | None:
        """The principal's scan settings, or None when there is nothing to look for."""
        scan = policy.scan_for(principal)
        if scan is None and not self.store.current.by_name:
            return None
        return scan or scan_settings_for(policy, principal)

    def record(self, facts: RequestFacts, screening: Screening, *, generation: int | None = None) -> None:
        """The `security` line and the counters of a screening with findings."""
        for action, findings in (("deny", screening.denied), ("report", screening.reported)):
            for finding in findings:
                metrics.SCAN_FINDINGS.labels(str(finding.tier), action, finding.where).inc()
            if findings:
                self._security_line(
                    facts,
                    # A path that carried a finding is not written: the line never holds the text.
                    path=None if any(f.where == URL for f in findings) else facts.path,
                    action=action,
                    code=str(screening.refusal.code) if action == "deny" and screening.refusal else None,
                    generation=generation,
                    findings=[finding.audit() for finding in findings],
                )

    def _security_line(self, facts: RequestFacts, *, path: str | None, **fields: Any) -> None:
        """One `security` audit line about this request: who sent it where, and what was done."""
        self.audit.write(
            "security",
            kind=facts.kind,
            principal=facts.principal,
            host=facts.host,
            port=facts.port,
            method=facts.method,
            path=path,
            **fields,
        )

    def _judge(
        self, facts: RequestFacts, findings: Iterable[Finding], scan: ScanSettings, generation: int | None
    ) -> GatewayError | None:
        screening = judge(findings, self.store.current, facts, scan)
        if not screening.clean:
            self.record(facts, screening, generation=generation)
        return screening.refusal

    def scanner(self, scan: ScanSettings) -> Scanner:
        return self.store.current.scanner_for(scan)

    def screen_request(
        self,
        facts: RequestFacts,
        policy: Policy,
        principal: Principal,
        *,
        url: str | bytes | None = None,
        fields: bytes | None = None,
        generation: int | None = None,
    ) -> GatewayError | None:
        """A request's URL and its header field lines (CRLF-separated `name: value`)."""
        scan = self.settings_for(policy, principal)
        if scan is None:
            return None
        scanner = self.scanner(scan)
        raw_url = url.encode("utf-8", "surrogateescape") if isinstance(url, str) else (url or b"")
        findings = scanner.scan_head(raw_url, fields) if fields else scanner.scan_text(raw_url, URL)
        if not findings:
            return None
        return self._judge(facts, findings, scan, generation)

    def guard_head(
        self,
        facts: RequestFacts,
        policy: Policy,
        principal: Principal,
        *,
        url: str | bytes,
        fields: bytes,
        generation: int | None = None,
    ) -> tuple[bytes, Scrubber | None]:
        """A request head before anything of it is sent: its URL and field lines screened, then,
        inside TLS (`facts.scheme` https), bound placeholders swapped for their real values and a
        scrubber made for the response. Returns the field block to send and that scrubber (or
        None); raises the refusal's GatewayError. The proxy's requests and an inspected
        connection's upgrade heads both come here: one screening, one injection."""
        refusal = self.screen_request(facts, policy, principal, url=url, fields=fields, generation=generation)
        if refusal is not None:
            raise refusal
        if facts.scheme != "https" or not self.held.by_name:
            return fields, None
        fields = self.inject(facts, fields, generation)
        return fields, self.scrubber(facts, scan_settings_for(policy, principal).body_window_bytes)

    def screen_query(
        self, facts: RequestFacts, policy: Policy, principal: Principal, query: str, generation: int | None = None
    ) -> GatewayError | None:
        """A `web_search` query."""
        scan = self.settings_for(policy, principal)
        if scan is None:
            return None
        findings = self.scanner(scan).scan_text(query, QUERY)
        return self._judge(facts, findings, scan, generation) if findings else None

    def screen_dns_name(self, facts: RequestFacts, policy: Policy, principal: Principal) -> GatewayError | None:
        """A name asked of the policy-aware DNS listener: a placeholder in it is misuse."""
        if not self.store.current.by_name or facts.host is None:
            return None
        scan = scan_settings_for(policy, principal)
        findings = self.scanner(scan).scan_dns_name(facts.host)
        return self._judge(facts, findings, scan, None) if findings else None

    def body(
        self, facts: RequestFacts, policy: Policy, principal: Principal, content_encoding: str | None
    ) -> BodyGuard | None:
        """A streaming check of a request body, or None when nothing is looked for."""
        scan = self.settings_for(policy, principal)
        if scan is None or scan.body_window_bytes == 0:
            return None
        scanner = self.scanner(scan)
        return BodyGuard(self, facts, scan, scanner.body(scan.body_window_bytes, content_encoding))

    # injection and scrubbing, for inspected requests to bound hosts -----------------------------
    def inject(self, facts: RequestFacts, fields: bytes, generation: int | None = None) -> bytes:
        """The upstream field block with bound placeholders swapped for real values; one
        `security` line per injection naming the credential and the header, never the value.
        Raises GatewayError (`require: true` unmet, a value that cannot be read)."""
        fields, injected = inject_credentials(self.store.current, facts, fields)
        for item in injected:
            metrics.CREDENTIAL_INJECTIONS.labels(item.kind).inc()
            self._security_line(
                facts,
                path=facts.path,
                action="inject",
                credential=item.credential,
                injected_into=item.header,
                generation=generation,
            )
        return fields

    def scrubber(self, facts: RequestFacts, window_bytes: int) -> Scrubber | None:
        """A scrubber for the response of a request to a bound host, or None."""
        bound = [c for c in bound_to(self.store.current, facts) if c.value]
        if not bound:
            return None
        return Scrubber(bound, window_bytes, lambda done: self.scrubbed(facts, done.replaced))

    def scrubbed(self, facts: RequestFacts, count: int) -> None:
        """The `security` line and count of a response whose values were replaced."""
        metrics.CREDENTIAL_SCRUBS.labels("response").inc(count)
        self._security_line(
            facts,
            path=facts.path,
            action="scrub",
            scrubbed=count,
        )


class BodyGuard:
    """One request body under scan: `feed` as it arrives, `verdict` once the window is read."""

    __slots__ = ("_facts", "_guard", "_scan", "body", "ended")

    def __init__(self, guard: OutboundGuard, facts: RequestFacts, scan: ScanSettings, body: BodyScan) -> None:
        self._guard = guard
        self._facts = facts
        self._scan = scan
        self.body = body
        self.ended = False  # the request body ended within the window

    @property
    def settled(self) -> bool:
        """The window is read or the body ended: the verdict can be given."""
        return self.ended or self.body.truncated

    def feed(self, chunk: bytes) -> None:
        self.body.feed(chunk)

    def verdict(self, generation: int | None = None) -> GatewayError | None:
        if self.body.truncated:
            metrics.SCAN_SKIPPED_BYTES.labels(self._facts.kind).inc()
        if not self.body.findings:
            return None
        return self._guard._judge(self._facts, self.body.findings, self._scan, generation)


def content_encoding(fields: bytes) -> str | None:
    """The Content-Encoding of a block of header field lines (its last such line), or None."""
    lowered = fields.lower()
    at = lowered.rfind(b"\ncontent-encoding:")
    if at < 0:
        return None
    end = lowered.find(b"\r", at + 1)
    return lowered[at + 18 : end if end >= 0 else None].strip().decode("latin-1")
