"""Markdown table lines for the RESULTS.md sections."""


def row(cells):
    """``| a | b |``: one table row of ``cells`` (str() of each)."""
    return "| " + " | ".join(map(str, cells)) + " |"


def header(columns):
    """A table's header row and its ``|---|`` rule."""
    return [row(columns), "|" + "---|" * len(columns)]
