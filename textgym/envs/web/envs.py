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
from textgym.verifiers.answer_text import normalize_unicode, unwrap, without_closings
from textgym.verifiers.extraction import boxed_spans

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
    From the server's record of everything the episode's session bought (all its checkouts
    together), so an order is scored on all it holds, not on its best item. The instruction
    asks for one item under a budget, and these orders earn 0:
    - no order, or more than one item (a second unit of the right item, another item, or a
      second checkout: buying every candidate at once is not buying the one asked for);
    - a total over the budget;
    - an item of another category than the one asked for (WebShop's product-type factor).

    One item of the asked category within budget earns the share of the five attributes it
    matches (category, color, material, size, price ≤ budget): 0.4, plus 0.2 for each of
    color, material and size that is right; 1.0 for the item asked for. `reward/correct` is
    1.0 only for that order. `info["details"]["lost"]` says why an order lost reward ("3
    items ordered, 1 asked for", "total 57.20 over budget 21.00", "color blue ordered, red
    asked for"), and `details["refused"]` names the rule that zeroed it.

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
        """Score everything the episode's session bought against the task (the class's Rewards rule).

        Args:
            order: the site's `/shop/api/order` answer: `items` (each `{"product": id, "size": s}`,
                every checkout of the session together), `total` (dollars) and `orders`.

        Returns:
            `(reward, details)`: the reward in [0, 1] and `details` with `items` (count),
            `total` (dollars, from the catalogue's prices), `refused` (None, or why the order
            earns 0: "no_order", "several_items", "over_budget", "unknown_product",
            "wrong_category"), `lost` (a sentence per reason the order lost reward, e.g.
            "3 items ordered, 1 asked for", "total 412.00 over budget 300.00") and, for one
            item, `matched` (the attributes it matches), `product` and `size`.
        """
        assert self.task is not None
        want = self.task.metadata
        items = [i for i in order.get("items", []) if isinstance(i, dict)]
        products = [self._products.get(i.get("product", -1)) for i in items]  # None: not sold here
        total = round(sum(p.price for p in products if p is not None), 2)
        details: dict[str, Any] = {"items": len(items), "total": total, "matched": []}
        one = products[0] if len(items) == 1 else None
        size = str(items[0].get("size", "")) if one is not None else ""
        refusals: list[tuple[str, str]] = []  # (code, why) of every rule the order breaks
        if not items:
            refusals.append(("no_order", "no order placed"))
        if len(items) > 1:
            checkouts = int(order.get("orders", 1) or 1)
            where = f" in {checkouts} checkouts" if checkouts > 1 else ""
            refusals.append(("several_items", f"{len(items)} items ordered{where}, 1 asked for"))
        if total > want["budget"]:
            refusals.append(("over_budget", f"total {total:.2f} over budget {float(want['budget']):.2f}"))
        if len(items) == 1 and one is None:
            refusals.append(("unknown_product", f"product {items[0].get('product')!r} is not sold here"))
        if one is not None:
            details.update(product=one.id, size=size)
            if one.category != want["category"]:
                why = f"a {one.category} ordered, a {want['category']} asked for"
                refusals.append(("wrong_category", why))
        if refusals or one is None:
            return 0.0, {**details, "refused": refusals[0][0], "lost": [why for _, why in refusals]}
        got = {"category": one.category, "color": one.color, "material": one.material, "size": size}
        details["matched"] = [a for a in SHOP_ATTRIBUTES if a == "price" or got[a] == want[a]]
        lost = [f"{a} {got[a]} ordered, {want[a]} asked for" for a in got if got[a] != want[a]]
        return len(details["matched"]) / len(SHOP_ATTRIBUTES), {**details, "refused": None, "lost": lost}

    def respond(self, action: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Finish: read what this session bought (every checkout) from the site and score it (`score_order`).

        Raises:
            httpx.HTTPError: when the site does not answer the order API (it runs in this process).
        """
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
_PUNCTUATION = frozenset(string.punctuation)
_ANSWER_LINE_RE = re.compile(r"answer\s*(?:is|:)\s*(.+)", re.IGNORECASE)
_HEDGE_RE = re.compile(r"\b(?:or|either|maybe|perhaps|possibly|alternatively)\b", re.IGNORECASE)
_SENTENCE_END_RE = re.compile(r"[.!?\n]")


def normalize_answer(text: str) -> str:
    """SQuAD-style normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
    return " ".join(_NORMALIZE_RE.sub(" ", text).split())


def read_final_answer(reply: str) -> tuple[str, str | None]:
    r"""The final answer of a reply, or "" and why it names no single answer.

    1. The final answer is the last `\boxed{...}`; without a box, the last "answer is ..." or
       "answer: ..." (to the end of its line); without either, the whole reply.
    2. One answer per reply: boxes with different values, or (without a box) answer lines
       with different values, name none ("2 different answers given").
    3. No hedge around it: "or", "either", "maybe", "perhaps", "possibly" or
       "alternatively" in the final answer's own sentence before it or anywhere after it (but
       in a closing addressed to the reader: "Let me know if ... or ..."), or
       an "answer is/:" after the box that names something else, name none: the answer goes
       last, alone.

    Values are compared after `normalize_answer`. The reply is read after `normalize_unicode`
    (one normalisation for every answer reader), and a box's typesetting is dropped
    (`\boxed{\text{Paris}}` answers Paris: `answer_text.unwrap`). Regular expressions and
    a bounded brace scan (`extraction.boxed_spans`), linear in the reply's length.

    Returns:
        `(answer, None)`, or `("", reason)` when the reply names no single answer.

    Examples:
        >>> read_final_answer(r"Rimika is a city in Venido, so \boxed{Venido}.")
        ('Venido', None)
        >>> read_final_answer(r"\boxed{Venido}, or maybe Rimika")
        ('', 'another candidate after the answer (or, maybe, ...)')
        >>> read_final_answer("Answer: Venido\nAnswer: Rimika")
        ('', '2 different answers given')
        >>> read_final_answer(r"So the capital is \boxed{\text{Venido}}.")
        ('Venido', None)
    """
    reply = normalize_unicode(reply)
    boxes = [(unwrap(b), start, end) for b, start, end in boxed_spans(reply)]
    found = boxes or [(m.group(1), m.start(), m.end()) for m in _ANSWER_LINE_RE.finditer(reply)]
    if not found:
        return reply, None
    values = {normalize_answer(value) for value, _, _ in found} - {""}
    if len(values) > 1:
        return "", f"{len(values)} different answers given"
    answer, start, end = found[-1]
    sentence = _SENTENCE_END_RE.split(reply[max(0, start - 300) : start])[-1]
    tail = reply[end:]
    if _HEDGE_RE.search(sentence):
        return "", "alternatives in the answer's sentence (or, either, ...)"
    if _HEDGE_RE.search(without_closings(tail)):  # "Let me know if ... or ..." offers no answer
        return "", "another candidate after the answer (or, maybe, ...)"
    if boxes and any(
        normalize_answer(m.group(1)) not in ("", normalize_answer(answer)) and "\\boxed" not in m.group(1)
        for m in _ANSWER_LINE_RE.finditer(tail)
    ):
        return "", "another answer is given after the box"
    return answer, None


def extract_final_answer(reply: str) -> str:
    """The answer in a reply by `read_final_answer`'s rule; "" when it names no single answer."""
    return read_final_answer(reply)[0]


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
    answer after SQuAD-style normalisation, else 0.0. A reply that names several answers
    earns 0 (`read_final_answer`): boxes (or "answer:" lines) with different values, or a
    hedge ("or", "maybe", ...) in the answer's sentence or after it; `details["refused"]`
    says which.

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
        given, refused = read_final_answer(action)
        ok = refused is None and normalize_answer(given) == normalize_answer(self.task.answer)
        details: dict[str, Any] = {"extracted": given[:200], "refused": refused}
        return [], float(ok), True, {"reward/correct": float(ok), "details": details}

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
