"""One exchange without I/O (core.http11.Exchange): the request bytes it writes, and how it
reads an answer however the bytes are cut, with the cases llhttp leaves to its caller."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.http11 import MAX_HEAD_BYTES, Closed, Exchange, TransportError

FIELDS = [("Host", "example:80"), ("Content-Length", "2")]


def read(answer: bytes, *, method: str = "GET", cuts: list[int] = (), **kwargs):
    """Feed ``answer`` cut at ``cuts``; (answer, reusable)."""
    exchange = Exchange(**kwargs)
    exchange.start(method, "/t", [("Host", "example:80")], None)
    start = 0
    for end in [*sorted(cuts), len(answer)]:
        if end > start:
            exchange.feed(answer[start:end])
            start = end
    assert exchange.advance()
    return exchange.finish()


def test_the_request_is_its_head_then_its_body() -> None:
    data = Exchange().start("POST", "/a/b?c=d%20e", FIELDS, b"{}")
    assert data == b"POST /a/b?c=d%20e HTTP/1.1\r\nHost: example:80\r\nContent-Length: 2\r\n\r\n{}"


@pytest.mark.parametrize(
    ("method", "target", "fields"),
    [
        ("GET", "/t", [("X-Injected", "a\r\nEvil: 1")]),
        ("GET", "/t", [("X-Null", "a\x00b")]),
        ("GET", "/t", [("Bad Name", "v")]),
        ("GET", "/t", [("X-Text", "caf\u00e9")]),
        ("GET", "/a b", []),
        ("G ET", "/t", []),
    ],
)
def test_a_request_that_cannot_be_sent_is_refused_before_a_byte_goes(method, target, fields):
    with pytest.raises(TransportError) as caught:
        Exchange().start(method, target, fields, None)
    assert caught.value.kind == "send"


CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\nx-a: 2\r\n\r\n"
    b"3;ext=1\r\nabc\r\n4\r\ndefg\r\n0\r\nTrailer: t\r\n\r\n"
)
LENGTH = (
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created Here\r\nContent-Length: 7\r\n\r\nabcdefg"
)


@given(st.sampled_from([CHUNKED, LENGTH]), st.lists(st.integers(0, len(CHUNKED)), max_size=8))
def test_an_answer_reads_the_same_however_its_bytes_are_cut(answer: bytes, cuts: list[int]):
    parsed, reusable = read(answer, cuts=[c for c in cuts if c < len(answer)])
    assert parsed.content == b"abcdefg"
    assert reusable
    if answer is CHUNKED:
        assert (parsed.status_code, parsed.reason_phrase) == (200, "OK")
        assert parsed.headers["x-a"] == "1, 2"  # repeated fields joined, names in any case
    else:
        assert (parsed.status_code, parsed.reason_phrase) == (201, "Created Here")


def test_the_answer_to_head_has_no_body_and_its_connection_is_not_reused() -> None:
    parsed, reusable = read(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n", method="HEAD")
    assert (parsed.status_code, parsed.content, reusable) == (200, b"", False)


def test_bytes_after_the_answer_make_its_connection_not_reusable() -> None:
    for extra in (b"HTTP/1.1 200 OK\r\n", b"garbage"):
        parsed, reusable = read(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx" + extra)
        assert (parsed.content, reusable) == (b"x", False)


def test_a_body_delimited_by_the_end_of_the_connection() -> None:
    exchange = Exchange()
    exchange.feed(b"HTTP/1.1 200 OK\r\n\r\nto the end")
    assert not exchange.advance()
    exchange.feed(b"")
    assert exchange.advance()
    parsed, reusable = exchange.finish()
    assert (parsed.content, reusable) == (b"to the end", False)


def test_an_answer_cut_short_is_closed() -> None:
    exchange = Exchange()
    exchange.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc")
    assert not exchange.advance()
    exchange.feed(b"")
    with pytest.raises(Closed):
        exchange.advance()


def test_a_head_longer_than_the_limit_is_refused_as_it_arrives() -> None:
    exchange = Exchange()
    exchange.feed(b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * MAX_HEAD_BYTES)
    with pytest.raises(TransportError, match="head is longer") as caught:
        exchange.advance()
    assert caught.value.kind == "protocol"


def test_a_body_longer_than_the_limit_fails_the_exchange() -> None:
    exchange = Exchange(max_body_bytes=4)
    exchange.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n123456789")
    with pytest.raises(TransportError) as caught:
        exchange.advance()
    assert caught.value.kind == "too_large"


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad\x01Name: 1\r\n\r\n",
    ],
)
def test_a_malformed_answer_is_a_protocol_error(answer: bytes) -> None:
    exchange = Exchange()
    exchange.feed(answer)
    with pytest.raises(TransportError) as caught:
        exchange.advance()
    assert caught.value.kind == "protocol"
