"""Learn mode for inspected hosts: the methods and path prefixes requests used, as `inspect:` rules.

Pure: takes what was seen (host, method, path) and the base's `inspect:` entries as plain data,
and returns entries (the shared `defaults.inspect` entries are the base's and stay as written;
a host they cover gets an entry of the principal's own, which is tried first). Paths become the
smallest globs that cover them: one path alone stays exact, several paths under one first
segment share their longest common prefix followed by `/**`.
A base entry that saw no request is kept as it was: dropping it could leave its host reachable
uninspected under a wider `allow_domains` glob. Never reads a file or the network.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gateway.policy.decide import glob_matches

# A request path segment that is not a literal in a path glob (`**` means any segments, dot
# segments are refused by the loader): the prefix stops before it.
_NOT_LITERAL = ("**", ".", "..")


def _segments(path: str) -> list[str]:
    segments = path.split("?", 1)[0].lstrip("/").split("/")
    for index, segment in enumerate(segments):
        if segment in _NOT_LITERAL or "**" in segment:
            return [*segments[:index], "**"]
    return segments


def path_globs(paths: Iterable[str]) -> list[str]:
    """The smallest globs covering `paths`: exact alone, `/common/prefix/**` for several."""
    by_first: dict[str, set[tuple[str, ...]]] = {}
    for path in paths:
        if not path.startswith("/"):
            continue
        segments = tuple(_segments(path))
        by_first.setdefault(segments[0], set()).add(segments)
    globs: list[str] = []
    for group in by_first.values():
        if len(group) == 1:
            globs.append("/" + "/".join(next(iter(group))))
            continue
        common: list[str] = []
        for column in zip(*group, strict=False):
            if len(set(column)) != 1 or column[0] == "**":
                break
            common.append(column[0])
        globs.append("/" + "/".join([*common, "**"]))
    return sorted(set(globs))


def allow_rules(methods_paths: Mapping[str, Iterable[str]]) -> list[dict[str, Any]]:
    """One allow rule per set of methods that used the same path globs."""
    by_globs: dict[tuple[str, ...], list[str]] = {}
    for method, paths in methods_paths.items():
        by_globs.setdefault(tuple(path_globs(paths)), []).append(method)
    return [
        {"methods": sorted(methods), "paths": list(globs)}
        for globs, methods in sorted(by_globs.items(), key=lambda item: sorted(item[1]))
    ]


def base_entry_for(host: str, entries: Sequence[Mapping[str, Any]]) -> int | None:
    """The index of the first base entry whose host glob names `host` (first match wins)."""
    for index, entry in enumerate(entries):
        glob = entry.get("host")
        if isinstance(glob, str) and glob_matches(glob.lower(), host):
            return index
    return None


def inspect_entries(
    seen: Mapping[str, Mapping[str, Iterable[str]]],
    ports: Mapping[str, Iterable[int]],
    own: Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """The principal's `inspect:` list: its base entries, with learned allow rules where requests
    were seen, then one entry per other inspected host (its ports written out, TLS or not).
    `seen` is host -> method -> paths; `ports` host -> ports used."""
    learned: dict[int, dict[str, set[str]]] = {}
    extra: dict[str, dict[str, set[str]]] = {}
    for host, methods in seen.items():
        index = base_entry_for(host, own)
        target = learned.setdefault(index, {}) if index is not None else extra.setdefault(host, {})
        for method, paths in methods.items():
            target.setdefault(method, set()).update(paths)
    out: list[dict[str, Any]] = []
    for index, entry in enumerate(own):
        copied = dict(entry)
        if index in learned:
            copied.pop("access", None)
            copied.pop("mode", None)
            copied["allow"] = allow_rules(learned[index])
        out.append(copied)
    for host, methods in sorted(extra.items()):
        entry_out: dict[str, Any] = {"host": host, "allow": allow_rules(methods)}
        if ports.get(host):
            entry_out["ports"] = sorted(set(ports[host]))
        out.append(entry_out)
    return out
