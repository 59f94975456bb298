"""The report page as HTML: the Markdown report rendered by markdown-it (CommonMark plus tables), with
the raw HTML the report holds (``<details>``, ``<sub>``) passed through, and a small style sheet."""

from __future__ import annotations

__all__ = ["md_to_html"]

_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}"
    "td:first-child,th:first-child{text-align:left;font-family:monospace}th{background:#f3f3f3}"
    "img{max-width:100%}sub{color:#888}"
)


def md_to_html(md: str) -> str:
    """A whole HTML page from the Markdown ``md``."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": True}).enable("table").render(md)
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>sinkwindow report</title>"
        f"<style>{_STYLE}</style></head><body>\n{body}</body></html>\n"
    )
