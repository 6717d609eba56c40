"""`textgym/WebShop-v0` and `textgym/WikiSearch-v0`: browse a real local web site with tools.

Both talk HTTP to the site of `textgym.envs.web.site`, served on 127.0.0.1 by a process-wide
server that the first env starts and the last env's `close()` stops. The agent acts through
tools (`ToolUseWrapper`); its reply without a tool call ends the episode and is scored.
"""

from __future__ import annotations

import math
import re
import string
import uuid
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np

from textgym.envs.base import TextEnv
from textgym.envs.tool_use import ToolUseWrapper
from textgym.envs.web.site import SiteServer, catalogue, wiki
from textgym.tools.base import format_tool_call
from textgym.tools.browser import Browser
from textgym.tools.search import Document, SearchIndex
from textgym.types import Message, Task

SHOP_TASK_SEED = 99
N_SHOP_TASKS = 500
SHOP_ATTRIBUTES = ("category", "color", "material", "size", "price")


@lru_cache(maxsize=1)
def shop_tasks() -> tuple[Task, ...]:
    """Shopping instructions generated from in-stock catalogue items (seeded).

    Each asks for a category, color, material and size under a budget set $1-15 above the
    target item's price; metadata holds the wanted attributes and the target's id and size.
    """
    rng = np.random.default_rng(SHOP_TASK_SEED)
    products = [p for p in catalogue() if any(p.sizes.values())]
    tasks = []
    for i in range(N_SHOP_TASKS):
        p = products[int(rng.integers(len(products)))]
        size = [s for s, n in p.sizes.items() if n][int(rng.integers(sum(1 for n in p.sizes.values() if n)))]
        budget = math.ceil(p.price + float(rng.uniform(1, 15)))
        tasks.append(
            Task(
                task_id=f"webshop/{i}",
                prompt=f"Buy a {p.color} {p.material} {p.category} in size {size} for at most ${budget}.",
                answer=f"{p.id}:{size}",
                metadata={
                    "category": p.category,
                    "color": p.color,
                    "material": p.material,
                    "size": size,
                    "budget": budget,
                    "target": p.id,
                },
            )
        )
    return tuple(tasks)


class _SiteEnv(TextEnv):
    """A TextEnv holding a browser on the shared local site; `close()` releases the server."""

    def __init__(self, tasks: tuple[Task, ...], **kwargs: Any):
        super().__init__(tasks, **kwargs)
        self.site_url = SiteServer.acquire()
        self.browser = Browser(self.site_url)
        self.session = ""
        self._closed = False

    def _new_session(self) -> None:
        self.session = uuid.uuid4().hex
        self.browser.reset(cookies={"session": self.session})

    def close(self) -> None:
        """Close the browser and release the shared server (stopped when no env uses it)."""
        if not self._closed:
            self._closed = True
            self.browser.close()
            SiteServer.release()
        super().close()

    def _turn(self, messages: list[Message]) -> int:
        return sum(1 for m in messages if m.get("role") == "assistant")


