"""Extraction benchmark: web_fetch's extractor against trafilatura and readability-lxml, two corpora.

Corpora, read by path (the network is never touched):
- `--pages DIR`: Mozilla Readability's test pages (DIR/<name>/source.html as served, expected.html
  the main content). Scored as a bag of words with counts against expected.html: precision,
  recall and F1 per page, averaged.
- `--snippets DIR`: real pages with hand-picked snippets (DIR/cases.json, DIR/pages/*.gz). A
  snippet is found when its lowercase word tokens appear in a row in the output's (its first and
  last token may be cut mid-word, as the snippets were cut by character), as in trafilatura's own
  evaluation: precision = found-with / (found-with + found-without), recall =
  found-with / all with, leak = found-without / all without, summed over the pages of a part.
  Every fourth page (in key order) is held out of tuning and reported as its own part.

What is scored for ours is what `/v1/fetch` pages through: the conversion the extraction pool
runs on a decoded HTML body (`html_to_markdown` with the policy's default source cap), with the
`# title` line set aside, as the truths leave the title out. Every extractor gets the same decoded
text (the fetch tool's own decoding of the bytes). Markdown syntax, list numbers and link URLs
are stripped from every output before scoring. Time is the CPU time of the bench process
(`time.process_time`; every extractor here is single-threaded) of the fastest of `--repeat` runs
per page: on a shared machine wall time also counts the waits for a core that other jobs hold.

    .venv/bin/python bench/extract.py --pages ../shared/fixtures/pages \
        --snippets ../shared/fixtures/snippet-pages
"""

from __future__ import annotations

import argparse
import gzip
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from selectolax.lexbor import LexborHTMLParser

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.policy.model import FetchSettings
from gateway.tools.extract.decode import decode_body
from gateway.tools.extract.markdown import html_to_markdown

PAGE_URL = "http://fakehost/test/page.html"
READABILITY_CONTENT_TYPE = "text/html; charset=utf-8"
# Snippet pages are stored as served, their charset named only inside the page.
SNIPPET_CONTENT_TYPE = "text/html"
SLOW_PAGE_MS = 50.0
LOST_RECALL = 0.5
HELD_OUT_EVERY = 4
HELD_OUT_TITLE = "Snippet pages, held-out part"
WORD = re.compile(r"\w+", re.UNICODE)
MD_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
MD_AUTOLINK = re.compile(r"<https?://[^>]*>|https?://\S+")
MD_LIST_NUMBER = re.compile(r"^\s*(?:>\s*)*\d+\.\s", re.M)

# An extractor takes (body bytes, content-type header, decoded text) and returns markdown.
Extractor = Callable[[bytes, str, str], str]


def ours(_body: bytes, _content_type: str, text: str) -> str:
    # The conversion the extraction pool runs for an HTML body, with the policy's default cap.
    markdown = html_to_markdown(text, PAGE_URL, max_chars=FetchSettings().max_source_chars).markdown
    # Drop the "# title" line: metadata, left out of both corpora's truths.
    first, _, rest = markdown.partition("\n")
    return rest if first.startswith("# ") else markdown


def trafilatura_markdown(_body: bytes, _content_type: str, text: str) -> str:
    import trafilatura  # noqa: PLC0415 - optional bench dependency

    return trafilatura.extract(text, url=PAGE_URL, output_format="markdown") or ""


def readability_markdownify(_body: bytes, _content_type: str, text: str) -> str:
    import markdownify  # noqa: PLC0415 - optional bench dependency
    from readability import Document  # noqa: PLC0415 - optional bench dependency

    return str(markdownify.markdownify(Document(text).summary(html_partial=True)))


def html_to_markdown_lib(_body: bytes, _content_type: str, text: str) -> str:
    import html_to_markdown as h2m  # noqa: PLC0415 - optional bench dependency

    return str(h2m.convert(text).content or "")


EXTRACTORS: dict[str, Extractor] = {
    "ours": ours,
    "trafilatura": trafilatura_markdown,
    "readability+markdownify": readability_markdownify,
    "html-to-markdown": html_to_markdown_lib,
}
DEFAULT_EXTRACTORS = "ours,trafilatura,readability+markdownify"


