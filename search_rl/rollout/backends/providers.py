"""One adapter per web search API: how to ask for the top-k results of a query, and how to read the answer.

Formats (the providers' documentation):
- Serper: ``POST https://google.serper.dev/search``, header ``X-API-KEY``, body ``{"q", "num", "gl", "hl"}``;
  answer ``{"searchParameters": {...}, "organic": [{"title", "link", "snippet", "position"}, ...], ...}``.
- Brave: ``GET https://api.search.brave.com/res/v1/web/search?q=&count=&country=&search_lang=``, header
  ``X-Subscription-Token``; answer ``{"type": "search", "web": {"results": [{"title", "url", "description"}]}}``
  (``web`` is absent when nothing matched; descriptions carry ``<strong>`` highlights). Rate-limited answers are
  429 with ``X-RateLimit-Reset: <s to the per-second window>, <s to the monthly one>``.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from search_rl.datatypes import Passage

_TAG = re.compile(r"<[^>]+>")


def strip_tags(text: str) -> str:
    """Plain text of a snippet with HTML highlights.

    >>> strip_tags("The <strong>Eiffel</strong> Tower &amp; more")
    'The Eiffel Tower & more'
    """
    return " ".join(html.unescape(_TAG.sub("", text)).split())


class Provider(Protocol):
    """A web search API."""

    @property
    def name(self) -> str: ...

    @property
    def endpoint(self) -> str: ...

    def request(self, client: httpx.AsyncClient, endpoint: str, query: str, k: int, key: str) -> httpx.Request: ...

    def parse(self, body: Any, k: int) -> list[Passage]: ...

    def wait_s(self, resp: httpx.Response) -> float | None: ...


def _hits(items: Any, where: str, title: str, link: str, text: str, k: int) -> list[Passage]:
    """Passages from a list of result objects (``ValueError`` when it is not one)."""
    if not isinstance(items, list):
        raise ValueError(f"{where} is {type(items).__name__}, not a list")
    out = []
    for item in items[:k]:
        if not isinstance(item, dict) or not isinstance(item.get(link), str):
            raise ValueError(f"a result of {where} has no {link!r} string: {str(item)[:120]}")
        out.append(
            Passage(id=item[link], title=strip_tags(str(item.get(title, ""))), text=strip_tags(str(item.get(text, ""))))
        )
    return out


def _retry_after(resp: httpx.Response) -> float | None:
    try:
        return float(resp.headers["retry-after"])
    except (KeyError, ValueError):
        return None


@dataclass(frozen=True)
class Serper:
    """google.serper.dev (Google results)."""

    country: str = "us"
    language: str = "en"
    name: str = "serper"
    endpoint: str = "https://google.serper.dev/search"

    def request(self, client: httpx.AsyncClient, endpoint: str, query: str, k: int, key: str) -> httpx.Request:
        body = {"q": query, "num": k, "gl": self.country, "hl": self.language}
        return client.build_request("POST", endpoint, json=body, headers={"X-API-KEY": key})

    def parse(self, body: Any, k: int) -> list[Passage]:
        if not isinstance(body, dict):
            raise ValueError(f"the answer is {type(body).__name__}, not an object")
        return _hits(body.get("organic", []), "organic", "title", "link", "snippet", k)

    def wait_s(self, resp: httpx.Response) -> float | None:
        return _retry_after(resp)


@dataclass(frozen=True)
class Brave:
    """api.search.brave.com (Brave's own index)."""

    country: str = "us"
    language: str = "en"
    name: str = "brave"
    endpoint: str = "https://api.search.brave.com/res/v1/web/search"

    def request(self, client: httpx.AsyncClient, endpoint: str, query: str, k: int, key: str) -> httpx.Request:
        params: dict[str, str | int] = {
            "q": query,
            "count": min(k, 20),
            "country": self.country,
            "search_lang": self.language,
        }
        headers = {"X-Subscription-Token": key, "Accept": "application/json"}
        return client.build_request("GET", endpoint, params=params, headers=headers)

    def parse(self, body: Any, k: int) -> list[Passage]:
        if not isinstance(body, dict):
            raise ValueError(f"the answer is {type(body).__name__}, not an object")
        web = body.get("web", {"results": []})
        if not isinstance(web, dict):
            raise ValueError(f"web is {type(web).__name__}, not an object")
        return _hits(web.get("results", []), "web.results", "title", "url", "description", k)

    def wait_s(self, resp: httpx.Response) -> float | None:
        reset = resp.headers.get("x-ratelimit-reset")
        if reset:
            try:
                return float(reset.split(",")[0])
            except ValueError:
                pass
        return _retry_after(resp)


def provider(name: str, country: str, language: str) -> Provider:
    """The adapter of ``retriever.web.provider``."""
    providers: dict[str, type[Serper] | type[Brave]] = {"serper": Serper, "brave": Brave}
    if name not in providers:
        raise ValueError(f"retriever.web.provider must be one of {sorted(providers)}, got {name!r}")
    return providers[name](country=country, language=language)
