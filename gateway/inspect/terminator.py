"""The server side of one inspected TLS connection, sans-IO: bytes from the agent in, plaintext
and bytes for the agent out, over `ssl.MemoryBIO` and `SSLObject`.

Why not `loop.start_tls`: when the ClientHello arrives in the same segment as the CONNECT head
(clients coalesce them) the bytes the protocol already read are lost and the handshake hangs
(cpython #142352, uvloop #707); `tests/integration/test_inspect_start_tls_hang.py` reproduces it.
Here the caller feeds whatever it already holds. Owns the handshake's checks: every ClientHello
(the second one after a HelloRetryRequest too) must name the inspected host or none, the agent
must end up on HTTP/1.1 (or no ALPN), and an alert on our certificate is told apart from other
failures (`tls_untrusted`). Never touches a socket, a clock or the policy.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Callable

from gateway.errors import ErrorCode, GatewayError

READ_CHUNK_BYTES = 64 * 1024
# OpenSSL's names for the alerts a client sends when it does not trust the certificate it got.
UNTRUSTED_ALERTS = frozenset(
    {
        "TLSV1_ALERT_UNKNOWN_CA",
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_EXPIRED",
        "SSLV3_ALERT_CERTIFICATE_REVOKED",
        "TLSV1_ALERT_DECRYPT_ERROR",
    }
)
TRUST_HINT = (
    "the agent does not trust the interception CA: point SSL_CERT_FILE, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, "
    "GIT_SSL_CAINFO, PIP_CERT and NPM_CONFIG_CAFILE at the combined bundle and NODE_EXTRA_CA_CERTS at the CA "
    "(egress-gateway ca export)"
)


def check_offered_alpn(host: str, offered: tuple[str, ...] | None) -> None:
    """Refuse, before terminating, a client that offers ALPN but not HTTP/1.1 (gRPC, Connect).

    Interception speaks HTTP/1.1 only in this step: terminating would either fail the client's
    ALPN check or silently hand it a protocol it did not ask for.
    """
    if offered and "http/1.1" not in offered:
        raise GatewayError(
            ErrorCode.INSPECTION_UNSUPPORTED,
            f"{host} is inspected and inspection speaks HTTP/1.1 only; the client offered "
            f"{', '.join(offered[:4])} (h2-only clients such as gRPC cannot reach an inspected host)",
        )


class TlsTerminator:
    """One server-side TLS session over memory buffers, for the inspected `host`."""

    __slots__ = ("_incoming", "_outgoing", "_tls", "closed", "handshake_done", "host")

    def __init__(self, context: ssl.SSLContext, host: str) -> None:
        self.host = host
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self.handshake_done = False
        self.closed = False

    def feed(self, data: bytes) -> None:
        """Bytes from the agent, as they arrived (a coalesced CONNECT tail is fine)."""
        if data:
            self._incoming.write(data)

    def feed_eof(self) -> None:
        self._incoming.write_eof()

    def outgoing(self) -> bytes:
        """What must be sent to the agent now (handshake flights, records, alerts)."""
        return self._outgoing.read()

    def handshake(self) -> bool:
        """Advance the handshake with what was fed; True once it is complete.

        Raises `tls_untrusted` when the agent's alert says it refused our certificate, and
        `invalid_input` (or the server name check's `host_mismatch`) for any other failure.
        """
        if self.handshake_done:
            return True
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            return False
        except ssl.SSLError as exc:
            raise self._handshake_error(exc) from None
        self._check_server_name()
        protocol = self._tls.selected_alpn_protocol()
        if protocol not in (None, "http/1.1"):
            raise GatewayError(ErrorCode.INSPECTION_UNSUPPORTED, f"the client negotiated {protocol}, not HTTP/1.1")
        self.handshake_done = True
        return True

    def _check_server_name(self) -> None:
        # Checked once the handshake is done, from what OpenSSL kept: after a HelloRetryRequest
        # this is the second ClientHello's name (a server callback saw the first).
        name = self._tls.server_hostname
        if name is not None and name.lower().rstrip(".") != self.host:
            raise GatewayError(
                ErrorCode.HOST_MISMATCH, f"the TLS server name {name!r} is not the inspected host {self.host}"
            )

    def _handshake_error(self, exc: ssl.SSLError) -> GatewayError:
        reason = exc.reason or ""
        if reason in UNTRUSTED_ALERTS:
            return GatewayError(ErrorCode.TLS_UNTRUSTED, f"{self.host}: {TRUST_HINT} (alert {reason.lower()})")
        if reason == "CALLBACK_FAILED" or "SERVERNAME" in reason or "UNRECOGNIZED_NAME" in reason:
            return GatewayError(ErrorCode.HOST_MISMATCH, f"the ClientHello names another host than {self.host}")
        return GatewayError(ErrorCode.INVALID_INPUT, f"TLS handshake with the agent failed: {reason or exc}")

    def read(self) -> bytes:
        """All plaintext the fed records carry (b"" when none yet); sets `closed` on close_notify."""
        chunks: list[bytes] = []
        while True:
            try:
                chunk = self._tls.read(READ_CHUNK_BYTES)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.closed = True
                break
            except ssl.SSLError as exc:
                raise GatewayError(
                    ErrorCode.INVALID_INPUT, f"TLS record from the agent refused: {exc.reason}"
                ) from None
            if not chunk:
                self.closed = True
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def write(self, data: bytes) -> bytes:
        """Encrypt `data` for the agent; returns the records to send."""
        view = memoryview(data)
        while view:
            written = self._tls.write(view)
            view = view[written:]
        return self._outgoing.read()

    def close(self) -> bytes:
        """A close_notify for the agent (best effort: the session may already be broken)."""
        with contextlib.suppress(ssl.SSLWantReadError, ssl.SSLError):
            self._tls.unwrap()
        return self._outgoing.read()


def server_name_guard(host: str) -> Callable[[ssl.SSLObject, str | None, ssl.SSLContext], int | None]:
    """An `sni_callback` refusing a ClientHello that names another host (the first one and,
    after a HelloRetryRequest, the second: OpenSSL runs the callback for each)."""

    def guard(tls: ssl.SSLObject, name: str | None, _context: ssl.SSLContext) -> int | None:
        if name is not None and name.lower().rstrip(".") != host:
            return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
        return None

    return guard