@dataclass(frozen=True, slots=True)
class Page:
    name: str
    body: bytes
    content_type: str
    text: str
    # Readability pages: the expected bag of words. Snippet pages: token tuples of each snippet.
    expected: Counter[str] = field(default_factory=Counter)
    with_snippets: tuple[tuple[str, ...], ...] = ()
    without_snippets: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class PageResult:
    name: str
    ms: float
    precision: float = 0.0
    recall: float = 0.0
    found_with: int = 0
    found_without: int = 0
    all_with: int = 0
    all_without: int = 0
    leaked: tuple[str, ...] = ()
    missed: tuple[str, ...] = ()

    @property
    def f1(self) -> float:
        return f1(self.precision, self.recall)


def f1(precision: float, recall: float) -> float:
    total = precision + recall
    return 0.0 if total == 0 else 2 * precision * recall / total


def tokens(text: str) -> list[str]:
    return [word.lower() for word in WORD.findall(text)]


def markdown_tokens(markdown: str) -> list[str]:
    text = MD_LINK.sub(r"\1", markdown)
    text = MD_AUTOLINK.sub(" ", text)
    text = MD_LIST_NUMBER.sub(" ", text)
    return tokens(text)


def expected_words(html: str) -> Counter[str]:
    tree = LexborHTMLParser(html)
    root = tree.body or tree.root
    return Counter(tokens(root.text(deep=True, separator=" "))) if root is not None else Counter()


def load_readability(pages_dir: Path, only: str | None) -> list[Page]:
    pages = []
    for folder in sorted(p for p in pages_dir.iterdir() if p.is_dir()):
        if only and only != folder.name:
            continue
        source, expected = folder / "source.html", folder / "expected.html"
        if not source.exists() or not expected.exists():
            continue
        raw = source.read_bytes()
        # The corpus is stored as UTF-8 (Readability's harness reads it so); a page saved with
        # its original <meta charset>, such as qq's gb2312, would otherwise decode as mojibake.
        text = decode_body(raw, READABILITY_CONTENT_TYPE).text
        reference = expected_words(expected.read_text(encoding="utf-8", errors="replace"))
        pages.append(Page(folder.name, raw, READABILITY_CONTENT_TYPE, text, expected=reference))
    return pages


def load_snippets(snippets_dir: Path, only: str | None) -> tuple[list[Page], list[Page]]:
    """The snippet pages as (tuning part, held-out part): every fourth page in key order is held out."""
    cases = orjson.loads((snippets_dir / "cases.json").read_bytes())
    tuning: list[Page] = []
    held_out: list[Page] = []
    for index, key in enumerate(sorted(cases)):
        case = cases[key]
        if only and only not in key:
            continue
        raw = gzip.decompress((snippets_dir / "pages" / case["file"]).read_bytes())
        text = decode_body(raw, SNIPPET_CONTENT_TYPE).text
        page = Page(
            key,
            raw,
            SNIPPET_CONTENT_TYPE,
            text,
            with_snippets=tuple(t for t in (tuple(tokens(s)) for s in case.get("with", [])) if t),
            without_snippets=tuple(t for t in (tuple(tokens(s)) for s in case.get("without", [])) if t),
        )
        (held_out if index % HELD_OUT_EVERY == HELD_OUT_EVERY - 1 else tuning).append(page)
    return tuning, held_out


def contains(haystack: list[str], where: dict[str, list[int]], needle: tuple[str, ...]) -> bool:
    """Whether the snippet's tokens appear in a row; its first and last may be cut mid-word.

    The snippets were cut from the page by character ("m Juni 1948" for "Im Juni 1948"), so the
    first token may be the end of a word and the last the start of one; inner tokens are exact.
    """
    width = len(needle)
    if width == 1:
        return needle[0] in where
    if width == 2:
        starts: list[int] = [i for i in range(len(haystack) - 1) if haystack[i + 1].startswith(needle[1])]
    else:
        starts = [position - 1 for position in where.get(needle[1], ()) if position > 0]
    inner = needle[1:-1]
    for start in starts:
        end = start + width - 1
        if end >= len(haystack) or not haystack[start].endswith(needle[0]):
            continue
        if tuple(haystack[start + 1 : end]) == inner and haystack[end].startswith(needle[-1]):
            return True
    return False


