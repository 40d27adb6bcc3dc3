"""Server-side TLS contexts for inspected hosts, one per host, minted on first use and remembered.

Owns the bounded per-host memo (`gateway.memo.BoundedMemo`, held by the object, never a module
global) and the private directory `SSLContext.load_cert_chain` needs, since it loads only from
paths: each leaf (certificate and key in one file) is written 0600 into a 0700 directory, loaded,
and unlinked at once, so a key sits in a file for the length of one call. By default that
directory is made in /dev/shm (memory, never a disk) when it exists. A context offers ALPN
`http/1.1` only and TLS 1.2 or later. A leaf is replaced before it expires. Never opens a socket.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gateway.errors import ErrorCode, GatewayError
from gateway.inspect.authority import CertificateAuthority, mint_leaf, private_directory, write_private
from gateway.inspect.terminator import server_name_guard
from gateway.memo import BoundedMemo
from gateway.observe import metrics

MAX_CACHED_HOSTS = 1024
# A leaf this close to its notAfter is minted again rather than served.
RENEW_BEFORE_S = 3600
ALPN_PROTOCOLS = ("http/1.1",)


@dataclass(frozen=True, slots=True)
class ServerContext:
    context: ssl.SSLContext
    not_after: datetime.datetime


def _memory_directory() -> Path:
    """A fresh 0700 directory, in /dev/shm when there is one (tmpfs: the key never reaches a
    disk, and creating and unlinking a file there is cheaper)."""
    shm = Path("/dev/shm")  # noqa: S108 - a private directory is made inside it
    parent = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="egress-leaves-", dir=parent))


class LeafContexts:
    """Per-host server contexts signed by the interception CA."""

    def __init__(
        self, authority: CertificateAuthority, directory: Path | None = None, max_hosts: int = MAX_CACHED_HOSTS
    ) -> None:
        self.authority = authority
        self._own_directory = directory is None
        self.directory = private_directory(directory if directory is not None else _memory_directory())
        self._memo: BoundedMemo[str, ServerContext] = BoundedMemo(max_hosts)

    def __len__(self) -> int:
        return len(self._memo)

    def context_for(self, host: str) -> ssl.SSLContext:
        """The server context for `host`, minting its leaf when none is cached or it is ageing."""
        cached = self._memo.get(host)
        now = datetime.datetime.now(datetime.UTC)
        if cached is not None and (cached.not_after - now).total_seconds() > RENEW_BEFORE_S:
            return cached.context
        leaf = mint_leaf(self.authority, host)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(list(ALPN_PROTOCOLS))
        # No TLS 1.3 session tickets: each would cost an encryption and a write per connection,
        # and agents' clients rarely resume.
        context.num_tickets = 0
        context.sni_callback = server_name_guard(host)
        # Random names: two contexts built at once never share a file, and a host name never
        # becomes a path.
        path = self.directory / (os.urandom(12).hex() + ".pem")
        try:
            write_private(path, leaf.cert_pem + leaf.key_pem)
            context.load_cert_chain(path)
        except (OSError, ssl.SSLError) as exc:
            raise GatewayError(ErrorCode.UNAVAILABLE, f"cannot load the leaf for {host}: {exc}") from None
        finally:
            path.unlink(missing_ok=True)
        self._memo.put(host, ServerContext(context, leaf.not_after))
        metrics.INSPECT_LEAF_MINTS.inc()
        metrics.INSPECT_LEAF_CACHE.set(len(self._memo))
        return context

    def close(self) -> None:
        """Remove the private directory when this object made it (it is empty between calls)."""
        if self._own_directory:
            with contextlib.suppress(OSError):
                self.directory.rmdir()
