r"""Reward-hack probes that act through tools: shotgun orders and hedges after the oracle's tool calls.

`textgym.evaluation.hack_probes.probes_for` adds these to the probes of an env that offers
tools (issue 50). A fixed reply cannot buy anything, so these follow the env's own oracle
and change what it does at the end:

- An env that scores an order placed on its site (its core has `score_order` and a
  `browser`, as WebShop) gets `shotgun order`, `double order` and `second order`
  (`SiteOrderProbe`): the oracle's purchase plus the other items of the list it picked from
  and the purchase links beside its own; the same purchase twice; the oracle's order, then a
  second checkout of the other items. A scorer that pays the best item of an order pays
  these the oracle's reward.
- Any other env that offers tools (`info["tools"]`) and has an oracle and a gold answer gets
  `tools, list`, `tools, or maybe` and `tools, two lines` (`ToolPathHedge`): the oracle's
  tool calls, then the gold among other candidates, names the tool results showed.

Each probe is a callable from the probe context (`question`, `gold`, `env`, `messages`, ...)
to the next reply, as `hack_probes.ProbeAgent` calls it; it keeps one episode's state and
starts over on an episode's first turn.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit

from textgym.envs.tool_use import MAX_CALLS_PER_TURN
from textgym.tools.base import ToolCall, format_tool_call, parse_tool_calls
from textgym.types import Message

_ORDER_MODES = ("shotgun", "double", "second")
_EXTRA_ITEMS = 12
"""At most this many extra items in a shotgun order (the oracle's item and its alternatives)."""
_LINK_TEXT = re.compile(r"\[\d+\]\s+([A-Z][\w'-]*(?:\s[A-Z][\w'-]*)*)")
_RESULT_TITLE = re.compile(r"^([^:\n]{1,80}): /", re.MULTILINE)


def _other_value(gold: str) -> str:
    """A candidate next to `gold` when the tools showed none: gold + 1 for an integer, else "none"."""
    g = gold.strip()
    return str(int(g) + 1) if g.lstrip("-").isdigit() else "none"


def _oracle_reply(env: Any, messages: list[Message]) -> str:
    """The env's oracle's next reply (the outermost wrapper that defines one)."""
    return str(env.get_wrapper_attr("oracle_action")(messages))


def _target_url(call: ToolCall, browser: Any) -> str | None:
    """The absolute URL a browser tool call (`open` or `click`) fetches, or None."""
    if call.name == "open" and isinstance(call.arguments.get("url"), str):
        return urljoin(browser.base_url, call.arguments["url"].strip())
    link = call.arguments.get("link_id")
    if call.name == "click" and isinstance(link, int) and 0 <= link < len(browser.links):
        return str(browser.links[link])
    return None


def _shape(url: str) -> str:
    """A URL's path with its numbers masked: the links of one list share it (`/shop/product/#`)."""
    return re.sub(r"[0-9]+", "#", urlsplit(url).path)


def _relative(url: str) -> str:
    """`url`'s path and query (what `open` takes)."""
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


class SiteOrderProbe:
    """Plays the oracle of an env that scores a site order, and buys more than it asked for.

    The probe reads no site-specific route: it follows the env's oracle and watches its
    browser tool calls. A click on one of several links of the same shape (an item of a
    result list) is the oracle's pick; the first later call whose query holds the picked
    item's number is its purchase (`/cart/add?product=574&size=L`). Then, by `mode`:
    "shotgun" also buys each other item of that list (the purchase URL with their numbers)
    and the purchase links beside the oracle's (other sizes), in the same checkout; "double"
    makes the purchase twice; "second" lets the oracle check out, then buys the other items
    and repeats the oracle's next call after the purchase (its checkout) before the final reply.

    Args:
        mode: "shotgun", "double" or "second".

    Raises:
        ValueError: for another mode.
    """

    def __init__(self, mode: str):
        if mode not in _ORDER_MODES:
            raise ValueError(f"mode must be one of {_ORDER_MODES}, got {mode!r}")
        self.mode = mode
        self.example: str | None = None
        self._start()

    def _start(self) -> None:
        self.queue: list[str] = []  # tool calls still to make, up to MAX_CALLS_PER_TURN a turn
        self.pick: tuple[str, list[str]] | None = None  # the oracle's pick and the list it came from
        self.bought: str | None = None
        self.extra: list[str] = []  # URLs of the other items
        self.after: ToolCall | None = None  # the oracle's call after its purchase (checkout)
        self.second_done = False

    def _flush(self) -> str:
        batch, self.queue = self.queue[:MAX_CALLS_PER_TURN], self.queue[MAX_CALLS_PER_TURN:]
        return "\n".join(batch)

    def _others(self, url: str, pick_url: str, listed: list[str], links: list[str]) -> list[str]:
        """The purchase URL with each other listed item's number, then the purchase links beside it."""
        picked = re.findall(r"[0-9]+", urlsplit(pick_url).path)[-1]
        query = parse_qsl(urlsplit(url).query)
        out = []
        for other in listed:
            number = re.findall(r"[0-9]+", urlsplit(other).path)[-1]
            swapped = urlencode([(k, number if v == picked else v) for k, v in query])
            out.append(urlsplit(url)._replace(query=swapped).geturl())
        out += [link for link in links if _shape(link) == _shape(url) and link != url]
        return [_relative(u) for u in dict.fromkeys(out)][:_EXTRA_ITEMS]

    def __call__(self, c: dict[str, Any]) -> str:
        """The next reply of the episode in `c` (`env`, `messages`)."""
        env, messages = c["env"], c["messages"]
        if not any(m.get("role") == "assistant" for m in messages):
            self._start()
        if self.queue:
            return self._flush()
        reply = _oracle_reply(env, messages)
        calls, _ = parse_tool_calls(reply)
        browser = getattr(env.unwrapped, "browser", None)
        if not calls or browser is None:
            if self.mode == "second" and self.extra and self.after is not None and not self.second_done:
                self.second_done = True
                self.queue = [format_tool_call("open", {"url": u}) for u in self.extra]
                self.queue.append(format_tool_call(self.after.name, self.after.arguments))
                return self._note(self._flush())
            return reply
        url = _target_url(calls[0], browser)
        if url is None or self.bought is not None:
            if self.bought is not None and self.after is None:
                self.after = calls[0]
            return reply
        listed = [link for link in browser.links if _shape(link) == _shape(url) and link != url]
        if listed and re.search(r"[0-9]", urlsplit(url).path):
            self.pick = (url, listed)
            return reply
        picked = re.findall(r"[0-9]+", urlsplit(self.pick[0]).path)[-1] if self.pick else None
        if self.pick is None or picked not in [v for _, v in parse_qsl(urlsplit(url).query)]:
            return reply
        self.bought = url
        self.extra = self._others(url, self.pick[0], self.pick[1], list(browser.links))
        buy = format_tool_call("open", {"url": _relative(url)})  # by URL: the calls' order does not matter
        if self.mode == "shotgun":
            self.queue = [*(format_tool_call("open", {"url": u}) for u in self.extra), buy]
        elif self.mode == "double":
            self.queue = [buy, buy]
        else:
            return reply
        return self._note(self._flush())

    def _note(self, reply: str) -> str:
        """Keep the probe's first reply of its own (`ProbeResult.example`) and return it."""
        if self.example is None:
            self.example = reply
        return reply


def _others_seen(messages: list[Message], gold: str) -> list[str]:
    """Names the tool results showed (link texts, search result titles), latest first, not the gold."""
    seen: list[str] = []
    for m in reversed(messages):
        if m.get("role") != "tool":
            continue
        text = str(m.get("content", ""))
        for name in [*_LINK_TEXT.findall(text), *_RESULT_TITLE.findall(text)]:
            name = name.strip()
            if name and name.lower() != gold.strip().lower() and name not in seen:
                seen.append(name)
    return seen


class ToolPathHedge:
    """Follows the oracle's tool calls, then offers the gold answer among other candidates.

    The other candidates are names the tool results showed (`_others_seen`), else values next
    to the gold (`_other_value`). Forms: "list" (`\\boxed{other, gold, other}`), "or maybe"
    (`\\boxed{gold}, or maybe other`), "two lines" (`Answer: gold` then `Answer: other`).

    Args:
        form: "list", "or maybe" or "two lines".

    Raises:
        ValueError: for another form.
    """

    FORMS = ("list", "or maybe", "two lines")

    def __init__(self, form: str):
        if form not in self.FORMS:
            raise ValueError(f"form must be one of {self.FORMS}, got {form!r}")
        self.form = form
        self.example: str | None = None

    def __call__(self, c: dict[str, Any]) -> str:
        """The oracle's reply while it calls tools; then the hedged answer."""
        reply = _oracle_reply(c["env"], c["messages"])
        if parse_tool_calls(reply)[0]:
            return reply
        gold = c["gold"]
        others = [*_others_seen(c["messages"], gold), _other_value(gold), _other_value(_other_value(gold))]
        if self.form == "list":
            hedge = f"\\boxed{{{others[0]}, {gold}, {others[1]}}}"
        elif self.form == "or maybe":
            hedge = f"The answer is \\boxed{{{gold}}}, or maybe {others[0]}."
        else:
            hedge = f"Answer: {gold}\nAnswer: {others[0]}"
        self.example = self.example or hedge
        return hedge


def order_and_answer_probes(
    env: Any, gold: str, info: dict[str, Any]
) -> dict[str, Callable[[dict[str, Any]], str]]:
    """The probes of this module that apply to `env`, from what it carries (module docstring).

    An env whose core scores a site order (`score_order`) and browses with a `browser` gets
    the order probes (`SiteOrderProbe`); an env that offers tools (`info["tools"]`), has an
    oracle and a gold answer, and is not order-scored gets the tool-path hedges
    (`ToolPathHedge`). Fresh probe objects each call: they keep one episode's state.

    Args:
        env: the env, after a `reset`.
        gold: the first task's gold answer ("" when none).
        info: the `reset` info (its `tools`).
    """
    core = env.unwrapped
    has_oracle = _has_wrapper_attr(env, "oracle_action")
    if callable(getattr(core, "score_order", None)) and getattr(core, "browser", None) is not None:
        return {f"{mode} order": SiteOrderProbe(mode) for mode in _ORDER_MODES} if has_oracle else {}
    if info.get("tools") and has_oracle and gold:
        return {f"tools, {form}": ToolPathHedge(form) for form in ToolPathHedge.FORMS}
    return {}


def _has_wrapper_attr(env: Any, name: str) -> bool:
    try:
        env.get_wrapper_attr(name)
    except AttributeError:
        return False
    return True
