"""Tables for the markdown renderer: which tables hold data, and their rows and cells.

Owns the one judgement of a table's kind (a data grid, written as a markdown table, or a layout
box, flattened to text) and the row helpers the renderer uses. It only reads the tree: it never
renders, prunes or touches the network.
"""

from __future__ import annotations

from selectolax.lexbor import LexborNode

CELL_TAGS = ("td", "th")


def row_cells(row: LexborNode) -> list[LexborNode]:
    # `iter()` walks the element children in C: faster than following `next` from Python.
    return [child for child in row.iter() if child.tag in CELL_TAGS]


def _closest_table(node: LexborNode) -> int | None:
    parent = node.parent
    while parent is not None:
        if parent.tag == "table":
            return parent.mem_id
        parent = parent.parent
    return None


def table_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def is_layout_table(table: LexborNode) -> bool:
    """A table used for page layout, not data: flattened to text instead of a grid."""
    if (table.attributes.get("role") or "").lower() in ("presentation", "none"):
        return True
    # css() matches the element itself first, so a second hit is a nested table; a table
    # inside another is the inner half of a layout grid.
    if len(table.css("table")) > 1 or _closest_table(table) is not None:
        return True
    # No table inside, so every row is this table's own (no walk up from each row).
    rows = table.css("tr")
    if not rows:
        return True
    # One column, or one row without a header cell, is a box for text, not data. A data table
    # shows two cells in its first rows: the scan stops there instead of counting every row.
    if len(rows) == 1 and table.css_first("th") is None:
        return True
    return not any(_holds_two_cells(row) for row in rows)


def _holds_two_cells(row: LexborNode) -> bool:
    seen = 0
    for child in row.iter():
        if child.tag in CELL_TAGS:
            seen += 1
            if seen == 2:
                return True
    return False
