"""Boilerplate blocks left inside the chosen main content, recognised by what they say and their shape.

Owns the last pruning step before rendering: short blocks that are a site's furniture rather than
the article (teaser headings such as "Read more" / "Lesen Sie auch" / "Lire aussi" and the link
lists under them, share/print/comment buttons, subscribe and newsletter calls, "Updated on" date
lines, photo credits), in the languages of the pages agents read. Only short blocks are judged,
so an article that discusses newsletters keeps its paragraphs. It prunes the subtrees it is
given; it never scores, parses or renders.
"""

from __future__ import annotations

import re

from selectolax.lexbor import LexborNode

BLOCK_SELECTOR = "p, li, dt, dd, h1, h2, h3, h4, h5, h6, figcaption, div, section, header, small, time"
HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
# Teaser labels: a block starting with one is a pointer to other pages, not text of this one.
TEASER = (
    r"read (more|also|next)|also read|related( (stories|articles|posts|content|news|topics))?|more on this|"
    r"more (stories|from|news|articles)|recommended( for you)?|you (may|might) also like|most (read|popular)|"
    r"trending|further reading|"
    r"lesen sie (auch|mehr|hier)|auch interessant|das könnte (sie|dich) (auch )?interessieren|(zum )?weiterlesen|"
    r"mehr (zum thema|zu|von|dazu|artikel|news)|schon gelesen|ähnliche (artikel|themen|beiträge)|"
    r"weitere (artikel|beiträge|nachrichten|news|themen)|verwandte (artikel|themen)|meistgelesen|empfehlungen|"
    r"(à )?lire (aussi|également|la suite)|sur le même (sujet|thème)|voir aussi|à voir aussi|"
    r"lee (también|más)|leer más|te puede interesar|(también )?te (puede|podría) interesar|noticias relacionadas|"
    r"más noticias|leggi anche|potrebbe interessarti|articoli correlati|"
    r"czytaj (też|także|więcej)|zobacz (też|także)|ten tekst przeczytasz|leia (também|mais)|veja também|"
    r"lees (ook|meer)|читайте также|смотрите также"
)
# Buttons and counters: the whole block is one of these (and perhaps a number).
WIDGET = (
    r"share( this( (article|story|post))?)?|teilen|partager|compartir|condividi|udostępnij|tweet|"
    r"comments?|kommentare?( schreiben| insgesamt| geschlossen)?|kommentieren|commentaires?|comentarios?|"
    r"print|drucken|rezept drucken|imprimer|imprimir|stampa|drukuj|permalink|permalien|"
    r"advertisement|anzeige|werbung|publicité|publicidad|pubblicità|reklama|sponsored|"
    r"aufrufe|views|likes?|gefällt mir|back to top|nach oben|zurück|top|"
    r"facebook|twitter|twittern|whatsapp|e-?mail|mailen|linkedin|xing|pinterest|telegram|reddit|"
    r"copy link|link kopieren|copier le lien"
)
# Calls to subscribe, sign up or log in: in a short block they are the site talking, not the story.
# Substrings of the lowercased text (`in` is many times faster than an unanchored regex).
CALL_TO_ACTION = (
    "subscrib",
    "newsletter",
    "sign up",
    "signing up",
    "log in",
    "login",
    "signed in",
    "abonn",
    "anmelden",
    "einloggen",
    "eingeloggt",
    "registrier",
    "inscri",
    "suscrib",
    "iscriviti",
    "zapisz się",
    "download our app",
    "download the app",
    "app herunterladen",
    "privatsphäre",
    "privacy",
)
# Date and byline labels heading a short line: "Updated on 3 May", "Veröffentlicht am", "Opublikowano".
DATE_LINE = (
    r"(last )?updated|published|posted( on| by)?|release date|aktualisiert|veröffentlicht|erschienen|stand|"
    r"publié|mis à jour|publicado|actualizado|pubblicato|aggiornato|opublikowano|aktualizacja|"
    r"gepubliceerd|bijgewerkt|dieser text wurde"
)
# Photo credits: "Foto: ...", "Bild: ...", "(c) Getty Images"; or a caption ending in a picture
# agency and perhaps the photographer ("... REUTERS/Denis Balibouse").
CREDIT = r"(fotos?|photos?|bild(er)?|image|imágenes?|immagine|zdjęcie|quelle|source|credits?|titelbild|©|\(c\))\b"
AGENCY = (
    r"getty ?images|shutterstock|istock(photo)?|imago( images)?|picture[ -]alliance|unsplash|pixabay|reuters|afp|"
    r"dpa|ap photo|epa(-efe)?|efe|anp|ansa|pap"
)
# Matched against lowercased text: a case-insensitive regex is several times slower.
TEASER_BLOCK = re.compile(rf"^(?:{TEASER})\b")
WIDGET_BLOCK = re.compile(rf"^(?:(?:{WIDGET})\W*\d*\W*)+$")
AGENCY_CREDIT = re.compile(rf"\b(?:{AGENCY})\b[\w ./|-]{{0,40}}\W*$")
DATE_BLOCK = re.compile(rf"^(?:{DATE_LINE})\b")
CREDIT_BLOCK = re.compile(rf"^\W*(?:{CREDIT})")
# A credit anywhere in a caption: "... (Foto: J. Doe)", "Bild: dpa", "© Reuters", "(Symbolbild)".
CAPTION_CREDIT = re.compile(r"\b(?:fotos?|photos?|bild|image|credits?|quelle|source)\s*:|©|\(c\)|symbolbild")
SHORT_BLOCK_CHARS = 120
# A call to subscribe is one short sentence; an article's sentence about newsletters has clauses.
CALL_BLOCK_CHARS = 200
CREDIT_CHARS = 80
MAX_JUDGED_CHARS = max(SHORT_BLOCK_CHARS, CALL_BLOCK_CHARS)
# Link share above which the blocks after a teaser heading are its list of other pages.
TEASER_LIST_LINK_SHARE = 0.5


