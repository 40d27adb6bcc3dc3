"""Which uid owns the other end of a loopback TCP connection, from the kernel's socket tables.

In an enforced sidecar the agent and the gateway share a network namespace, and the uid is the
agent's identity (docs/guides/enforced-sidecar.md#identity-the-uid-is-the-principal). TCP has no
SO_PEERCRED, but the kernel lists every socket of the namespace with its owner's uid in
/proc/net/tcp and /proc/net/tcp6: the client socket of a loopback connection is the row whose
local address is our peer and whose remote address is our own socket. Only loopback peers are
looked up (a remote peer's socket is on another machine); the lookup reads one file, so callers
ask only when the policy binds uids at all.

Never decides anything (policy/decide.py binds the uid to a principal) and never writes.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

PROC_TCP = Path("/proc/net/tcp")
PROC_TCP6 = Path("/proc/net/tcp6")
UID_FIELD = 7  # sl local rem st tx:rx tr:when retrnsmt uid ...


def _proc_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
    """The address as the kernel prints it: each 32-bit word in host (little-endian) order, hex."""
    packed = address.packed
    words = "".join(f"{int.from_bytes(packed[i : i + 4], 'little'):08X}" for i in range(0, len(packed), 4))
    return f"{words}:{port:04X}"


def _loopback(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # a v4 client of a dual-stack listener: its socket is AF_INET
    return address if address.is_loopback else None


def loopback_peer_uid(peer: object, local: object) -> int | None:
    """The uid owning the client end of a connection accepted on `local` from `peer` (the
    `peername` and `sockname` of the accepted socket), or None when the peer is not on loopback
    or its socket is gone."""
    if not (isinstance(peer, tuple) and isinstance(local, tuple) and len(peer) >= 2 and len(local) >= 2):
        return None
    peer_address, local_address = _loopback(str(peer[0])), _loopback(str(local[0]))
    if peer_address is None or local_address is None or peer_address.version != local_address.version:
        return None
    needle = f"{_proc_address(peer_address, int(peer[1]))} {_proc_address(local_address, int(local[1]))} "
    try:
        table = (PROC_TCP if peer_address.version == 4 else PROC_TCP6).read_text()
    except OSError:
        return None
    at = table.find(needle)
    if at < 0:
        return None
    row = table[table.rfind("\n", 0, at) + 1 : table.find("\n", at)].split()
    try:
        return int(row[UID_FIELD])
    except (IndexError, ValueError):
        return None
