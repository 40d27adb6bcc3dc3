"""Text and link lengths of parsed elements, for main-content detection.

Owns the one definition of an element's text length (its text nodes, each stripped, joined by
one space, as selectolax joins them in C) and the link density built on it, measured so that
nested candidates share one read of the page. It only reads trees: it never prunes, scores or
renders. Every walk is iterative, so a 10,000-deep page cannot exhaust the Python stack.
"""

from __future__ import annotations

from selectolax.lexbor import LexborNode


def text_length(node: LexborNode) -> int:
    """Characters of visible text, each text node trimmed and joined by one space (in C)."""
    return len(node.text(deep=True, separator=" ", strip=True))


class TextStats:
    """Text and link lengths per element, cached for one pass over one tree.

    Scoring asks for the link density of the strongest candidates, which are mostly nested in
    one another (a paragraph's parent, grandparent, ...). Measuring each with its own text walk
    and link selector read the article once per candidate; `measure` reads it once for all of
    them, summing what lies between the candidates from their children.
    """

    def __init__(self) -> None:
        self.text_chars: dict[int, int] = {}
        self.link_chars: dict[int, int] = {}

    def measure(self, nodes: list[LexborNode]) -> None:
        """Cache `text_length` and the link text length of each node, sharing the work.

        `text_length` joins the stripped text nodes with one space, so it is S + N - 1 for the
        S characters of N text nodes: a subtree is summed as (S + N, link chars) over its
        children. Children with no target below are measured in C, targets and their
        ancestors are assembled in Python, with an explicit stack (pages nest 10,000 deep).
        """
        text_chars, link_chars = self.text_chars, self.link_chars
        targets = [node for node in nodes if node.mem_id not in text_chars]
        # Elements with a target below them: their sums come from their children.
        assembled: set[int] = set()
        for node in targets:
            parent = node.parent
            while parent is not None and parent.mem_id not in assembled:
                assembled.add(parent.mem_id)
                parent = parent.parent
        sums: dict[int, tuple[int, int]] = {}
        for target in targets:
            stack: list[tuple[LexborNode, list[LexborNode] | None]] = [(target, None)]
            while stack:
                node, children = stack.pop()
                key = node.mem_id
                if key in sums:
                    continue
                if key not in assembled:
                    sums[key] = _measure_subtree(node)
                    continue
                if children is None:
                    children = _children(node)
                    stack.append((node, children))
                    stack.extend((child, None) for child in children if child.is_element_node)
                    continue
                width = linked = 0
                for child in children:
                    if child.is_element_node:
                        child_width, child_linked = sums[child.mem_id]
                        width += child_width
                        linked += child_linked
                    elif child.is_text_node:
                        width += len((child.text_content or "").strip()) + 1
                if node.tag == "a":
                    # A link around blocks: its whole text is link text, as css("a") finds it.
                    linked += len(node.text(deep=True, strip=True))
                sums[key] = (width, linked)
        for target in targets:
            width, linked = sums[target.mem_id]
            text_chars[target.mem_id] = max(0, width - 1)
            link_chars[target.mem_id] = linked

    def text_length(self, node: LexborNode) -> int:
        """`text_length` of the node, measured once for the pass."""
        key = node.mem_id
        if key not in self.text_chars:
            self.measure([node])
        return self.text_chars[key]

    def link_density(self, node: LexborNode) -> float:
        """Share of the text that sits inside links: high for menus and related-link lists."""
        key = node.mem_id
        if key not in self.text_chars:
            self.measure([node])
        total = self.text_chars[key]
        if total == 0:
            return 0.0
        return min(1.0, self.link_chars[key] / total)


def _measure_subtree(node: LexborNode) -> tuple[int, int]:
    """(S + N, link chars) of an element, in C: N text nodes holding S stripped characters."""
    length = text_length(node)
    # An empty join is no text node or only blank ones: the raw text tells them apart (the
    # parser never makes an empty text node).
    width = length + 1 if length or node.text(deep=True) else 0
    linked = sum([len(anchor.text(deep=True, strip=True)) for anchor in node.css("a")])
    return width, linked


def _children(node: LexborNode) -> list[LexborNode]:
    children = []
    child = node.first_child
    while child is not None:
        children.append(child)
        child = child.next
    return children


def surely_holds(nodes: list[LexborNode], chars: int) -> bool:
    """Whether the nodes' `text_length` sum is at least `chars`, judged from a prefix of each.

    A lower bound: every non-blank character of the raw text survives the per-node strip of
    `text_length`. The raw text is joined in C without a Python string per text node, and a
    long article passes on its first few thousand characters, so the exact sum is only
    computed for short ones.
    """
    found = 0
    for node in nodes:
        found += len("".join(node.text(deep=True)[: chars * 8].split()))
        if found >= chars:
            return True
    return False