def remove_boilerplate_blocks(root: LexborNode) -> None:
    """Drop the short boilerplate blocks inside `root`, and the link lists under teaser headings."""
    # Innermost first, and an element with a long block inside is long itself: each element's
    # text is read only while it is short, which keeps this linear on big pages.
    long_blocks: set[int] = set()
    for node in reversed(root.css(BLOCK_SELECTOR)):
        parent = node.parent
        if node.mem_id == root.mem_id or parent is None:
            continue
        if node.mem_id in long_blocks:
            long_blocks.add(parent.mem_id)
            continue
        raw = node.text(deep=True)
        if len(raw) > MAX_JUDGED_CHARS * 4:
            long_blocks.add(parent.mem_id)
            continue
        text = " ".join(raw.split())
        if len(text) > MAX_JUDGED_CHARS:
            long_blocks.add(parent.mem_id)
            continue
        caption = node.tag == "figcaption" or "caption" in (node.attributes.get("class") or "").lower()
        verdict = _boilerplate(text, caption)
        if verdict is None:
            continue
        if verdict == "teaser" and node.tag in HEADINGS:
            _remove_link_lists_after(node)
        node.decompose()


def _boilerplate(text: str, caption: bool) -> str | None:
    if not text:
        return None
    text = text.lower()
    # A caption that credits its picture describes the picture, not the story.
    if caption and (CAPTION_CREDIT.search(text) or AGENCY_CREDIT.search(text)):
        return "credit"
    if len(text) <= CALL_BLOCK_CHARS and text.count(",") <= 1 and any(call in text for call in CALL_TO_ACTION):
        return "call"
    if len(text) > SHORT_BLOCK_CHARS:
        return None
    if TEASER_BLOCK.match(text):
        return "teaser"
    if WIDGET_BLOCK.match(text) or DATE_BLOCK.match(text):
        return "widget"
    if len(text) <= CREDIT_CHARS and (CREDIT_BLOCK.match(text) or AGENCY_CREDIT.search(text)):
        return "credit"
    return None


def _remove_link_lists_after(heading: LexborNode) -> None:
    """The blocks after a "Read more" heading, while they are mostly links."""
    sibling = heading.next
    while sibling is not None:
        following = sibling.next
        if sibling.is_element_node:
            if sibling.tag in HEADINGS or not _mostly_links(sibling):
                return
            sibling.decompose()
        sibling = following


def _mostly_links(node: LexborNode) -> bool:
    total = len(node.text(deep=True, strip=True))
    if total == 0:
        return True
    linked = sum(len(anchor.text(deep=True, strip=True)) for anchor in node.css("a"))
    return linked / total > TEASER_LIST_LINK_SHARE
