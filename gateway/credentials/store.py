"""The real credential values the gateway holds, read from its environment or from files.

`SecretStore` reads each credential's source when the policy is loaded and re-reads a file
source when its (mtime, size, inode) changes, so a rotated Secret (a Kubernetes mount swaps a
`..data` symlink, which the path follows) takes effect without a restart: `poll()` is called by
the daemon's watcher. Each read produces an immutable `HeldSecrets` snapshot: the credentials,
their placeholders and the tier-1 automaton over both, swapped whole.

This is the only module that touches a real value's bytes on their way in. A value never
reaches a log line, an exception message or a repr: errors name the credential and its
source, never what was read.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gateway.credentials.placeholders import MIN_KEY_BYTES, placeholder_for
from gateway.errors import ErrorCode, GatewayError
from gateway.memo import BoundedMemo
from gateway.policy.model import CredentialRule, CredentialSettings, ScanSettings, SecretSource
from gateway.scan.exact import MIN_VALUE_CHARS, ExactNeedles
from gateway.scan.scanner import Scanner

log = logging.getLogger("egress_gateway.credentials")

# A secret file larger than this is a mistake (a whole bundle mounted at the path).
MAX_SECRET_FILE_BYTES = 64 * 1024
FileStamp = tuple[float, int, int]
# Scanners kept per snapshot, one per combination of tiers switched on.
_MAX_SCANNERS = 8


@dataclass(frozen=True, slots=True)
class HeldCredential:
    rule: CredentialRule
    placeholder: str
    value: bytes | None = field(repr=False)  # None: the source could not be read just now

    @property
    def name(self) -> str:
        return self.rule.name


class HeldSecrets:
    """One snapshot: credentials by name, by placeholder, and the tier-1 needles."""

    __slots__ = ("_scanners", "by_name", "by_placeholder", "needles", "version")

    def __init__(self, credentials: list[HeldCredential], version: int) -> None:
        self.by_name = {c.name: c for c in credentials}
        self.by_placeholder = {c.placeholder: c for c in credentials}
        self.version = version
        self.needles = ExactNeedles(
            [(c.name, c.value) for c in credentials if c.value is not None],
            [(c.name, c.placeholder) for c in credentials],
        )
        self._scanners: BoundedMemo[tuple[bool, bool, bool], Scanner] = BoundedMemo(_MAX_SCANNERS)

    def __repr__(self) -> str:
        return f"HeldSecrets(credentials={sorted(self.by_name)!r}, version={self.version})"

    def scanner_for(self, scan: ScanSettings) -> Scanner:
        key = (scan.tier1 != "off", scan.tier2 != "off", scan.tier3 != "off")
        scanner = self._scanners.get(key)
        if scanner is None:
            # Placeholders are always looked for: one outside its binding is refused whatever
            # tier 1's action (`credential_misuse`); `tier1: off` only stops the real values' check.
            needles = self.needles
            scanner = Scanner(needles, tier1=True, tier2=key[1], tier3=key[2])
            self._scanners.put(key, scanner)
        return scanner


EMPTY = HeldSecrets([], 0)


def _clean(raw: bytes) -> bytes:
    """The value as it goes into a header: surrounding whitespace (a file's final newline) off."""
    return raw.strip()


def _usable(value: bytes) -> bool:
    # Header-safe: visible ASCII and inner spaces only, so an injected field cannot split a head.
    return bool(value) and all(0x20 <= byte < 0x7F for byte in value)


class SecretStore:
    """Reads and re-reads credential sources; `current` is the latest snapshot."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ
        self._settings = CredentialSettings()
        self._stamps: dict[str, FileStamp | None] = {}
        self._key: bytes | None = None
        self.current = EMPTY

    def _read(self, source: SecretSource) -> bytes:
        """The source's bytes, or GatewayError naming the source (never the content)."""
        if source.kind == "env":
            if source.name not in self._environ:
                raise GatewayError(ErrorCode.UNAVAILABLE, f"environment variable {source.name} is not set")
            return _clean(self._environ[source.name].encode("utf-8", "surrogateescape"))
        path = Path(source.name)
        try:
            with path.open("rb") as handle:
                raw = handle.read(MAX_SECRET_FILE_BYTES + 1)
        except OSError as exc:
            raise GatewayError(ErrorCode.UNAVAILABLE, f"cannot read {source.name} ({exc.__class__.__name__})") from None
        if len(raw) > MAX_SECRET_FILE_BYTES:
            raise GatewayError(ErrorCode.UNAVAILABLE, f"{source.name} is larger than {MAX_SECRET_FILE_BYTES} bytes")
        return _clean(raw)

    def _stamp(self, source: SecretSource) -> FileStamp | None:
        if source.kind != "file":
            return None
        try:
            st = os.stat(source.name)  # follows the ..data symlink a Secret mount swaps
        except OSError:
            return None
        return (st.st_mtime, st.st_size, st.st_ino)

    def load(self, settings: CredentialSettings) -> HeldSecrets:
        """Read every source of `settings` (a policy load or reload). The placeholder key must
        be readable and long enough, else GatewayError(invalid_input) and nothing changes."""
        key = None
        if settings.entries:
            assert settings.placeholder_key is not None  # the policy loader requires it
            try:
                key = self._read(settings.placeholder_key)
            except GatewayError as exc:
                raise GatewayError(ErrorCode.INVALID_INPUT, f"credentials.placeholder_key: {exc.message}") from None
            if len(key) < MIN_KEY_BYTES:
                raise GatewayError(
                    ErrorCode.INVALID_INPUT,
                    f"credentials.placeholder_key: {settings.placeholder_key.describe()} holds fewer than "
                    f"{MIN_KEY_BYTES} bytes (`egress-gateway credentials key` prints a new key)",
                )
        self._settings, self._key = settings, key
        self._stamps = {}
        return self._rebuild()

    def _rebuild(self) -> HeldSecrets:
        held: list[HeldCredential] = []
        for rule in self._settings.entries:
            assert self._key is not None
            self._stamps[rule.name] = self._stamp(rule.source)
            value: bytes | None
            try:
                value = self._read(rule.source)
            except GatewayError as exc:
                log.error("credential %s: %s; requests that need it are refused", rule.name, exc.message)
                value = None
            if value is not None and not _usable(value):
                log.error("credential %s: %s holds characters a header cannot carry", rule.name, rule.source.describe())
                value = None
            if value is not None and len(value) < MIN_VALUE_CHARS:
                log.warning("credential %s: value shorter than %d bytes is not scanned for", rule.name, MIN_VALUE_CHARS)
            held.append(HeldCredential(rule, placeholder_for(self._key, rule), value))
        self.current = HeldSecrets(held, self.current.version + 1)
        return self.current

    def poll(self) -> bool:
        """Re-read the sources if a file source changed; True when a new snapshot was made."""
        changed = [
            rule.name for rule in self._settings.entries if self._stamp(rule.source) != self._stamps.get(rule.name)
        ]
        if not changed:
            return False
        log.info("credential source changed (%s): re-read", ", ".join(changed))
        self._rebuild()
        return True

    def placeholders(self) -> list[tuple[CredentialRule, str]]:
        return [(c.rule, c.placeholder) for c in self.current.by_name.values()]
