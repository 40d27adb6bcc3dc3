"""Bot-challenge detection for web_fetch: is this response a wall rather than the page?

Owns the signatures of Cloudflare challenges and firewall blocks, reCAPTCHA/hCaptcha
interstitials and generic "solve the captcha" pages. A page is flagged only when it looks like
a wall: a challenge status or title or the interstitial's own structure, and little else to
read. A marker alone is not enough: Cloudflare injects its `/cdn-cgi/challenge-platform/` script
into ordinary pages it serves, and an article may mention captchas. It is pure (status, headers
and decoded text in, a one-line reason or None out), linear in the text, never touches the
network and never raises.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Interstitials are short: a real article has far more words than this.
MAX_INTERSTITIAL_WORDS = 400
SCANNED_CHARS = 200_000
CHALLENGE_STATUSES = frozenset({403, 429, 503})
CLOUDFLARE_TITLE = re.compile(r"<title[^<>]*>\s*(just a moment|attention required|please wait)", re.I)
# What only the challenge interstitial carries (its options object, form and page script), not
# the `/cdn-cgi/challenge-platform/scripts/jsd/` beacon injected into ordinary pages.
CLOUDFLARE_INTERSTITIAL = ("_cf_chl_opt", "challenge-form", "cf-browser-verification", "cf-challenge-running",
                           "/challenge-platform/h/", "chl_page")  # fmt: skip
GENERIC_CAPTCHA = re.compile(
    r"one last step|solve the captcha|complete the captcha|verify you are (a )?human|"
    r"are you a robot|checking your browser before accessing|please enable cookies",
    re.I,
)
# `[^<>]`, not `[^>]`: a run of `<` without `>` must not make each one scan to the end.
TAG = re.compile(r"<[^<>]*>")
HIDDEN_BLOCKS = ("script", "style")


def header(headers: Mapping[str, str], name: str) -> str:
    """A header's value by case-insensitive name, "" when absent."""
    wanted = name.lower()
    for key, value in headers.items():
        if key.lower() == wanted:
            return value
    return ""


def _without_hidden_blocks(lowered: str) -> str:
    """The text minus <script> and <style> blocks, in one pass (an unclosed one ends the text)."""
    kept: list[str] = []
    position = 0
    while True:
        starts = [found for name in HIDDEN_BLOCKS if (found := lowered.find(f"<{name}", position)) >= 0]
        if not starts:
            kept.append(lowered[position:])
            return "".join(kept)
        start = min(starts)
        kept.append(lowered[position:start])
        name = "script" if lowered.startswith("<script", start) else "style"
        end = lowered.find(f"</{name}", start)
        if end < 0:
            return "".join(kept)
        position = end + len(name) + 2


def visible_word_count(body_text: str, stop_after: int = MAX_INTERSTITIAL_WORDS + 1) -> int:
    """Words outside tags, scripts and styles; counting stops at `stop_after`."""
    text = TAG.sub(" ", _without_hidden_blocks(body_text.lower()))
    count = 0
    for _word in text.split():
        count += 1
        if count >= stop_after:
            break
    return count


def detect_challenge(status: int, headers: Mapping[str, str], body_text: str) -> str | None:
    """A one-line reason when the response is a bot challenge, else None."""
    if header(headers, "cf-mitigated").strip().lower() == "challenge":
        return "Cloudflare challenge (cf-mitigated: challenge)"
    head = body_text[:SCANNED_CHARS]
    lowered = head.lower()
    if visible_word_count(head) > MAX_INTERSTITIAL_WORDS:
        return None  # a page with this much to read is content, whatever scripts it carries
    challenge_status = status in CHALLENGE_STATUSES
    interstitial = any(marker in lowered for marker in CLOUDFLARE_INTERSTITIAL)
    if CLOUDFLARE_TITLE.search(head) and (challenge_status or interstitial or "cloudflare" in lowered):
        return "Cloudflare challenge page (interstitial title)"
    if interstitial and challenge_status:
        return "Cloudflare challenge page (challenge form)"
    if status == 403 and "cf-error-code" in lowered:
        return "Cloudflare firewall block (403 with cf-error-code)"
    if "google.com/recaptcha/" in lowered or "recaptcha.net/recaptcha/" in lowered:
        return "reCAPTCHA interstitial"
    if "hcaptcha.com" in lowered:
        return "hCaptcha interstitial"
    if GENERIC_CAPTCHA.search(head):
        return "captcha interstitial"
    return None
