"""Which engines exist and which are configured: names, order, keys and endpoint overrides.

Owns turning the search settings (DESIGN.md section 3: EGRESS_SEARCH_ENGINES,
EGRESS_SEARCH_<ENGINE>_KEY, EGRESS_SEARCH_<ENGINE>_URL, EGRESS_SEARCH_URL/KEY,
EGRESS_SEARCH_SEARXNG_URL,
EGRESS_SEARCH_MEDIAWIKI_URL) into the ordered list the aggregator walks. Reads no environment
itself (the Settings object does) and never opens a socket. Keys are kept out of every repr.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from gateway.errors import ErrorCode, GatewayError
from gateway.tools.search import (
    bing,
    brave,
    brave_api,
    duckduckgo,
    exa,
    mediawiki,
    searxng,
    tavily,
    template,
)
from gateway.tools.search.engine import EngineSpec, Tier

ENGINES: Mapping[str, EngineSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            tavily.ENGINE,
            exa.ENGINE,
            brave_api.ENGINE,
            duckduckgo.ENGINE,
            bing.ENGINE,
            brave.ENGINE,
            searxng.ENGINE,
            mediawiki.ENGINE,
            template.ENGINE,
        )
    }
)
DEFAULT_ORDER: tuple[str, ...] = ("tavily", "exa", "brave_api", "duckduckgo", "bing", "brave")
# The settings a person can set to enable an engine, named in the none-enabled error.
ENABLING_SETTINGS = (
    "EGRESS_SEARCH_ENGINES",
    "EGRESS_SEARCH_<ENGINE>_KEY",
    "EGRESS_SEARCH_URL",
)


@dataclass(frozen=True, slots=True)
class ConfiguredEngine:
    """An engine with its endpoint and key; the key never shows in a repr or a log line."""

    spec: EngineSpec
    base_url: str
    key: str | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def tier(self) -> Tier:
        return self.spec.tier

    @property
    def enabled(self) -> bool:
        """A keyed engine without a key is listed but skipped without a request."""
        return bool(self.key) or not self.spec.needs_key


def _setting_error(setting: str, reason: str) -> GatewayError:
    return GatewayError(ErrorCode.INVALID_INPUT, f"{setting}: {reason}", extra={"field": setting})


def engines_from_settings(
    order: Sequence[str] | None = None,
    keys: Mapping[str, str] | None = None,
    base_urls: Mapping[str, str] | None = None,
    *,
    template_url: str | None = None,
    template_key: str | None = None,
    searxng_url: str | None = None,
    mediawiki_url: str | None = None,
) -> tuple[ConfiguredEngine, ...]:
    """The ordered engines to walk.

    `order` is EGRESS_SEARCH_ENGINES (default tavily,exa,brave_api,duckduckgo,bing,brave), honoured
    as written. Setting EGRESS_SEARCH_URL, EGRESS_SEARCH_SEARXNG_URL or EGRESS_SEARCH_MEDIAWIKI_URL
    adds that engine at the end when the list does not name it already.
    """
    names = [n.strip().lower() for n in (order if order is not None else DEFAULT_ORDER)]
    names = [n for n in names if n]
    keys = {k.lower(): v for k, v in (keys or {}).items() if v}
    overrides = {k.lower(): v for k, v in (base_urls or {}).items() if v}
    for setting_value, engine_name in (
        (template_url, "template"),
        (searxng_url, "searxng"),
        (mediawiki_url, "mediawiki"),
    ):
        if setting_value and engine_name not in names:
            names.append(engine_name)
    configured: list[ConfiguredEngine] = []
    seen: set[str] = set()
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        spec = ENGINES.get(name)
        if spec is None:
            known = ", ".join(sorted(ENGINES))
            reason = f"unknown engine {name!r} (known: {known})"
            raise _setting_error("EGRESS_SEARCH_ENGINES", reason)
        url = overrides.get(name) or spec.default_url
        key = keys.get(name)
        if name == "template":
            url = template_url or overrides.get(name) or ""
            key = template_key or key
            if not url:
                raise _setting_error("EGRESS_SEARCH_URL", "the template engine needs a URL")
        elif name == "searxng":
            url = searxng_url or overrides.get(name) or ""
            if not url:
                raise _setting_error("EGRESS_SEARCH_SEARXNG_URL", "the searxng engine needs a URL")
        elif name == "mediawiki":
            url = mediawiki_url or url
        configured.append(ConfiguredEngine(spec=spec, base_url=url, key=key or None))
    return tuple(configured)
