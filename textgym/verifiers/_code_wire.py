"""The plain-data wire between the code judge and the candidate process (standard library only).

Shipped into the sandbox beside `_code_harness.py` (the trusted judge) and `_code_candidate.py`
(the process that runs the solution); each process imports its own copy. Messages are JSON
lines. A value crosses as JSON of exact built-in types, with a tag for what JSON lacks:

| Python | on the wire |
|---|---|
| None, bool, int, float, str | JSON null, true/false, integer, number (NaN/±Infinity), string |
| list | JSON array |
| tuple, set, frozenset, deque | `{"t": "tuple", "v": [items]}` (tag "set", "frozenset", "deque") |
| dict, Counter, OrderedDict | `{"t": "dict", "v": [[key, value], ...]}` (tag "counter", ...) |
| defaultdict of a built-in type | `{"t": "defaultdict", "f": "list", "v": [[key, value], ...]}` |
| any other mapping (ChainMap, a defaultdict of a lambda, a dict subclass) | as a dict of its items |
| bytes, complex | `{"t": "bytes", "v": "<hex>"}`, `{"t": "complex", "v": [re, im]}` |
| Fraction, Decimal | `{"t": "fraction", "v": [numerator, denominator]}`, `{"t": "decimal", "v": "<str>"}` |
| a namedtuple | as the tuple of its items (the judge holds a plain tuple) |
| a built-in type (`remove_datatype(xs, int)`) | `{"t": "type", "v": "int"}` |
| a regular-expression match | `{"t": "match", "v": [text, [groups], [start, end]]}`: a `Match` |
| an iterator or generator (`itertools.chain`, ...) | `{"t": "iter", "v": [items]}`, drawn (`MAX_ITEMS`) |
| an object of a class the task defines | `{"t": "obj", "c": "Node", "v": {attribute: value}}` |

(The last: MBPP's `Node` and `Pair`, which the test setup builds from the task's class.)

`encode` accepts exact types only (a subclass of int, an object whose `__eq__` always says
True, a class, a function: `WireError`; a namedtuple is sent as its items), but for mappings
and iterators of any type, which it sends as what they hold (their items, drawn in the
sending process), and `decode` builds fresh objects of the receiving process's own types, so
whatever the candidate sends, the judge holds only data it built. (A dict subclass whose
`==` always says True arrives as a plain dict of its items, and is compared as one.)
"""

from __future__ import annotations

import collections
import collections.abc
import decimal
import fractions
import json
import re
import sys
import types
from collections.abc import Callable
from typing import IO, Any

MAX_ITEMS = 1_000_000
"""Items drawn from a returned iterator before it counts as endless."""
MAX_LINE_BYTES = 64 * 1024 * 1024
"""The longest message either side reads; a longer one is an error."""
MAX_DEPTH = 400
"""Nesting depth of a value (containers and object attributes)."""

_SCALARS = (type(None), bool, int, float, str)
_TAGGED_SEQUENCES: dict[type, str] = {
    tuple: "tuple",
    set: "set",
    frozenset: "frozenset",
    collections.deque: "deque",
}
_FROM_TAG: dict[str, Callable[[Any], Any]] = {
    "tuple": tuple, "set": set, "frozenset": frozenset, "deque": collections.deque,
}  # fmt: skip
_TAGGED_MAPPINGS: dict[type, str] = {
    dict: "dict",
    collections.Counter: "counter",
    collections.OrderedDict: "ordereddict",
}
_MAPPING_OF_TAG: dict[str, Callable[..., Any]] = {
    "dict": dict, "counter": collections.Counter, "ordereddict": collections.OrderedDict,
}  # fmt: skip
_BUILTIN_TYPES: dict[str, type] = {
    t.__name__: t
    for t in (int, float, str, bool, bytes, list, tuple, dict, set, frozenset, complex, type(None))
}
"""Types that may cross by name (as an argument, or a defaultdict's factory)."""


class Match:
    """A regular-expression match as data: truthy, with `group`, `groups`, `span`, `start`, `end`.

    What the judge holds in place of the `re.Match` a solution returned (MBPP's
    `return re.search(...)`, tested as `assert f(x)` / `assert not f(x)`).
    """

    def __init__(self, text: str, groups: tuple[Any, ...], span: tuple[int, int]):
        self.text, self._groups, self._span = text, groups, span

    def group(self, index: int = 0) -> Any:
        """The whole match (0) or one of its groups."""
        return self.text if index == 0 else self._groups[index - 1]

    def groups(self) -> tuple[Any, ...]:
        """The match's groups."""
        return self._groups

    def span(self) -> tuple[int, int]:
        """(start, end) of the whole match."""
        return self._span

    def start(self) -> int:
        """Where the match starts."""
        return self._span[0]

    def end(self) -> int:
        """Where the match ends."""
        return self._span[1]

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"<Match span={self._span!r} match={self.text!r}>"


