"""Placeholders: the stand-in strings agents hold instead of real credentials.

A placeholder is derived, not stored: HMAC-SHA256 of the credential's name under a key the
operator holds (`credentials.placeholder_key`), expanded and mapped onto letters and digits. So
it is the same across restarts and replicas, changes when the key does, does not change when the
real value rotates, and cannot be computed by an agent that has only seen other placeholders.

Opaque form: `egph_` and 32 letters or digits (190 bits). Shape-preserving form, for SDKs that
check a key's format: the configured prefix (`ghp_`, `sk-proj-`), the marker `egph`, then letters
and digits up to the configured length (at least 22 random ones, 131 bits). Either carries the
fixed `egph` marker, so a person reading a log sees what it is, and neither is a valid key.
Pure: never reads the key itself (`store.py` does).
"""

from __future__ import annotations

import hashlib
import hmac
import string

from gateway.policy.credentials import PLACEHOLDER_MARKER
from gateway.policy.model import CredentialRule

OPAQUE_PREFIX = PLACEHOLDER_MARKER + "_"
OPAQUE_RANDOM_CHARS = 32
# The key material an operator must supply (`egress-gateway credentials key` prints one).
MIN_KEY_BYTES = 32
_ALPHABET = string.ascii_letters + string.digits
# Bytes at or above this are skipped so that `byte % 62` is uniform (248 = 4 * 62).
_UNBIASED_BELOW = 248
_INFO = b"egress-gateway placeholder v1\x00"


def _random_chars(key: bytes, name: str, count: int) -> str:
    out: list[str] = []
    block = 0
    while len(out) < count:
        digest = hmac.new(key, _INFO + name.encode() + b"\x00" + block.to_bytes(4, "big"), hashlib.sha256).digest()
        out.extend(_ALPHABET[byte % 62] for byte in digest if byte < _UNBIASED_BELOW)
        block += 1
    return "".join(out[:count])


def placeholder_for(key: bytes, rule: CredentialRule) -> str:
    """The placeholder of `rule` under `key` (deterministic)."""
    if rule.shape is None:
        return OPAQUE_PREFIX + _random_chars(key, rule.name, OPAQUE_RANDOM_CHARS)
    head = rule.shape.prefix + PLACEHOLDER_MARKER
    return head + _random_chars(key, rule.name, rule.shape.length - len(head))
