"""Bot-challenge detection: walls are flagged, articles about captchas or carrying a captcha widget are not."""

from __future__ import annotations

import pytest

from gateway.tools.extract.challenge import MAX_INTERSTITIAL_WORDS, detect_challenge, visible_text, visible_word_count

ARTICLE = "<p>" + " ".join(["Researchers studied how people solve puzzles every day."] * 80) + "</p>"


@pytest.mark.parametrize(
    ("status", "headers", "body"),
    [
        pytest.param(403, {"CF-Mitigated": "challenge"}, "<html></html>", id="cf-mitigated-header"),
        pytest.param(
            503, {}, "<title>Just a moment...</title><script src='/cdn-cgi/challenge-platform/h/b'>",
            id="cloudflare-challenge-platform",
        ),
        pytest.param(403, {"server": "cloudflare"}, "<title>Just a moment...</title>", id="cloudflare-title"),
        pytest.param(
            503, {}, "<title>Please wait</title><form id='challenge-form' action='/?__cf_chl_tk=x'></form>"
            "<script>window._cf_chl_opt={cType:'managed'};</script>",
            id="cloudflare-managed-challenge-form",
        ),
        pytest.param(
            403, {}, "<html><span class='cf-error-code'>1020</span> Access denied</html>",
            id="cloudflare-firewall",
        ),
        pytest.param(
            200, {}, "<p>Please verify.</p><script src='https://www.google.com/recaptcha/api.js'></script>",
            id="recaptcha-interstitial",
        ),
        pytest.param(
            200, {}, "<div class='h-captcha'></div><script src='https://js.hcaptcha.com/1/api.js'>",
            id="hcaptcha-interstitial",
        ),
        pytest.param(200, {}, "<h1>One last step</h1><p>Please complete the security check.</p>", id="one-last-step"),
        pytest.param(200, {}, "<h1>Solve the Captcha</h1><form></form>", id="solve-the-captcha"),
    ],
)  # fmt: skip
def test_challenge_pages_are_flagged(status: int, headers: dict[str, str], body: str) -> None:
    reason = detect_challenge(status, headers, body)
    assert reason is not None
    assert "\n" not in reason


@pytest.mark.parametrize(
    ("status", "headers", "body"),
    [
        pytest.param(200, {"server": "cloudflare"}, "<title>News</title>" + ARTICLE, id="cloudflare-served-article"),
        pytest.param(
            200, {}, "<title>How CAPTCHAs work</title>" + ARTICLE
            + "<p>Sites load google.com/recaptcha/ to ask you to solve the captcha.</p>",
            id="article-about-captcha",
        ),
        pytest.param(
            200, {}, ARTICLE + "<script src='https://www.google.com/recaptcha/api.js'></script>",
            id="article-with-recaptcha-form",
        ),
        pytest.param(404, {}, "<h1>Not found</h1>", id="plain-404"),
        pytest.param(403, {}, "<h1>Forbidden</h1>", id="plain-403"),
        pytest.param(200, {"cf-mitigated": "none"}, "<p>ok</p>", id="cf-mitigated-other"),
        pytest.param(
            200, {"server": "cloudflare"}, "<title>News</title>" + ARTICLE
            + "<script src='/cdn-cgi/challenge-platform/scripts/jsd/main.js'></script>",
            id="cloudflare-article-with-injected-challenge-platform-script",
        ),
        pytest.param(
            200, {"server": "cloudflare"}, "<title>Short note</title><p>A short note.</p>"
            + "<script>window.__CF$cv$params={r:'8a'};</script>"
            + "<script src='/cdn-cgi/challenge-platform/scripts/jsd/main.js'></script>",
            id="short-cloudflare-page-with-injected-script",
        ),
        pytest.param(
            200, {}, "<title>Just a moment of calm</title>" + ARTICLE, id="article-titled-like-an-interstitial",
        ),
    ],
)  # fmt: skip
def test_normal_pages_are_not_flagged(status: int, headers: dict[str, str], body: str) -> None:
    assert detect_challenge(status, headers, body) is None


def test_unclosed_scripts_and_tag_openers_are_counted_in_linear_time() -> None:
    # Quadratic before: each unclosed `<script` and each `<` without `>` scanned to the end.
    hostile = "<script>" * 20_000 + "<" * 100_000
    assert detect_challenge(200, {}, hostile) is None
    assert visible_word_count("<p>" + "word " * 1_000 + "<script>" * 5_000) == MAX_INTERSTITIAL_WORDS + 1


SHORT_ARTICLE = (
    "<h1>Voting opens</h1>" + "<p>The jury picked ten sites for the award, and readers vote until May.</p>" * 12
)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(
            SHORT_ARTICLE + "<script src='https://www.google.com/recaptcha/api.js?render=6LdX'></script>",
            id="short-article-with-invisible-recaptcha-v3",
        ),
        pytest.param(
            SHORT_ARTICLE + "<form><textarea name='comment'></textarea><div class='g-recaptcha'></div></form>"
            "<script src='https://www.google.com/recaptcha/api.js'></script>",
            id="short-article-with-recaptcha-under-its-comment-form",
        ),
        pytest.param(
            "<head><script src='https://www.google.com/recaptcha/api.js'></script><style>"
            + "p{margin:0}" * 20_000 + "</style></head><body>" + ARTICLE + "</body>",
            id="article-whose-text-starts-past-the-scanned-part",
        ),
    ],
)  # fmt: skip
def test_an_article_that_embeds_a_captcha_widget_is_not_a_wall(body: str) -> None:
    assert detect_challenge(200, {}, body) is None


def test_a_page_that_is_only_a_captcha_widget_is_a_wall() -> None:
    body = "<title>example.org</title><div class='g-recaptcha' data-sitekey='x'></div>"
    body += "<script src='https://www.google.com/recaptcha/api.js'></script>"
    assert detect_challenge(200, {}, body) == "reCAPTCHA interstitial"


def test_a_wall_asking_for_the_check_in_german_is_flagged() -> None:
    body = "<h1>Sicherheitsüberprüfung</h1><p>Bitte bestätigen Sie, dass Sie ein Mensch sind.</p>"
    body += "<script src='https://js.hcaptcha.com/1/api.js'></script>" + "<p>Impressum Datenschutz Kontakt</p>" * 10
    assert detect_challenge(200, {}, body) == "hCaptcha interstitial"


def test_visible_text_skips_scripts_and_styles_and_stops_at_the_limit() -> None:
    page = "<style>.a{b:c}</style><p>One two</p><script>var x = 'three four';</script><P>Five</P>" + "<p>w</p>" * 900
    visible = visible_text(page, stop_after=10)
    assert visible.words == 10
    assert visible.text.split()[:3] == ["one", "two", "five"]