class WebShopCore(_SiteEnv):
    r"""Buy the item an instruction describes on a local shop web site.

    ## Description
    Task *i* is a generated instruction ("Buy a red cotton shirt in size L for at most $27.").
    The agent browses the shop (`/shop`: search, product pages with size options, cart,
    checkout) with the browser tools, then replies without a tool call to finish.

    ## Action Space
    `UnicodeText`; tool calls are handled by the `ToolUseWrapper` around this env.

    ## Observation Space
    `ChatMessages`: the instruction after `reset`; tool results as `role: "tool"` messages.

    ## Rewards
    From the server's order record for the episode's session: the share of the five
    attributes (category, color, material, size, price ≤ budget) the best ordered item
    matches; 1.0 for a full match, 0.0 without an order. `reward/correct` is 1.0 only for a
    full match.

    ## Episode End
    Terminates on the first reply without a tool call; `TimeLimit` (15 turns) truncates.

    Examples:
        >>> import gymnasium as gym
        >>> import textgym
        >>> env = gym.make("textgym/WebShop-v0")   # starts the local shop on 127.0.0.1
        >>> obs, info = env.reset(options={"task_index": 0})
        >>> obs[0]["content"][:53]
        'Buy a red polyester jacket in size L for at most $21.'
        >>> obs, reward, terminated, truncated, info = env.step("I give up.")   # no order placed
        >>> reward, terminated
        (0.0, True)
        >>> env.close()
    """

    def __init__(self, **kwargs: Any):
        super().__init__(shop_tasks(), **kwargs)
        self._products = {p.id: p for p in catalogue()}

    def initial_messages(self, task: Task) -> list[Message]:
        """The instruction and how to use the site; a new shop session starts."""
        self._new_session()
        return [
            {
                "role": "user",
                "content": f"{task.prompt} The shop is at {self.site_url}/shop; use the browser tools. "
                "When you have checked out, reply without a tool call to finish.",
            }
        ]

    def score_order(self, order: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """Match the ordered items against the task: `(reward, details)` of the best item."""
        assert self.task is not None
        want = self.task.metadata
        best = 0.0
        best_detail: dict[str, Any] = {"matched": []}
        for item in order.get("items", []):
            p = self._products.get(int(item["product"]))
            if p is None:
                continue
            matched = [
                a
                for a, ok in (
                    ("category", p.category == want["category"]),
                    ("color", p.color == want["color"]),
                    ("material", p.material == want["material"]),
                    ("size", item["size"] == want["size"]),
                    ("price", p.price <= want["budget"]),
                )
                if ok
            ]
            score = len(matched) / len(SHOP_ATTRIBUTES)
            if score > best:
                best, best_detail = score, {"matched": matched, "product": p.id, "size": item["size"]}
        return best, best_detail

    def respond(self, action: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Finish: read this session's order from the server and score it."""
        response = httpx.get(f"{self.site_url}/shop/api/order", params={"session": self.session}, timeout=10)
        response.raise_for_status()
        reward, details = self.score_order(response.json())
        return [], reward, True, {"reward/correct": float(reward == 1.0), "details": details}

    def oracle_action(self, messages: list[Message]) -> str:
        """Act on what the pages show: search, click the wanted item, click its size, check out, finish.

        Every step is readable from the instruction and the page the browser shows, so a
        policy can imitate it: the search query is the instruction's color, material and
        category; on the results page the click goes to the numbered link of the wanted item
        (the "Next page" link while it is not listed); on its page, to the link "Add size S";
        then the checkout page, and a reply without a tool call.
        """
        if self.task is None:
            raise RuntimeError("call reset() before asking the oracle")
        m = self.task.metadata
        path = urlsplit(self.browser.url).path
        links = [urlsplit(link) for link in self.browser.links]
        if path == "/shop/search":
            for i, link in enumerate(links):
                if link.path == f"/shop/product/{m['target']}":
                    return format_tool_call("click", {"link_id": i})
            pages = [i for i, link in enumerate(links) if link.path == "/shop/search"]
            if pages:
                return format_tool_call("click", {"link_id": pages[-1]})
        elif path == f"/shop/product/{m['target']}":
            for i, link in enumerate(links):
                if link.path == "/shop/cart/add" and f"size={m['size']}" in link.query.split("&"):
                    return format_tool_call("click", {"link_id": i})
        elif path == "/shop/cart/add":
            return format_tool_call("open", {"url": "/shop/checkout"})
        elif path == "/shop/checkout":
            return "I have placed the order."
        query = f"{m['color']}+{m['material']}+{m['category']}"
        return format_tool_call("open", {"url": f"/shop/search?q={query}"})


_NORMALIZE_RE = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD-style normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(c for c in text if c not in set(string.punctuation))
    return " ".join(_NORMALIZE_RE.sub(" ", text).split())


def extract_final_answer(reply: str) -> str:
    """The answer in a reply: the last `\\boxed{...}`, else the text after "answer:", else the whole reply.

    A reply that boxes more than one distinct answer has none (""): one final answer per reply.
    """
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", reply)
    if len({normalize_answer(b) for b in boxed}) > 1:
        return ""
    if boxed:
        return boxed[-1]
    m = re.search(r"answer\s*(?:is|:)\s*(.+)", reply, re.IGNORECASE)
    return m.group(1) if m else reply


@lru_cache(maxsize=1)
def wiki_tasks() -> tuple[Task, ...]:
    """Two questions per person page: their birth country (2 hops) and its capital (3 hops)."""
    pages = wiki()
    tasks = []
    for page in pages.values():
        if page.kind != "person":
            continue
        city = pages[page.facts["city"].lower()]
        country = pages[city.facts["country"].lower()]
        hops = [page.slug, city.slug, country.slug]
        tasks.append(
            Task(
                task_id=f"wiki/{page.slug}/country",
                prompt=f"In which country was {page.title} born?",
                answer=country.title,
                metadata={"person": page.title, "path": hops[:2]},
            )
        )
        tasks.append(
            Task(
                task_id=f"wiki/{page.slug}/capital",
                prompt=f"What is the capital of the country where {page.title} was born?",
                answer=country.facts["capital"],
                metadata={"person": page.title, "path": hops},
            )
        )
    return tuple(tasks)


@lru_cache(maxsize=1)
def wiki_index() -> SearchIndex:
    """The BM25 index over every wiki page (link markup removed)."""
    docs = [
        Document(p.title, f"/wiki/{p.slug}", p.text.replace("[[", "").replace("]]", ""))
        for p in wiki().values()
    ]
    return SearchIndex(docs)


class WikiSearchCore(_SiteEnv):
    r"""Answer multi-hop questions by searching a local wiki and following its links.

    ## Description
    "In which country was Kalo Mirave born?" — a person's page names the birth city, the
    city's page names the country, the country's page its capital. Tools: `search` (BM25
    over the wiki) and the browser.

    ## Rewards
    `correct`: 1.0 when the final reply's answer (its last `\boxed{}`) equals the gold
    answer after SQuAD-style normalisation, else 0.0.

    ## Episode End
    Terminates on the first reply without a tool call; `TimeLimit` (10 turns) truncates.

    Examples:
        >>> import gymnasium as gym
        >>> import textgym
        >>> env = gym.make("textgym/WikiSearch-v0")   # starts the local wiki on 127.0.0.1
        >>> obs, info = env.reset(options={"task_index": 0})
        >>> obs[0]["content"][:38]
        'In which country was Nilo Famini born?'
        >>> call = '<tool_call>{"name": "search", "arguments": {"query": "Nilo Famini"}}</tool_call>'
        >>> print(env.step(call)[0][0]["content"].splitlines()[0])
        Nilo Famini: /wiki/nilo_famini: Nilo Famini (born 1863) is a historian. Nilo was born in Rimika.
        >>> env.step(r"\boxed{Venido}")[1:3]   # Rimika's page names the country
        (1.0, True)
        >>> env.close()
    """

    def __init__(self, **kwargs: Any):
        super().__init__(wiki_tasks(), **kwargs)

    def initial_messages(self, task: Task) -> list[Message]:
        """The question and the answer format."""
        self._new_session()
        return [
            {
                "role": "user",
                "content": f"{task.prompt} Use the search and browser tools on the wiki at "
                f"{self.site_url}/wiki. "
                "Reply with the final answer within \\boxed{} and no tool call.",
            }
        ]

    def respond(self, action: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Score the final answer."""
        assert self.task is not None
        given = extract_final_answer(action)
        ok = normalize_answer(given) == normalize_answer(self.task.answer)
        return [], float(ok), True, {"reward/correct": float(ok), "details": {"extracted": given[:200]}}

    def oracle_action(self, messages: list[Message]) -> str:
        """Search the person, open each page on the path, answer."""
        assert self.task is not None
        path = self.task.metadata["path"]
        plan = [format_tool_call("search", {"query": self.task.metadata["person"]})]
        plan += [format_tool_call("open", {"url": f"/wiki/{slug}"}) for slug in path]
        plan.append(f"The answer is \\boxed{{{self.task.answer}}}.")
        return plan[min(self._turn(messages), len(plan) - 1)]


def make_webshop(error_penalty: float = 0.0, **kwargs: Any) -> ToolUseWrapper:
    """`textgym/WebShop-v0`: `WebShopCore` with the browser tools."""
    core = WebShopCore(**kwargs)
    return ToolUseWrapper(core, core.browser.tools(), error_penalty=error_penalty)


def make_wikisearch(error_penalty: float = 0.0, **kwargs: Any) -> ToolUseWrapper:
    """`textgym/WikiSearch-v0`: `WikiSearchCore` with `search` and the browser tools."""
    core = WikiSearchCore(**kwargs)
    return ToolUseWrapper(core, [wiki_index().tool(), *core.browser.tools()], error_penalty=error_penalty)