def score_page(page: Page, output: str, ms: float) -> PageResult:
    found = markdown_tokens(output)
    if not page.with_snippets and not page.without_snippets:
        candidate = Counter(found)
        overlap = sum((candidate & page.expected).values())
        precision = overlap / sum(candidate.values()) if candidate else 0.0
        recall = overlap / sum(page.expected.values()) if page.expected else 1.0
        return PageResult(page.name, ms, precision, recall)
    where: dict[str, list[int]] = {}
    for position, token in enumerate(found):
        where.setdefault(token, []).append(position)
    missed = tuple(" ".join(s) for s in page.with_snippets if not contains(found, where, s))
    leaked = tuple(" ".join(s) for s in page.without_snippets if contains(found, where, s))
    found_with = len(page.with_snippets) - len(missed)
    precision = found_with / (found_with + len(leaked)) if found_with + len(leaked) else 0.0
    recall = found_with / len(page.with_snippets) if page.with_snippets else 1.0
    return PageResult(
        page.name, ms, precision, recall, found_with, len(leaked), len(page.with_snippets),
        len(page.without_snippets), leaked, missed,
    )  # fmt: skip


def run(extract: Extractor, pages: list[Page], repeat: int) -> list[PageResult]:
    """Score each page; its time is the CPU time of the fastest of `repeat` runs."""
    results = []
    for page in pages:
        timings = []
        output = ""
        for _ in range(repeat):
            started = time.process_time()
            output = extract(page.body, page.content_type, page.text)
            timings.append((time.process_time() - started) * 1000)
        results.append(score_page(page, output, min(timings)))
    return results


@dataclass(frozen=True, slots=True)
class Summary:
    precision: float
    recall: float
    f1: float
    leak: float | None
    ms_median: float
    ms_max: float
    ms_total: float
    slow: int
    lost: int


def summarise(results: list[PageResult], snippets: bool) -> Summary:
    ms = [r.ms for r in results]
    if snippets:
        found_with = sum(r.found_with for r in results)
        found_without = sum(r.found_without for r in results)
        precision = found_with / (found_with + found_without) if found_with + found_without else 0.0
        recall = found_with / max(1, sum(r.all_with for r in results))
        leak: float | None = found_without / max(1, sum(r.all_without for r in results))
        score = f1(precision, recall)
    else:
        precision = statistics.mean(r.precision for r in results)
        recall = statistics.mean(r.recall for r in results)
        score = statistics.mean(r.f1 for r in results)
        leak = None
    return Summary(
        precision, recall, score, leak, statistics.median(ms), max(ms), sum(ms),
        sum(1 for value in ms if value > SLOW_PAGE_MS), sum(1 for r in results if r.recall < LOST_RECALL),
    )  # fmt: skip


