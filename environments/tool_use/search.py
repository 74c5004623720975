"""``search`` and ``read`` tools over one task's documents.

Search ranks documents by the query's words found in the title (which count double) and
in the text, preferring shorter titles on ties, so an exact name comes first and
near-identical names follow. Results are one line per document: ``d03 Velmora``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from forge_env import Tool, ToolError, tool

_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


class DocumentIndex:
    """The documents of one task (``{"id", "title", "text"}`` dicts), searchable by words."""

    def __init__(self, documents: Sequence[dict], max_results: int = 5):
        self.documents = {doc["id"]: doc for doc in documents}
        self.max_results = max_results
        # No word sets kept: a task has a handful of short documents, so splitting them per search costs
        # microseconds, while sets of words held per episode were half of an idle episode's memory (~10 KB).

    def search(self, query: str) -> list[dict]:
        """The best-matching documents for ``query``, best first (at most ``max_results``)."""
        wanted = _words(query)
        scored = []
        for doc_id, doc in self.documents.items():
            title = _words(doc["title"])
            score = 2 * len(wanted & title) + len(wanted & _words(doc["text"]))
            if score:
                scored.append((-score, len(title), doc_id, doc))
        return [doc for *_, doc in sorted(scored)[: self.max_results]]

    def read(self, doc_id: str) -> dict:
        """The document with this id (``d03``; ``D03``, ``3`` and ``d3`` are read as ``d03`` too)."""
        key = doc_id.strip().lower()
        if key.lstrip("d").isdigit():
            key = f"d{int(key.lstrip('d')):02d}"
        if key not in self.documents:
            raise ToolError(f"no document {doc_id!r}; ids look like d03 - use search to find them")
        return self.documents[key]

    def tools(self) -> list[Tool]:
        """The ``search`` and ``read`` tools bound to this index."""
        index = self

        @tool
        def search(query: str) -> str:
            """Find documents by words in them; lists doc ids and titles.

            Args:
                query: words to look for, e.g. a name.
            """
            if not query.strip():
                raise ToolError("the query is empty; search for a name, e.g. search('Velmora')")
            hits = index.search(query)
            if not hits:
                return f"no documents match {query!r}"
            return "\n".join(f"{doc['id']} {doc['title']}" for doc in hits)

        @tool
        def read(doc_id: str) -> str:
            """Show a document's text.

            Args:
                doc_id: an id from search, e.g. d03.
            """
            return index.read(doc_id)["text"]

        return [search, read]
