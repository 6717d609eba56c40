"""Web environments served by a real local HTTP server: WebShop and WikiSearch."""

from textgym.envs.web.envs import WebShopCore, WikiSearchCore, make_webshop, make_wikisearch
from textgym.envs.web.site import SiteServer

__all__ = ["SiteServer", "WebShopCore", "WikiSearchCore", "make_webshop", "make_wikisearch"]
