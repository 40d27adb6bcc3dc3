"""Bot-challenge detection for web_fetch: is this response a wall rather than the page?

Owns the signatures of Cloudflare challenges and firewall blocks, reCAPTCHA/hCaptcha
interstitials and generic "solve the captcha" pages. A page is flagged only when the signature
comes with little else: an article that merely mentions captchas is content. It is pure (status,
headers and decoded text in, a one-line reason or None out); it never touches the network and
never raises.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Interstitials are short: a real article mentioning "captcha" has far more words than this.
MAX_INTERSTITIAL_WORDS = 400
CLOUDFLARE_TITLE = re.compile(r"<title>\s*(just a moment|attention required)", re.I)
GENERIC_CAPTCHA = re.compile(
    r"one last step|solve the captcha|complete the captcha|verify you are (a )?human|"
    r"are you a robot|checking your browser before accessing|please enable cookies",
    re.I,
)
TAG = re.compile(r"<script\b.*?</script>|<style\b.*?</style>|<[^>]+>", re.I | re.S)


def header(headers: Mapping[str, str], name: str) -> str:
    """A header's value by case-insensitive name, "" when absent."""
    wanted = name.lower()
    for key, value in headers.items():
        if key.lower() == wanted:
            return value
    return ""


def visible_word_count(body_text: str) -> int:
    return len(TAG.sub(" ", body_text).split())


def detect_challenge(status: int, headers: Mapping[str, str], body_text: str) -> str | None:
    """A one-line reason when the response is a bot challenge, else None."""
    if header(headers, "cf-mitigated").strip().lower() == "challenge":
        return "Cloudflare challenge (cf-mitigated: challenge)"
    head = body_text[:200_000]
    if "/cdn-cgi/challenge-platform/" in head:
        return "Cloudflare challenge page (challenge-platform script)"
    if CLOUDFLARE_TITLE.search(head) and ("cloudflare" in head.lower() or status in (403, 503)):
        return "Cloudflare challenge page (interstitial title)"
    if status == 403 and "cf-error-code" in head:
        return "Cloudflare firewall block (403 with cf-error-code)"
    short = visible_word_count(head) <= MAX_INTERSTITIAL_WORDS
    lowered = head.lower()
    if short and ("google.com/recaptcha/" in lowered or "recaptcha.net/recaptcha/" in lowered):
        return "reCAPTCHA interstitial"
    if short and "hcaptcha.com" in lowered:
        return "hCaptcha interstitial"
    if short and GENERIC_CAPTCHA.search(head):
        return "captcha interstitial"
    return None
