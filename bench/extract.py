"""Extraction benchmark: our HTML-to-markdown against trafilatura and html-to-markdown.

For each fixture page (DIR/<name>/source.html with expected.html as the main content a careful
reader extracts) every extractor's output is scored as a bag of words with counts against the
expected text: precision, recall and F1, plus speed (ms/page median and p99, MB/s). Markdown
syntax and link URLs are stripped before scoring; the `# title` line our extractor adds from
<title> is metadata, not body, so it is left out (trafilatura emits no title in this mode).
Reads the pages by path; never touches the network.

    .venv/bin/python bench/extract.py --pages ../shared/fixtures/pages
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from selectolax.lexbor import LexborHTMLParser

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.tools.extract.decode import decode_body
from gateway.tools.extract.markdown import html_to_markdown

PAGE_URL = "http://fakehost/test/page.html"
FIXTURE_CONTENT_TYPE = "text/html; charset=utf-8"
SLOW_PAGE_MS = 50.0
LOST_RECALL = 0.5
WORD = re.compile(r"\w+", re.UNICODE)
MD_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
MD_AUTOLINK = re.compile(r"<https?://[^>]*>|https?://\S+")
MD_LIST_NUMBER = re.compile(r"^\s*(?:>\s*)*\d+\.\s", re.M)

Extractor = Callable[[str], str]


@dataclass(frozen=True, slots=True)
class PageScore:
    name: str
    precision: float
    recall: float
    ms: float

    @property
    def f1(self) -> float:
        total = self.precision + self.recall
        return 0.0 if total == 0 else 2 * self.precision * self.recall / total


def words(text: str) -> Counter[str]:
    return Counter(word.lower() for word in WORD.findall(text))


def markdown_words(markdown: str) -> Counter[str]:
    text = MD_LINK.sub(r"\1", markdown)
    text = MD_AUTOLINK.sub(" ", text)
    text = MD_LIST_NUMBER.sub(" ", text)
    return words(text)


def expected_words(html: str) -> Counter[str]:
    tree = LexborHTMLParser(html)
    root = tree.body or tree.root
    return words(root.text(deep=True, separator=" ")) if root is not None else Counter()


def ours(html: str) -> str:
    markdown = html_to_markdown(html, PAGE_URL).markdown
    # Drop the "# title" line: metadata, scored by neither reference nor competitor.
    first, _, rest = markdown.partition("\n")
    return rest if first.startswith("# ") else markdown


def trafilatura_markdown(html: str) -> str:
    import trafilatura  # noqa: PLC0415 - optional bench dependency

    return trafilatura.extract(html, url=PAGE_URL, output_format="markdown") or ""


def html_to_markdown_lib(html: str) -> str:
    import html_to_markdown as h2m  # noqa: PLC0415 - optional bench dependency

    return str(h2m.convert(html).content or "")


EXTRACTORS: dict[str, Extractor] = {
    "ours": ours,
    "trafilatura": trafilatura_markdown,
    "html-to-markdown": html_to_markdown_lib,
}


def load_pages(pages_dir: Path, only: str | None) -> list[tuple[str, str, Counter[str], int]]:
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
        html = decode_body(raw, FIXTURE_CONTENT_TYPE).text
        reference = expected_words(expected.read_text(encoding="utf-8", errors="replace"))
        pages.append((folder.name, html, reference, len(raw)))
    return pages


def score(name: str, candidate: Counter[str], reference: Counter[str], ms: float) -> PageScore:
    overlap = sum((candidate & reference).values())
    precision = overlap / sum(candidate.values()) if candidate else 0.0
    recall = overlap / sum(reference.values()) if reference else 1.0
    return PageScore(name, precision, recall, ms)


def run(extract: Extractor, pages: list[tuple[str, str, Counter[str], int]], repeat: int) -> list[PageScore]:
    """Score each page; its time is the fastest of `repeat` runs (other load is noise)."""
    results = []
    for name, html, reference, _size in pages:
        timings = []
        for _ in range(repeat):
            started = time.perf_counter()
            output = extract(html)
            timings.append((time.perf_counter() - started) * 1000)
        results.append(score(name, markdown_words(output), reference, min(timings)))
    return results


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def summary_row(label: str, results: list[PageScore], total_bytes: int) -> str:
    ms = [r.ms for r in results]
    precision = statistics.mean(r.precision for r in results)
    recall = statistics.mean(r.recall for r in results)
    f1 = statistics.mean(r.f1 for r in results)
    mb_s = total_bytes / 1e6 / (sum(ms) / 1000)
    slow = sum(1 for value in ms if value > SLOW_PAGE_MS)
    lost = sum(1 for r in results if r.recall < LOST_RECALL)
    return (
        f"| {label} | {precision:.3f} | {recall:.3f} | {f1:.3f} | {statistics.median(ms):.1f} | "
        f"{p99(ms):.1f} | {max(ms):.1f} | {mb_s:.1f} | {slow} | {lost} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=Path, required=True, help="fixture pages directory")
    parser.add_argument("--only", help="score one page by folder name")
    parser.add_argument("--extractors", default=",".join(EXTRACTORS), help="comma list")
    parser.add_argument("--worst", type=int, default=10, help="list our N lowest-F1 pages")
    parser.add_argument("--slowest", type=int, default=5, help="list our N slowest pages")
    parser.add_argument("--repeat", type=int, default=3, help="runs per page; the fastest counts")
    args = parser.parse_args()

    pages = load_pages(args.pages, args.only)
    if not pages:
        print(f"no pages with source.html and expected.html under {args.pages}", file=sys.stderr)
        return 2
    total_bytes = sum(size for *_rest, size in pages)
    print(f"{len(pages)} pages, {total_bytes / 1e6:.1f} MB of HTML\n")
    print(
        "| extractor | precision | recall | F1 | ms median | ms p99 | ms max | MB/s | pages >50 ms | pages recall<0.5 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    by_extractor: dict[str, list[PageScore]] = {}
    for label in args.extractors.split(","):
        by_extractor[label] = run(EXTRACTORS[label], pages, args.repeat)
        print(summary_row(label, by_extractor[label], total_bytes), flush=True)

    if "ours" in by_extractor:
        ours_results = by_extractor["ours"]
        if "trafilatura" in by_extractor:
            speedup = sum(r.ms for r in by_extractor["trafilatura"]) / sum(r.ms for r in ours_results)
            median_ratio = statistics.median(r.ms for r in by_extractor["trafilatura"]) / (
                statistics.median(r.ms for r in ours_results)
            )
            print(f"\nspeed vs trafilatura: {speedup:.1f}x total time, {median_ratio:.1f}x median")
        lost = [r for r in ours_results if r.recall < LOST_RECALL]
        slow = [r for r in ours_results if r.ms > SLOW_PAGE_MS]
        print(f"pages with recall < {LOST_RECALL}: {', '.join(r.name for r in lost) or 'none'}")
        print(f"pages over {SLOW_PAGE_MS:.0f} ms: {', '.join(r.name for r in slow) or 'none'}")
        print(f"\nour {args.worst} lowest-F1 pages:")
        for r in sorted(ours_results, key=lambda r: r.f1)[: args.worst]:
            print(f"  {r.name:40} P={r.precision:.2f} R={r.recall:.2f} F1={r.f1:.2f} {r.ms:.1f}ms")
        print(f"\nour {args.slowest} slowest pages:")
        for r in sorted(ours_results, key=lambda r: r.ms, reverse=True)[: args.slowest]:
            print(f"  {r.name:40} {r.ms:.1f}ms F1={r.f1:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