def print_part(
    title: str, pages: list[Page], extractors: list[str], repeat: int, snippets: bool
) -> dict[str, list[PageResult]]:
    size = sum(len(p.body) for p in pages)
    print(f"\n### {title}: {len(pages)} pages, {size / 1e6:.1f} MB of HTML\n")
    print(
        "| extractor | precision | recall | F1 | leak | ms median | ms max | total s | pages >50 ms "
        "| pages recall<0.5 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    by_extractor: dict[str, list[PageResult]] = {}
    for label in extractors:
        results = by_extractor[label] = run(EXTRACTORS[label], pages, repeat)
        s = summarise(results, snippets)
        leak = f"{s.leak:.3f}" if s.leak is not None else "—"
        print(
            f"| {label} | {s.precision:.3f} | {s.recall:.3f} | {s.f1:.3f} | {leak} | {s.ms_median:.1f} | "
            f"{s.ms_max:.1f} | {s.ms_total / 1000:.2f} | {s.slow} | {s.lost} |",
            flush=True,
        )
    if "ours" in by_extractor and "trafilatura" in by_extractor:
        ratio = sum(r.ms for r in by_extractor["trafilatura"]) / sum(r.ms for r in by_extractor["ours"])
        print(f"\nspeed vs trafilatura: {ratio:.1f}x total time")
    return by_extractor


def print_details(title: str, results: list[PageResult], worst: int, snippets: bool, *, named: bool) -> None:
    """The part's lost and slow pages (by name only when `named`), then its `worst` pages."""
    lost = [r.name for r in results if r.recall < LOST_RECALL]
    slow = [f"{r.name} {r.ms:.0f}ms" for r in results if r.ms > SLOW_PAGE_MS]
    if not named:
        print(f"\n{title}: ours, {len(lost)} pages with recall < {LOST_RECALL}, {len(slow)} over {SLOW_PAGE_MS:.0f} ms")
        return
    print(f"\n{title}: ours, pages with recall < {LOST_RECALL}: {', '.join(lost) or 'none'}")
    print(f"{title}: ours, pages over {SLOW_PAGE_MS:.0f} ms: {', '.join(slow) or 'none'}")
    if worst <= 0:
        return
    if snippets:
        print(f"{title}: ours, {worst} pages with the most leaked or missed snippets:")
        ranked = sorted(results, key=lambda r: len(r.leaked) + len(r.missed), reverse=True)
        for r in ranked[:worst]:
            if not r.leaked and not r.missed:
                break
            print(f"  {r.name}  leaked={list(r.leaked)[:3]} missed={[m[:60] for m in r.missed][:3]}")
    else:
        print(f"{title}: ours, {worst} lowest-F1 pages:")
        for r in sorted(results, key=lambda r: r.f1)[:worst]:
            print(f"  {r.name:40} P={r.precision:.2f} R={r.recall:.2f} F1={r.f1:.2f} {r.ms:.1f}ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=Path, help="Readability fixture pages directory")
    parser.add_argument("--snippets", type=Path, help="snippet pages directory (cases.json, pages/)")
    parser.add_argument("--only", help="score pages whose name contains this")
    parser.add_argument("--parts", default="tuning,held-out", help="snippet parts to run: tuning, held-out")
    parser.add_argument("--extractors", default=DEFAULT_EXTRACTORS, help=f"comma list of {', '.join(EXTRACTORS)}")
    parser.add_argument("--worst", type=int, default=10, help="list our N worst pages per part")
    parser.add_argument("--repeat", type=int, default=3, help="runs per page; the fastest counts")
    args = parser.parse_args()
    if args.pages is None and args.snippets is None:
        parser.error("give --pages, --snippets or both")
    extractors = args.extractors.split(",")
    unknown = [label for label in extractors if label not in EXTRACTORS]
    if unknown:
        parser.error(f"unknown extractor {unknown[0]!r}")

    parts: list[tuple[str, list[Page], bool]] = []
    if args.pages is not None:
        parts.append(("Readability pages", load_readability(args.pages, args.only), False))
    if args.snippets is not None:
        tuning, held_out = load_snippets(args.snippets, args.only)
        wanted = args.parts.split(",")
        if "tuning" in wanted:
            parts.append(("Snippet pages, tuning part", tuning, True))
        if "held-out" in wanted:
            parts.append((f"{HELD_OUT_TITLE} (every fourth)", held_out, True))
    totals: dict[str, float] = {}
    for title, pages, snippets in parts:
        if not pages:
            print(f"\n### {title}: no pages", file=sys.stderr)
            continue
        by_extractor = print_part(title, pages, extractors, args.repeat, snippets)
        for label, results in by_extractor.items():
            totals[label] = totals.get(label, 0.0) + sum(r.ms for r in results)
        if "ours" in by_extractor:
            # The held-out part's pages are never named: looking at them would make it tuning.
            named = not title.startswith(HELD_OUT_TITLE)
            print_details(title, by_extractor["ours"], args.worst, snippets, named=named)
    if "ours" in totals and "trafilatura" in totals:
        print(f"\nall parts: speed vs trafilatura {totals['trafilatura'] / totals['ours']:.1f}x total time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
