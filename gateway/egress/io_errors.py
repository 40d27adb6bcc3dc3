"""The one error boundary at the I/O edge: OS, TLS, aiohttp and timeout exceptions → GatewayError.

In the style of httpcore's `map_exceptions`: the dialer (`connect.py`) and the guarded client
(`client.py`) do their socket work inside `mapped_io_errors(target)` or hand a caught exception
to `io_error`, and nothing else in the egress core catches a transport exception. Exceptions are
told apart by type (and by the cause aiohttp chains to them), never by their message text but in
`_header_flood`, where aiohttp gives no type. A
message names the host and the kind of failure, never bytes the origin sent.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong

from gateway.egress.target import PinnedTarget
from gateway.errors import ErrorCode, GatewayError


def describe_connect_error(exc: BaseException, target: PinnedTarget) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"TLS certificate for {target.name} rejected: {exc.verify_message or exc.reason}"
            " (a private CA is trusted by adding its PEM to EGRESS_CA_BUNDLE)"
        )
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake with {target.name} failed: {exc.reason or exc.__class__.__name__}"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection to {target.name}:{target.port} refused"
    if isinstance(exc, TimeoutError):
        return f"connection to {target.name}:{target.port} timed out"
    return f"connection to {target.name}:{target.port} failed: {exc.__class__.__name__}"


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether `kind` is in the cause chain (aiohttp chains the parser's exception two deep)."""
    cause = exc.__cause__
    for _ in range(4):
        if cause is None:
            return False
        if isinstance(cause, kind):
            return True
        cause = cause.__cause__
    return False


def _header_flood(exc: BaseException) -> bool:
    """Whether aiohttp's parser stopped at its header-count ceiling. The one place a message is
    read: aiohttp (3.14) raises the plain BadHttpMessage it uses for every malformed head, with
    "Too many headers received" (or trailers) as the only difference. Without this a head over
    the ceiling (4x max_headers) was connect_failure while one just over the cap was too_large;
    tests/integration/test_egress_client.py fails if aiohttp changes the wording."""
    cause = exc.__cause__
    for _ in range(4):
        if cause is None:
            return False
        if type(cause) is BadHttpMessage:
            return str(cause.message).startswith(("Too many headers", "Too many trailers"))
        cause = cause.__cause__
    return False


def _response_head_error(exc: aiohttp.ClientResponseError, target: PinnedTarget) -> GatewayError:
    if _caused_by(exc, LineTooLong):
        return GatewayError(ErrorCode.TOO_LARGE, f"{target.name} sent a response header line over the cap")
    if _header_flood(exc):
        return GatewayError(ErrorCode.TOO_LARGE, f"{target.name} sent a flood of response header fields")
    return GatewayError(ErrorCode.CONNECT_FAILURE, f"{target.name} sent a malformed response head")


def io_error(exc: BaseException, target: PinnedTarget) -> GatewayError:
    """The GatewayError for a transport exception met while talking to `target`."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, aiohttp.ClientResponseError):
        return _response_head_error(exc, target)
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        # The same certificate fails the same way on a retry: not retryable.
        return GatewayError(
            ErrorCode.CONNECT_FAILURE, describe_connect_error(exc.certificate_error, target), permanent=True
        )
    if isinstance(exc, aiohttp.ClientConnectorError):
        return GatewayError(ErrorCode.CONNECT_FAILURE, describe_connect_error(exc.os_error, target))
    if isinstance(exc, aiohttp.ClientPayloadError):
        return GatewayError(ErrorCode.CONNECT_FAILURE, f"{target.name} sent a broken body: {exc.__class__.__name__}")
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError):
        return GatewayError(
            ErrorCode.CONNECT_FAILURE, f"{target.name} closed the connection ({exc.__class__.__name__})"
        )
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return GatewayError(ErrorCode.TIMEOUT, f"{target.name}:{target.port} did not answer in time")
    if isinstance(exc, aiohttp.ClientError):
        return GatewayError(ErrorCode.CONNECT_FAILURE, f"request to {target.name} failed: {exc.__class__.__name__}")
    if isinstance(exc, OSError):  # ssl.SSLError and a kernel connect timeout (ETIMEDOUT) included
        permanent = isinstance(exc, ssl.SSLCertVerificationError)
        return GatewayError(ErrorCode.CONNECT_FAILURE, describe_connect_error(exc, target), permanent=permanent)
    raise TypeError(f"not a transport exception: {exc.__class__.__name__}") from exc


@contextmanager
def mapped_io_errors(target: PinnedTarget) -> Iterator[None]:
    """Turn every transport exception raised inside into the GatewayError `io_error` names."""
    try:
        yield
    except (OSError, aiohttp.ClientError) as exc:  # TimeoutError and ssl.SSLError are OSErrors
        raise io_error(exc, target) from None
