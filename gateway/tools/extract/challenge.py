"""Bot-challenge detection for web_fetch: is this response a wall rather than the page?

Owns the signatures of Cloudflare challenges and firewall blocks, reCAPTCHA/hCaptcha
interstitials and generic "solve the captcha" pages. A page is flagged only when it looks like
a wall: short, and mostly the challenge (a challenge status or title, the interstitial's own
structure, text that asks for the check). A marker alone is not enough: Cloudflare injects its
`/cdn-cgi/challenge-platform/` script into ordinary pages it serves, sites load reCAPTCHA on
every page (v3 scores visitors invisibly) or under a comment form, and an article may mention
captchas. It is pure (status, headers and decoded text in, a one-line reason or None out),
linear in the text, never touches the network and never raises.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

# Interstitials are short: a real article has far more words than this.
MAX_INTERSTITIAL_WORDS = 400
SCANNED_CHARS = 200_000
CHALLENGE_STATUSES = frozenset({403, 429, 503})
# Matched against lowercased text: a case-insensitive regex is several times slower.
CLOUDFLARE_TITLE = re.compile(r"<title[^<>]*>\s*(just a moment|attention required|please wait)")
# What only the challenge interstitial carries (its options object, form and page script), not
# the `/cdn-cgi/challenge-platform/scripts/jsd/` beacon injected into ordinary pages.
CLOUDFLARE_INTERSTITIAL = ("_cf_chl_opt", "challenge-form", "cf-browser-verification", "cf-challenge-running",
                           "/challenge-platform/h/", "chl_page")  # fmt: skip
GENERIC_CAPTCHA = re.compile(
    r"one last step|solve the captcha|complete the captcha|verify you are (a )?human|"
    r"are you a robot|checking your browser before accessing|please enable cookies"
)
# What the text of a wall says when it asks for the check, in the languages of the pages agents read.
CHECK_WORDS = re.compile(
    r"captcha|robot|human|verif|security check|unusual traffic|automated|\bbot\b|"
    r"sicherheitsüberprüfung|mensch|roboter|vérifi|humain|verific|humano|controllo"
)
# A page whose only text is a few words around a captcha widget is the widget's wall.
BARE_WIDGET_WORDS = 30
# `[^<>]`, not `[^>]`: a run of `<` without `>` must not make each one scan to the end.
TAG = re.compile(r"<[^<>]*>")
HIDDEN_OPEN = re.compile(r"<(script|style)", re.I)
HIDDEN_CLOSE = MappingProxyType({"script": re.compile(r"</script", re.I), "style": re.compile(r"</style", re.I)})
# Visible text is measured a slice at a time, so a long page stops after its first words.
SLICE_CHARS = 8_192
CLOSER_REACH_CHARS = 64


def header(headers: Mapping[str, str], name: str) -> str:
    """A header's value by case-insensitive name, "" when absent."""
    wanted = name.lower()
    for key, value in headers.items():
        if key.lower() == wanted:
            return value
    return ""


@dataclass(frozen=True, slots=True)
class VisibleText:
    """The start of a page's visible text (lowercased) and its word count, capped."""

    text: str
    words: int


def visible_text(body_text: str, stop_after: int = MAX_INTERSTITIAL_WORDS + 1) -> VisibleText:
    """Text outside tags, scripts and styles, read until `stop_after` words (an unclosed script
    or style ends the text).

    Read a slice at a time: an article passes the limit in its first few kilobytes, so it is
    never lowercased, stripped of tags and split whole (that cost a third of a fetch's CPU).
    """
    pieces: list[str] = []
    words = 0
    position = 0
    size = len(body_text)
    while position < size and words < stop_after:
        opener = HIDDEN_OPEN.search(body_text, position)
        end = opener.start() if opener is not None else size
        while position < end and words < stop_after:
            cut = min(end, position + SLICE_CHARS)
            if cut < end:
                # Cut after a tag's end, so no tag (and no word) is split between two slices.
                closing = body_text.find(">", cut, end)
                cut = end if closing < 0 else closing + 1
            piece = TAG.sub(" ", body_text[position:cut]).lower()
            pieces.append(piece)
            words += len(piece.split())
            position = cut
        if opener is None or words >= stop_after:
            break
        closer = HIDDEN_CLOSE[opener.group(1).lower()].search(body_text, opener.end())
        if closer is None:
            break
        # Past the closing tag's `>` (looked for nearby only, so a run of unended closers stays linear).
        end_of_tag = body_text.find(">", closer.end(), closer.end() + CLOSER_REACH_CHARS)
        position = closer.end() if end_of_tag < 0 else end_of_tag + 1
    return VisibleText(" ".join(pieces), min(words, stop_after))


def visible_word_count(body_text: str, stop_after: int = MAX_INTERSTITIAL_WORDS + 1) -> int:
    """Words outside tags, scripts and styles; counting stops at `stop_after`."""
    return visible_text(body_text, stop_after).words


def detect_challenge(status: int, headers: Mapping[str, str], body_text: str) -> str | None:
    """A one-line reason when the response is a bot challenge, else None."""
    if header(headers, "cf-mitigated").strip().lower() == "challenge":
        return "Cloudflare challenge (cf-mitigated: challenge)"
    head = body_text[:SCANNED_CHARS]
    visible = visible_text(head)
    if visible.words > MAX_INTERSTITIAL_WORDS:
        return None  # a page with this much to read is content, whatever scripts it carries
    # Only short pages get here, so the marker searches below run on few pages.
    lowered = head.lower()
    challenge_status = status in CHALLENGE_STATUSES
    interstitial = any(marker in lowered for marker in CLOUDFLARE_INTERSTITIAL)
    if CLOUDFLARE_TITLE.search(lowered) and (challenge_status or interstitial or "cloudflare" in lowered):
        return "Cloudflare challenge page (interstitial title)"
    if interstitial and challenge_status:
        return "Cloudflare challenge page (challenge form)"
    if status == 403 and "cf-error-code" in lowered:
        return "Cloudflare firewall block (403 with cf-error-code)"
    if len(body_text) > SCANNED_CHARS:
        return None  # past here the signs are weak, and a wall is never this long
    # A widget is a wall only on a page that is mostly the widget: its text asks for the check,
    # or it has next to no text at all.
    asks = CHECK_WORDS.search(visible.text) is not None
    widget = _captcha_widget(lowered)
    if widget is not None and (asks or visible.words <= BARE_WIDGET_WORDS):
        return f"{widget} interstitial"
    if GENERIC_CAPTCHA.search(visible.text):
        return "captcha interstitial"
    return None


def _captcha_widget(lowered: str) -> str | None:
    if "google.com/recaptcha/" in lowered or "recaptcha.net/recaptcha/" in lowered:
        return "reCAPTCHA"
    if "hcaptcha.com" in lowered:
        return "hCaptcha"
    return None