# digits of a huge int are data too (Python's default caps str(int) at 4,300 digits)
if hasattr(sys, "set_int_max_str_digits"):
    sys.set_int_max_str_digits(0)


class WireError(TypeError):
    """A value that is not plain data, or a message that is not well formed."""


def encode(value: Any, classes: frozenset[str] = frozenset(), depth: int = 0) -> Any:
    """`value` as JSON-ready plain data (see the module docstring).

    Args:
        value: what to send.
        classes: names of the task's classes whose objects may cross as attribute dicts.
        depth: the current nesting depth (callers leave it 0).

    Raises:
        WireError: naming the first part of `value` that is not plain data.
    """
    t = type(value)
    if t in _SCALARS:
        return value
    if depth > MAX_DEPTH:
        raise WireError(f"a value nested more than {MAX_DEPTH} levels deep")
    if t is list:
        return [encode(x, classes, depth + 1) for x in value]
    if t in _TAGGED_SEQUENCES:
        return {"t": _TAGGED_SEQUENCES[t], "v": [encode(x, classes, depth + 1) for x in value]}
    if t in _TAGGED_MAPPINGS or t is collections.defaultdict:
        items = [[encode(k, classes, depth + 1), encode(v, classes, depth + 1)] for k, v in value.items()]
        if t is not collections.defaultdict:
            return {"t": _TAGGED_MAPPINGS[t], "v": items}
        factory = value.default_factory
        name = getattr(factory, "__name__", "")
        if factory is not None and _BUILTIN_TYPES.get(name) is not factory:
            return {"t": "dict", "v": items}  # a lambda or other default cannot cross: its items do
        return {"t": "defaultdict", "f": None if factory is None else name, "v": items}
    if t is bytes:
        return {"t": "bytes", "v": value.hex()}
    if t is fractions.Fraction:
        return {"t": "fraction", "v": [int(value.numerator), int(value.denominator)]}
    if t is decimal.Decimal:
        return {"t": "decimal", "v": str(value)}
    if issubclass(t, tuple) and type(getattr(t, "_fields", None)) is tuple:  # a namedtuple: its items
        return {"t": "tuple", "v": [encode(x, classes, depth + 1) for x in tuple.__iter__(value)]}
    if t is complex:
        return {"t": "complex", "v": [value.real, value.imag]}
    if t is type and _BUILTIN_TYPES.get(getattr(value, "__name__", "")) is value:
        return {"t": "type", "v": getattr(value, "__name__", "")}
    if t is re.Match or t is Match:
        groups = [g if type(g) in (str, bytes, type(None)) else str(g) for g in value.groups()]
        text = value.group(0)
        if type(text) is not str or not all(type(g) in (str, type(None)) for g in groups):
            raise WireError("a match of bytes")
        return {"t": "match", "v": [text, groups, list(value.span())]}
    if t is types.GeneratorType or t in _ITERATOR_TYPES:
        return {"t": "iter", "v": _draw(value, classes, depth)}
    if t.__name__ in classes and isinstance(getattr(value, "__dict__", None), dict):
        attrs = {str(k): encode(v, classes, depth + 1) for k, v in vars(value).items() if type(k) is str}
        return {"t": "obj", "c": t.__name__, "v": attrs}
    if t is not type and isinstance(value, collections.abc.Mapping):  # ChainMap, a dict subclass, ...
        pairs = list(value.items())
        return {
            "t": "dict",
            "v": [[encode(k, classes, depth + 1), encode(v, classes, depth + 1)] for k, v in pairs],
        }
    if t is not type and isinstance(value, collections.abc.Iterator):  # itertools' iterators, ...
        return {"t": "iter", "v": _draw(value, classes, depth)}
    raise WireError(f"a {t.__name__}, not plain data (None, bool, numbers, str, bytes, containers of them)")


def _draw(iterator: Any, classes: frozenset[str], depth: int) -> list[Any]:
    """The encoded items of `iterator`, drawn to its end.

    Raises:
        WireError: after `MAX_ITEMS` items (an endless iterator), or on an item that is not plain data.
    """
    items: list[Any] = []
    for item in iterator:
        if len(items) >= MAX_ITEMS:
            raise WireError(f"an iterator of more than {MAX_ITEMS} items")
        items.append(encode(item, classes, depth + 1))
    return items


_EXAMPLE_ITERATORS: tuple[Any, ...] = (
    iter([]), iter(()), iter(""), iter(range(0)), iter({}), iter(set()), reversed([]), map(abs, []),
    filter(None, []), zip(), enumerate([]), iter({}.items()), iter({}.values()), iter(b""),
)  # fmt: skip
_ITERATOR_TYPES: frozenset[type] = frozenset(type(it) for it in _EXAMPLE_ITERATORS)
"""The built-in iterators (a list's, map, filter, zip, ...): drawn to the end like a generator."""


