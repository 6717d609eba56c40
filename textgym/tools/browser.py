"""A text browser for agents: `open(url)`, `find(text)`, `click(link_id)`, `scroll(direction)`.

Pages are fetched over HTTP with `httpx` and rendered by BeautifulSoup into compact text:
one line per block of text, each link written `[n] text` with a number the agent can
`click`. Only URLs under `allowed_prefixes` can be opened (the env's own site), so an
agent cannot reach anything else. A window of `lines_per_view` lines is shown; `scroll`
moves it.
"""

from __future__ import annotations

from urllib.parse import urljoin

import httpx
from bs4 import BeautifulSoup, NavigableString, Tag

from textgym.tools.base import Tool

BLOCKS = {"p", "h1", "h2", "h3", "li", "div", "tr", "title", "br"}


def render_html(page: str, base_url: str) -> tuple[str, list[str], list[str]]:
    """Render HTML into `(title, lines, links)`; link *n* of the text is `links[n]` (absolute URL)."""
    soup = BeautifulSoup(page, "html.parser")
    title = soup.title.get_text(" ", strip=True) if soup.title else ""
    body = soup.body or soup
    lines: list[str] = []
    links: list[str] = []
    current: list[str] = []

    def flush() -> None:
        text = " ".join("".join(current).split())
        if text:
            lines.append(text)
        current.clear()

    def walk(node: Tag) -> None:
        for child in node.children:
            if isinstance(child, NavigableString):
                current.append(str(child))
            elif isinstance(child, Tag):
                if child.name in ("script", "style", "head"):
                    continue
                if child.name == "a" and child.get("href"):
                    links.append(urljoin(base_url, str(child["href"])))
                    current.append(f" [{len(links) - 1}] {child.get_text(' ', strip=True)} ")
                    continue
                block = child.name in BLOCKS
                if block:
                    flush()
                walk(child)
                if block:
                    flush()

    walk(body)
    flush()
    return title, lines, links


class Browser:
    """One agent's browsing session (its own cookies, current page and scroll position).

    Args:
        base_url: relative URLs are resolved against it.
        allowed_prefixes: URLs that may be opened (default: `base_url` only).
        lines_per_view: lines shown per view.
        timeout_s: HTTP timeout per request (seconds).
    """

    def __init__(
        self,
        base_url: str,
        allowed_prefixes: tuple[str, ...] | None = None,
        lines_per_view: int = 40,
        timeout_s: float = 10.0,
    ):
        self.base_url = base_url.rstrip("/") + "/"
        self.allowed = allowed_prefixes or (self.base_url,)
        self.lines_per_view = int(lines_per_view)
        self.client = httpx.Client(timeout=timeout_s, follow_redirects=True)
        self.reset()

    def reset(self, cookies: dict[str, str] | None = None) -> None:
        """Forget the page and cookies; set `cookies` for the next requests."""
        self.client.cookies.clear()
        for k, v in (cookies or {}).items():
            self.client.cookies.set(k, v)
        self.url, self.title, self.top = "", "", 0
        self.lines: list[str] = []
        self.links: list[str] = []

    def close(self) -> None:
        """Close the HTTP client."""
        self.client.close()

    def _view(self) -> str:
        end = min(len(self.lines), self.top + self.lines_per_view)
        head = f"{self.title} ({self.url}) lines {self.top + 1}-{end} of {len(self.lines)}"
        more = "\n[scroll down for more]" if end < len(self.lines) else ""
        return head + "\n" + "\n".join(self.lines[self.top : end]) + more

    def open(self, url: str) -> str:
        """Fetch `url` (absolute, or relative to the site) and show its first view.

        Raises:
            ValueError: for a URL outside the allowed site, an HTTP error status, or a failed request.
        """
        target = urljoin(self.base_url, url.strip())
        if not target.startswith(self.allowed):
            raise ValueError(f"{url!r} is outside this site; open pages under {self.base_url}")
        try:
            response = self.client.get(target)
        except httpx.HTTPError as e:
            raise ValueError(f"could not fetch {target}: {type(e).__name__}") from None
        if response.status_code >= 400:
            detail = response.text[:200]
            raise ValueError(f"HTTP {response.status_code} for {target}: {detail}")
        self.url = str(response.url)
        self.title, self.lines, self.links = render_html(response.text, self.url)
        self.top = 0
        return self._view()

    def click(self, link_id: int) -> str:
        """Open link `link_id` of the current page.

        Raises:
            ValueError: when there is no such link.
        """
        if not 0 <= link_id < len(self.links):
            raise ValueError(f"no link [{link_id}] on this page ({len(self.links)} links)")
        return self.open(self.links[link_id])

    def find(self, text: str) -> str:
        """The lines of the current page that contain `text` (case-insensitive), with their line numbers.

        Raises:
            ValueError: before any page is open.
        """
        if not self.url:
            raise ValueError("no page is open; call open first")
        needle = text.lower()
        hits = [f"{i + 1}: {line}" for i, line in enumerate(self.lines) if needle in line.lower()]
        return "\n".join(hits) if hits else f"{text!r} is not on this page"

    def scroll(self, direction: str) -> str:
        """Move the view one window "down" or "up".

        Raises:
            ValueError: before any page is open.
        """
        if not self.url:
            raise ValueError("no page is open; call open first")
        step = self.lines_per_view if direction == "down" else -self.lines_per_view
        self.top = max(0, min(self.top + step, max(0, len(self.lines) - 1)))
        return self._view()

    def tools(self) -> list[Tool]:
        """The four browser tools bound to this session."""
        return [
            Tool(
                "open",
                "Open a web page of this site by URL (e.g. '/shop' or '/wiki/page_name').",
                {
                    "type": "object",
                    "properties": {"url": {"type": "string"}},
                    "required": ["url"],
                    "additionalProperties": False,
                },
                self.open,
            ),
            Tool(
                "click",
                "Follow the link numbered [link_id] on the current page.",
                {
                    "type": "object",
                    "properties": {"link_id": {"type": "integer", "minimum": 0}},
                    "required": ["link_id"],
                    "additionalProperties": False,
                },
                self.click,
            ),
            Tool(
                "find",
                "Show the lines of the current page that contain some text.",
                {
                    "type": "object",
                    "properties": {"text": {"type": "string", "minLength": 1}},
                    "required": ["text"],
                    "additionalProperties": False,
                },
                self.find,
            ),
            Tool(
                "scroll",
                "Scroll the current page down or up.",
                {
                    "type": "object",
                    "properties": {"direction": {"type": "string", "enum": ["down", "up"]}},
                    "required": ["direction"],
                    "additionalProperties": False,
                },
                self.scroll,
            ),
        ]
