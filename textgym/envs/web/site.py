"""The local web site behind `textgym/WebShop-v0` and `textgym/WikiSearch-v0`.

One FastAPI app serves a generated shop (`/shop/...`) and a generated wiki (`/wiki/...`).
`SiteServer.acquire()` starts it once per process with uvicorn on 127.0.0.1 and a free
port (in a daemon thread) and counts its users; `release()` stops it when the last env
closes. Shop sessions are a `session` cookie; every checkout of a session is kept in
memory, and the env reads back all that the session bought from `/shop/api/order`.
"""

from __future__ import annotations

import html
import socket
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from fastapi import Cookie, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse

# ----------------------------------------------------------------------------- the shop
CATEGORIES = ("shirt", "t-shirt", "sweater", "jacket", "pants", "shorts", "dress", "skirt", "hat", "socks")
COLORS = ("red", "blue", "green", "black", "white", "gray", "yellow", "purple", "orange", "pink")
MATERIALS = ("cotton", "wool", "linen", "polyester", "denim", "silk")
SIZES = ("XS", "S", "M", "L", "XL")
BRANDS = ("Acme", "Northwind", "Bluebird", "Oakridge", "Solstice", "Harbor", "Pinecrest", "Vela")
SHOP_SEED = 1234
N_PRODUCTS = 600


@dataclass(frozen=True)
class Product:
    """One catalogue item; `sizes` maps each offered size to its stock count."""

    id: int
    name: str
    category: str
    color: str
    material: str
    brand: str
    price: float
    sizes: dict[str, int]


@lru_cache(maxsize=1)
def catalogue() -> tuple[Product, ...]:
    """The shop's products, generated from `SHOP_SEED` (the same on every machine)."""
    rng = np.random.default_rng(SHOP_SEED)
    products = []
    for i in range(N_PRODUCTS):
        cat = CATEGORIES[int(rng.integers(len(CATEGORIES)))]
        color = COLORS[int(rng.integers(len(COLORS)))]
        material = MATERIALS[int(rng.integers(len(MATERIALS)))]
        brand = BRANDS[int(rng.integers(len(BRANDS)))]
        price = round(float(rng.uniform(5, 90)), 2)
        offered = [s for s in SIZES if rng.random() < 0.7] or ["M"]
        sizes = {s: int(rng.integers(0, 6)) for s in offered}
        name = f"{brand} {color.title()} {material.title()} {cat.title()}"
        products.append(Product(i, name, cat, color, material, brand, price, sizes))
    return tuple(products)


def _page(title: str, body: str) -> HTMLResponse:
    return HTMLResponse(
        f"<!doctype html><html><head><title>{html.escape(title)}</title></head><body>{body}</body></html>"
    )


def _matches(p: Product, words: list[str]) -> int:
    hay = f"{p.name} {p.category} {p.color} {p.material} {p.brand}".lower()
    return sum(1 for w in words if w in hay)


# ----------------------------------------------------------------------------- the wiki
_SYLLABLES = ("ka", "lo", "mi", "ra", "ve", "to", "sa", "ne", "zu", "pe", "ri", "do", "fa", "lu", "ni", "bo")
WIKI_SEED = 4321
N_COUNTRIES, N_CITIES, N_PEOPLE = 24, 80, 240
FIELDS = ("chemist", "painter", "composer", "architect", "poet", "astronomer", "engineer", "historian")


def _name(rng: np.random.Generator, parts: int) -> str:
    return "".join(_SYLLABLES[int(rng.integers(len(_SYLLABLES)))] for _ in range(parts)).title()


@dataclass(frozen=True)
class WikiPage:
    """One wiki page: its slug, title, kind ("person", "city", "country") and facts."""

    slug: str
    title: str
    kind: str
    facts: dict[str, str]
    text: str


