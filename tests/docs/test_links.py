"""Every relative link in `docs/`, the README and the other top-level Markdown files reaches a file
that exists, and every `#anchor` names a heading of its target page.

Anchors are made as the site builder makes them (Python-Markdown's `toc` slugify, which mkdocs and
zensical both use): the heading's text without markup, accents folded to ASCII, every character
but letters, digits, `_`, `-` and spaces dropped, lower case, runs of spaces and hyphens made one
`-`; a repeated heading gets `_1`, `_2`. The pages are read on GitHub too, whose slugs keep the
hyphen runs (`a — b` is `a--b` there, `a-b` in the site), so an anchor must be the same under both
rules; the message says which rule it fails. Links into `mkdocs.yml`'s nav are checked the same way.
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
TOP_LEVEL = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md", "ARCHITECTURE.md", "bench/README.md", "bench/HISTORY.md")

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [words](target) and ![alt](target); the target stops at whitespace or the closing bracket
# (a title after it is allowed). Reference-style definitions `[n]: target` too.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
EXPLICIT_ID = re.compile(r"\{\s*#([\w-]+)[^}]*\}\s*$")


def markdown_files() -> list[Path]:
    files = sorted(DOCS.rglob("*.md"))
    files += [ROOT / name for name in TOP_LEVEL if (ROOT / name).exists()]
    return files


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def heading_text(raw: str) -> str:
    """A heading's text as the renderer leaves it: code spans keep their content, link targets,
    emphasis marks and HTML tags go, entities are decoded."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    pieces = []
    # Code spans alternate with prose; only prose loses emphasis marks and tags. An underscore
    # inside a word (`EGRESS_DNS_LISTEN`, `max_tunnels`) is never emphasis.
    for index, piece in enumerate(INLINE_CODE.split(text)):
        if index % 3 == 2:
            pieces.append(piece.strip())
        elif index % 3 == 0:
            prose = re.sub(r"<[^>]+>", "", piece)
            prose = re.sub(r"(\*\*|\*)(?=\S)(.+?)(?<=\S)\1", r"\2", prose)
            prose = re.sub(r"(?<!\w)(__|_)(?=\S)(.+?)(?<=\S)\1(?!\w)", r"\2", prose)
            pieces.append(prose)
    return html.unescape("".join(pieces))


def site_slug(text: str) -> str:
    """Python-Markdown's `toc.slugify` (what mkdocs and zensical use)."""
    value = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def github_slug(text: str) -> str:
    """github-slugger: lower case, punctuation dropped, each space one hyphen (no folding)."""
    value = text.strip().lower()
    value = "".join(ch for ch in value if ch in " -_" or unicodedata.category(ch)[0] in "LNM")
    return value.replace(" ", "-")


def anchors(path: Path) -> tuple[set[str], set[str]]:
    """The anchors a page offers in the site and on GitHub."""
    site: dict[str, int] = {}
    github: dict[str, int] = {}
    found_site: set[str] = set()
    found_github: set[str] = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            found_site.update(re.findall(r'<a\s+(?:id|name)="([^"]+)"', line))
            found_github.update(re.findall(r'<a\s+(?:id|name)="([^"]+)"', line))
            continue
        raw = match.group(2)
        explicit = EXPLICIT_ID.search(raw)
        if explicit:
            found_site.add(explicit.group(1))
            raw = raw[: explicit.start()]
        text = heading_text(raw)
        for slug_of, seen, found, joiner in (
            (site_slug, site, found_site, "_"),
            (github_slug, github, found_github, "-"),
        ):
            slug = slug_of(text)
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}{joiner}{count}")
    return found_site, found_github


def links(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        bare = INLINE_CODE.sub("", line)
        for match in INLINE_LINK.finditer(bare):
            yield number, match.group(1)
        definition = REFERENCE_DEF.match(bare)
        if definition:
            yield number, definition.group(1)


def problem(source: Path, target: str) -> str | None:
    """Why a link from `source` is broken, or None."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
        return None  # https:, mailto: ...: not ours to check offline
    file_part, _, anchor = target.partition("#")
    resolved = (source.parent / file_part).resolve() if file_part else source
    if not resolved.exists():
        return f"{file_part} does not exist"
    if not anchor or resolved.suffix != ".md":
        return None
    in_site, on_github = anchors(resolved)
    if anchor not in in_site:
        return f"#{anchor} is no heading of {resolved.relative_to(ROOT)} (site slugs)"
    if anchor not in on_github:
        return f"#{anchor} works in the site but not on GitHub (its slug differs there)"
    return None


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = [
        f"{page.relative_to(ROOT)}:{number}: {target}: {why}"
        for number, target in links(page)
        if (why := problem(page, target))
    ]
    assert broken == [], "broken links:\n" + "\n".join(broken)


def nav_pages(node: object) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, list):
        for item in node:
            yield from nav_pages(item)
    elif isinstance(node, dict):
        for value in node.values():
            yield from nav_pages(value)


def test_the_nav_names_only_pages_that_exist_and_every_page_is_in_it() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    named = [page for page in nav_pages(config["nav"]) if not re.match(r"^[a-z]+:", page)]
    assert [page for page in named if not (DOCS / page).exists()] == [], "nav names pages that do not exist"
    on_disk = {str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md")}
    assert sorted(on_disk - set(named)) == [], "pages missing from mkdocs.yml's nav"


def test_the_slug_rules_match_the_builders_on_known_headings() -> None:
    # Cases taken from headings of these docs; the expected slugs are what Python-Markdown 3.x and
    # GitHub produce for them.
    assert site_slug(heading_text("Run tokens (`POST /v1/runs`, `X-Egress-Run-Token`)")) == (
        "run-tokens-post-v1runs-x-egress-run-token"
    )
    assert site_slug(heading_text("The pod's DNS: `EGRESS_DNS_LISTEN`")) == "the-pods-dns-egress_dns_listen"
    assert site_slug("Fetch — stall") == "fetch-stall"
    assert github_slug("Fetch — stall") == "fetch--stall"
    assert github_slug("Ünïcode heading") == "ünïcode-heading"
    assert site_slug("Ünïcode heading") == "unicode-heading"
