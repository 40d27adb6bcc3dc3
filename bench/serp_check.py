"""Run every HTML search parser over a folder of saved result pages and report how they read.

Usage: python bench/serp_check.py DIR

Pages are found under DIR/<engine>/*.html (engine: duckduckgo, bing, brave). For each page the
parser's conclusion is printed; a page counts as misread when the parser finds no rows on a page
whose `<name>.expected.json` lists results, finds rows on a page whose expected file is `null`
(a challenge; pages without one are judged by a `captcha`/`challenge` name) or reads the
page as an unrecognised shape, or when fewer than 80 % of the expected
result URLs are found. Per engine: pages parsed, results per page, pages misread. Offline: it
reads files only. Exit status 1 when any page is misread.
"""

from __future__ import annotations

import sys
from pathlib import Path
from statistics import mean

import orjson

from gateway.tools.search import bing, brave, duckduckgo
from gateway.tools.search.engine import EngineSpec
from gateway.tools.search.links import dedupe_key
from gateway.tools.search.normalise import normalise_rows
from gateway.tools.search.transport import make_reply

HTML_ENGINES: dict[str, EngineSpec] = {
    "duckduckgo": duckduckgo.ENGINE,
    "bing": bing.ENGINE,
    "brave": brave.ENGINE,
}
MIN_RECALL = 0.8
MAX_ROWS = 100


def _expected(page: Path) -> tuple[bool, list[str] | None]:
    """(has expectation, expected URLs or None for a challenge page)."""
    path = page.with_name(page.name.removesuffix(".html") + ".expected.json")
    if not path.exists():
        return False, None
    data = orjson.loads(path.read_bytes())
    if data is None:
        return True, None
    return True, [dedupe_key(r["url"]) for r in data.get("results", [])]


def check_page(spec: EngineSpec, page: Path) -> tuple[str, int, str | None]:
    """(outcome kind, usable rows, why misread or None)."""
    reply = make_reply(200, {"content-type": "text/html"}, page.read_bytes(), spec.default_url)
    outcome = spec.parse(reply)
    hits = normalise_rows(outcome.rows, max_results=MAX_ROWS, site=None).hits
    has_expectation, expected = _expected(page)
    if outcome.kind == "unrecognised":
        return outcome.kind, 0, f"unrecognised ({outcome.detail})"
    if not has_expectation:
        # Pages without an annotation file say what they are in their name.
        if "captcha" in page.name or "challenge" in page.name:
            return outcome.kind, len(hits), None if outcome.kind == "challenge" else "challenge missed"
        if outcome.kind == "results" and not hits:
            return outcome.kind, 0, "rows found but none usable"
        return outcome.kind, len(hits), None
    if expected is None:
        return outcome.kind, len(hits), None if outcome.kind == "challenge" else "challenge missed"
    if not expected:
        return outcome.kind, len(hits), None if not hits else "rows on a no-results page"
    found = {dedupe_key(h.url) for h in hits}
    recall = sum(1 for url in expected if url in found) / len(expected)
    if recall < MIN_RECALL:
        return outcome.kind, len(hits), f"recall {recall:.0%} of {len(expected)} expected"
    return outcome.kind, len(hits), None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    root = Path(argv[1])
    any_misread = False
    print(f"{'engine':<11} {'pages':>5} {'results/page':>13} {'misread':>7}")
    report: list[str] = []
    for name, spec in HTML_ENGINES.items():
        pages = sorted((root / name).glob("*.html"))
        counts: list[int] = []
        misread = 0
        for page in pages:
            kind, rows, why = check_page(spec, page)
            counts.append(rows)
            flag = "MISREAD " + why if why else "ok"
            report.append(f"  {name:<11} {page.name:<58} {kind:<12} {rows:>3} rows  {flag}")
            misread += why is not None
        any_misread |= misread > 0
        per_page = f"{mean(counts):.1f}" if counts else "-"
        print(f"{name:<11} {len(pages):>5} {per_page:>13} {misread:>7}")
    print()
    print("\n".join(report))
    return 1 if any_misread else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