@lru_cache(maxsize=1)
def wiki() -> dict[str, WikiPage]:
    """The wiki: fictional countries, cities and people, generated from `WIKI_SEED`.

    A person's page names their birth city (a link) but not its country; a city's page names
    its country (a link); a country's page names its capital (a link). So "in which country
    was X born?" takes a search and two pages.
    """
    rng = np.random.default_rng(WIKI_SEED)
    used: set[str] = set()

    def unique(parts: int, first: int = 0) -> str:
        while True:  # 16**parts (x 16**first) candidates: far more than the names drawn
            n = _name(rng, parts) if not first else f"{_name(rng, first)} {_name(rng, parts)}"
            if n not in used:
                used.add(n)
                return n

    countries = [unique(3) for _ in range(N_COUNTRIES)]
    cities = [(unique(3), countries[int(rng.integers(N_COUNTRIES))]) for _ in range(N_CITIES)]
    pages: dict[str, WikiPage] = {}
    capitals: dict[str, str] = {}
    for city, country in cities:
        capitals.setdefault(country, city)
    for country in countries:
        capital = capitals.get(country) or cities[int(rng.integers(N_CITIES))][0]
        capitals[country] = capital
    for city, country in cities:
        slug = city.lower()
        text = (
            f"{city} is a city in [[{country}]]. It lies on the river {_name(rng, 2)} and is known for its "
            f"{['markets', 'bridges', 'festivals', 'libraries'][int(rng.integers(4))]}."
        )
        pages[slug] = WikiPage(slug, city, "city", {"country": country}, text)
    for country in countries:
        slug = country.lower()
        text = f"{country} is a country. Its capital is [[{capitals[country]}]]."
        pages[slug] = WikiPage(slug, country, "country", {"capital": capitals[country]}, text)
    for _ in range(N_PEOPLE):
        person = unique(3, first=2)
        city, _country = cities[int(rng.integers(N_CITIES))]
        field = FIELDS[int(rng.integers(len(FIELDS)))]
        year = int(rng.integers(1700, 1990))
        slug = person.lower().replace(" ", "_")
        text = f"{person} (born {year}) is a {field}. {person.split()[0]} was born in [[{city}]]."
        pages[slug] = WikiPage(
            slug, person, "person", {"city": city, "field": field, "year": str(year)}, text
        )
    return pages


def _wiki_html(text: str) -> str:
    out, rest = [], text
    while "[[" in rest:
        before, _, after = rest.partition("[[")
        target, _, rest = after.partition("]]")
        out.append(html.escape(before))
        out.append(
            f'<a href="/wiki/{html.escape(target.lower().replace(" ", "_"))}">{html.escape(target)}</a>'
        )
    out.append(html.escape(rest))
    return "".join(out)


