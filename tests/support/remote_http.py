"""A stand-in for :class:`adapters.remote_http.RemoteHttp` in tests of the agent: each call is
recorded and handed to a handler, which answers it (an :class:`Answer`) or raises the
adapter's errors, so retries, deadlines and the breaker run on a fake clock without sockets.
What the real one does on the wire is tested against scripted servers
(tests/unit/test_remote_http.py, tests/unit/test_remote_client.py)."""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from multidict import CIMultiDict, CIMultiDictProxy

from adapters.remote_http import Answer, AnswerTooLarge


@dataclass(frozen=True)
class Post:
    """One call through the remote HTTP, as the stand-in received it."""

    url: str
    """The service's base URL and the call's path, joined as the adapter joins them."""
    body: bytes
    headers: dict[str, str]
    timeout: float | None
    max_answer_bytes: int | None


Handler = Callable[[Post], Answer | Awaitable[Answer]]


class FakeRemoteHttp:
    """Calls to the services of ``urls`` (name: base URL), answered by ``handler``; an answer
    longer than the call's ``max_answer_bytes`` is refused as the adapter refuses it."""

    def __init__(self, handler: Handler, urls: Mapping[str, str]) -> None:
        self.handler = handler
        self.urls = dict(urls)
        self.posts: list[Post] = []

    async def post(
        self,
        service: str,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout: float | None = None,
        max_answer_bytes: int | None = None,
    ) -> Answer:
        url = f"{self.urls[service].rstrip('/')}/{path.lstrip('/')}"
        posted = Post(url, body, dict(headers), timeout, max_answer_bytes)
        self.posts.append(posted)
        reply = self.handler(posted)
        if inspect.isawaitable(reply):
            reply = await reply
        if max_answer_bytes is not None and len(reply.body) > max_answer_bytes:
            raise AnswerTooLarge(f"POST {url}: the answer exceeds {max_answer_bytes} bytes")
        return reply


def answer(status: int, body: bytes = b"", **headers: str) -> Answer:
    return Answer(status, CIMultiDictProxy(CIMultiDict(headers)), body)


def json_answer(status: int, body: object, **headers: str) -> Answer:
    return answer(status, json.dumps(body).encode(), **headers)