def decode(data: Any, make_object: Callable[[str, dict[str, Any]], Any] | None = None, depth: int = 0) -> Any:
    """A fresh value of this process's own built-in types from `encode`'s output.

    Args:
        data: JSON-decoded wire data.
        make_object: builds an object of a task class from its name and decoded attributes;
            None refuses objects.
        depth: the current nesting depth (callers leave it 0).

    Raises:
        WireError: on anything `encode` does not produce (an unknown tag, a JSON object
            without one, an unhashable key, an object where none is allowed).
    """
    t = type(data)
    if t in _SCALARS:
        return data
    if depth > MAX_DEPTH:
        raise WireError(f"a value nested more than {MAX_DEPTH} levels deep")
    if t is list:
        return [decode(x, make_object, depth + 1) for x in data]
    if t is not dict or type(data.get("t")) is not str:
        raise WireError(f"not a wire value: {type(data).__name__}")
    tag, v = data["t"], data.get("v")
    try:
        if tag in _FROM_TAG and type(v) is list:
            return _FROM_TAG[tag](decode(x, make_object, depth + 1) for x in v)
        if (tag in _MAPPING_OF_TAG or tag == "defaultdict") and type(v) is list:
            out: Any
            maker: Callable[[], Any]
            if tag == "defaultdict":
                factory = data.get("f")
                if factory is not None and factory not in _BUILTIN_TYPES:
                    raise WireError(f"a defaultdict of {factory!r}")
                out = collections.defaultdict(None if factory is None else _BUILTIN_TYPES[factory])
            else:
                maker = _MAPPING_OF_TAG[tag]
                out = maker()
            for pair in v:
                if type(pair) is not list or len(pair) != 2:
                    raise WireError("a dict item that is not a [key, value] pair")
                out[decode(pair[0], make_object, depth + 1)] = decode(pair[1], make_object, depth + 1)
            return out
        if tag == "bytes" and type(v) is str:
            return bytes.fromhex(v)
        if tag == "complex" and type(v) is list and len(v) == 2 and all(type(x) in (int, float) for x in v):
            return complex(v[0], v[1])
        if (
            tag == "fraction"
            and type(v) is list
            and len(v) == 2
            and all(type(x) is int for x in v)
            and v[1] > 0
        ):
            return fractions.Fraction(v[0], v[1])
        if tag == "decimal" and type(v) is str:
            return decimal.Decimal(v)
        if tag == "type" and type(v) is str and v in _BUILTIN_TYPES:
            return _BUILTIN_TYPES[v]
        if tag == "match" and type(v) is list and len(v) == 3:
            text, groups, span = v
            plain = type(groups) is list and all(type(g) in (str, type(None)) for g in groups)
            if (
                type(text) is str
                and plain
                and type(span) is list
                and len(span) == 2
                and all(type(x) is int for x in span)
            ):
                return Match(text, tuple(groups), (span[0], span[1]))
        if tag == "iter" and type(v) is list:
            return iter([decode(x, make_object, depth + 1) for x in v])
        if tag == "obj" and make_object is not None and type(v) is dict and type(data.get("c")) is str:
            attrs = {str(k): decode(x, make_object, depth + 1) for k, x in v.items()}
            return make_object(data["c"], attrs)
    except (TypeError, ValueError, ArithmeticError) as e:  # an unhashable key or set item, bad hex or decimal
        raise WireError(f"a malformed {tag}: {e}") from None
    raise WireError(f"not a wire value: tag {tag!r}")


def send(stream: IO[str], message: dict[str, Any]) -> None:
    """Write one message (a JSON line) and flush.

    Raises:
        WireError: when the message holds something JSON cannot write.
    """
    try:
        line = json.dumps(message, allow_nan=True, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as e:
        raise WireError(f"cannot send: {e}") from None
    stream.write(line + "\n")
    stream.flush()


def receive(stream: IO[str]) -> dict[str, Any] | None:
    """Read one message (a JSON object on one line); None at the end of the stream.

    Raises:
        WireError: on a line over `MAX_LINE_BYTES`, or one that is not a JSON object.
    """
    line = stream.readline(MAX_LINE_BYTES + 1)
    if not line:
        return None
    if not line.endswith("\n"):
        raise WireError(f"a message over {MAX_LINE_BYTES} bytes, or cut short")
    try:
        message = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise WireError(f"a message that is not JSON: {e}") from None
    if type(message) is not dict:
        raise WireError("a message that is not a JSON object")
    return message