# ----------------------------------------------------------------------------- the app
# long: the site's routes (shop, cart, orders, wiki) are closures over one catalogue, its carts and lock
def build_app() -> FastAPI:
    """The FastAPI app: shop pages, the order API, wiki pages.

    `GET /shop/api/order?session=S` answers what session S bought, all its checkouts together:
    `{"items": [{"product": id, "size": "L"}, ...], "total": dollars, "orders": checkouts}`
    (`{"items": [], "total": 0, "orders": 0}` before any checkout). A second checkout adds to
    what the session bought; it does not replace the first.
    """
    app = FastAPI(title="textgym web site", docs_url=None, redoc_url=None, openapi_url=None)
    carts: dict[str, list[tuple[int, str]]] = {}
    orders: dict[str, list[dict[str, Any]]] = {}  # every checkout of a session, in order
    lock = threading.Lock()
    by_id = {p.id: p for p in catalogue()}

    @app.get("/", response_class=HTMLResponse)
    def home() -> HTMLResponse:
        return _page(
            "textgym web",
            '<h1>textgym web</h1><p><a href="/shop">Shop</a></p><p><a href="/wiki">Wiki</a></p>',
        )

    @app.get("/shop", response_class=HTMLResponse)
    def shop_home() -> HTMLResponse:
        cats = " ".join(f'<a href="/shop/search?q={c}">{c}</a>' for c in CATEGORIES)
        return _page(
            "Shop",
            "<h1>Shop</h1><p>Search the catalogue: open /shop/search?q=your+words "
            f"(e.g. /shop/search?q=red+cotton+shirt).</p><p>Categories: {cats}</p>"
            '<p><a href="/shop/cart">Cart</a></p>',
        )

    @app.get("/shop/search", response_class=HTMLResponse)
    def search(q: str = Query("", max_length=200), page: int = Query(1, ge=1, le=50)) -> HTMLResponse:
        words = [w for w in q.lower().replace("+", " ").split() if w]
        scored = sorted(
            ((_matches(p, words), -p.id, p) for p in catalogue() if words),
            key=lambda t: (t[0], t[1]),
            reverse=True,
        )
        hits = [p for s, _, p in scored if s > 0]
        start = (page - 1) * 10
        rows = "".join(
            f'<li><a href="/shop/product/{p.id}">{html.escape(p.name)}</a> ${p.price:.2f}</li>'
            for p in hits[start : start + 10]
        )
        more = (
            f'<p><a href="/shop/search?q={html.escape("+".join(words))}&page={page + 1}">Next page</a></p>'
            if start + 10 < len(hits)
            else ""
        )
        return _page(
            f"Search: {q}", f"<h1>{len(hits)} results for {html.escape(q)}</h1><ol>{rows}</ol>{more}"
        )

    @app.get("/shop/product/{pid}", response_class=HTMLResponse)
    def product(pid: int) -> HTMLResponse:
        p = by_id.get(pid)
        if p is None:
            raise HTTPException(404, f"no product {pid}")
        opts = " ".join(
            f'<a href="/shop/cart/add?product={p.id}&size={s}">Add size {s}</a> ({n} in stock)'
            if n
            else f"size {s} (sold out)"
            for s, n in p.sizes.items()
        )
        facts = f"<p>Category: {p.category}. Color: {p.color}. Material: {p.material}. Brand: {p.brand}.</p>"
        return _page(
            p.name, f"<h1>{html.escape(p.name)}</h1><p>Price: ${p.price:.2f}</p>{facts}<p>{opts}</p>"
        )

    @app.get("/shop/cart/add", response_class=HTMLResponse)
    def cart_add(product: int, size: str, session: str = Cookie("")) -> HTMLResponse:
        p = by_id.get(product)
        if p is None or size not in p.sizes or p.sizes[size] == 0:
            raise HTTPException(400, "that product or size is not available")
        with lock:
            carts.setdefault(session, []).append((p.id, size))
        return _page(
            "Cart", f'<p>Added {html.escape(p.name)} (size {size}).</p><p><a href="/shop/cart">Cart</a></p>'
        )

    @app.get("/shop/cart", response_class=HTMLResponse)
    def cart(session: str = Cookie("")) -> HTMLResponse:
        items = carts.get(session, [])
        rows = "".join(
            f"<li>{html.escape(by_id[i].name)}, size {s}, ${by_id[i].price:.2f}</li>" for i, s in items
        )
        checkout = '<p><a href="/shop/checkout">Checkout</a></p>' if items else "<p>The cart is empty.</p>"
        return _page("Cart", f"<h1>Cart</h1><ul>{rows}</ul>{checkout}")

    @app.get("/shop/checkout", response_class=HTMLResponse)
    def checkout(session: str = Cookie("")) -> HTMLResponse:
        with lock:
            items = carts.pop(session, [])
            if not items:
                raise HTTPException(400, "the cart is empty")
            placed = {
                "items": [{"product": i, "size": s} for i, s in items],
                "total": round(sum(by_id[i].price for i, _ in items), 2),
                "time": time.time(),
            }
            orders.setdefault(session, []).append(placed)
        return _page("Order placed", f"<h1>Order placed</h1><p>Total ${placed['total']:.2f}.</p>")

    @app.get("/shop/api/order")
    def order(session: str = Query(...)) -> dict[str, Any]:
        # what the session bought: the items of all its checkouts, their total, how many checkouts
        with lock:
            placed = list(orders.get(session, []))
        return {
            "items": [item for o in placed for item in o["items"]],
            "total": round(sum(o["total"] for o in placed), 2),
            "orders": len(placed),
        }

    @app.get("/wiki", response_class=HTMLResponse)
    def wiki_home() -> HTMLResponse:
        return _page(
            "Wiki", "<h1>Wiki</h1><p>Pages live at /wiki/page_name; use the search tool to find them.</p>"
        )

    @app.get("/wiki/{slug}", response_class=HTMLResponse)
    def wiki_page(slug: str) -> HTMLResponse:
        page = wiki().get(slug.lower())
        if page is None:
            raise HTTPException(404, f"no wiki page {slug!r}")
        return _page(page.title, f"<h1>{html.escape(page.title)}</h1><p>{_wiki_html(page.text)}</p>")

    return app


class SiteServer:
    """The process-wide server of `build_app()` on 127.0.0.1, shared by reference count."""

    _lock = threading.Lock()
    _users = 0
    _server: Any = None
    _thread: threading.Thread | None = None
    url = ""

    @classmethod
    def acquire(cls) -> str:
        """Start the server if needed and count one more user; return its base URL ("http://127.0.0.1:PORT").

        Raises:
            RuntimeError: when the server does not come up within 20 s.
        """
        import uvicorn

        with cls._lock:
            if cls._users == 0:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
                config = uvicorn.Config(build_app(), log_level="warning", access_log=False, lifespan="off")
                server = uvicorn.Server(config)
                thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
                thread.start()
                deadline = time.monotonic() + 20
                while not server.started and thread.is_alive() and time.monotonic() < deadline:
                    time.sleep(0.01)
                if not server.started:
                    raise RuntimeError("the textgym web site did not start on 127.0.0.1")
                cls._server, cls._thread, cls.url = server, thread, f"http://127.0.0.1:{port}"
            cls._users += 1
            return cls.url

    @classmethod
    def release(cls) -> None:
        """Count one user less; stop the server when none is left."""
        with cls._lock:
            if cls._users == 0:
                return
            cls._users -= 1
            if cls._users == 0 and cls._server is not None:
                cls._server.should_exit = True
                if cls._thread is not None:
                    cls._thread.join(timeout=10)
                cls._server, cls._thread, cls.url = None, None, ""

    @classmethod
    def running(cls) -> bool:
        """Whether the server is up."""
        return cls._server is not None
