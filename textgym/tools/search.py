"""`search`: BM25 ranking over a local corpus of pages (rank_bm25's Okapi BM25)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from rank_bm25 import BM25Okapi

from textgym.tools.base import Tool

_WORD_RE = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    """Lower-cased alphanumeric words."""
    return _WORD_RE.findall(text.lower())


@dataclass(frozen=True)
class Document:
    """A searchable page: its title, its URL on the site, and its text."""

    title: str
    url: str
    text: str


class SearchIndex:
    """BM25 (Robertson & Zaragoza 2009, Okapi BM25 with k1=1.5, b=0.75) over documents' title + text.

    Args:
        documents: the corpus.
        top_k: results returned per query.

    Raises:
        ValueError: on an empty corpus.
    """

    def __init__(self, documents: Sequence[Document], top_k: int = 5):
        if not documents:
            raise ValueError("the search corpus is empty")
        self.documents = list(documents)
        self.top_k = int(top_k)
        self.bm25 = BM25Okapi([tokenize(f"{d.title} {d.title} {d.text}") for d in self.documents])

    def search(self, query: str) -> list[Document]:
        """The `top_k` documents with the highest positive BM25 score for `query`, best first."""
        words = tokenize(query)
        if not words:
            return []
        scores = self.bm25.get_scores(words)
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[: self.top_k]
        return [self.documents[i] for i in order if scores[i] > 0]

    def tool(self) -> Tool:
        """The `search` tool: one line per hit, "title: url: first words of the text"."""

        def run(query: str) -> str:
            hits = self.search(query)
            if not hits:
                return f"no results for {query!r}"
            return "\n".join(f"{d.title}: {d.url}: {d.text[:80]}" for d in hits)

        return Tool(
            "search",
            "Search the wiki; returns the best-matching page titles with their URLs.",
            {
                "type": "object",
                "properties": {"query": {"type": "string", "minLength": 1}},
                "required": ["query"],
                "additionalProperties": False,
            },
            run,
        )
