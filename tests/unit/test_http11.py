"""core.http11 against a real asyncio server, started in the test, that answers
as scripted: framing (Content-Length, chunked, to the end of the connection), kept-alive reuse,
connections the server closes or writes to while idle, timeouts, cancellation, malformed
answers, TLS."""

from __future__ import annotations

import asyncio
import inspect
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from core.http11 import ConnectionPool, TransportError

pytestmark = pytest.mark.anyio

# What the server does with one request: the bytes to write back and whether to close the
# connection afterwards (a coroutine may compute them); None: close without answering.
Reply = tuple[bytes, bool] | None
Script = Callable[[bytes, int], Reply | Awaitable[Reply]]


@dataclass
class Server:
    """Accepts connections and answers each request from ``script``."""

    script: Script
    tls: ssl.SSLContext | None = None
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def start(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                reply = self.script(request, len(self.requests))
                if inspect.isawaitable(reply):
                    reply = await reply
                if reply is None:
                    return
                data, close = reply
                writer.write(data)
                await writer.drain()
                if close:
                    return
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            return
        finally:
            writer.close()

    async def close(self) -> None:
        self.server.close()
        for writer in self.writers:
            writer.close()
        await self.server.wait_closed()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[Server]]]:
    servers: list[Server] = []

    async def start(script: Script, tls: ssl.SSLContext | None = None) -> Server:
        servers.append(await Server(script, tls).start())
        return servers[-1]

    yield start
    for server in servers:
        await server.close()


def ok(body: bytes = b"{}", *extra: str) -> bytes:
    head = ["HTTP/1.1 200 OK", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def settle() -> None:
    """Let what the other side has sent or closed reach this side."""
    await asyncio.sleep(0.05)


def test_requests_and_closing_are_awaited() -> None:
    assert inspect.iscoroutinefunction(ConnectionPool.request)
    assert inspect.iscoroutinefunction(ConnectionPool.close)


async def test_content_length_answer_and_the_request_it_answers(serve) -> None:
    server = await serve(lambda request, n: (ok(b'{"a": 1}', 'ETag: W/"1"'), False))
    pool = ConnectionPool(server.origin)
    answer = await pool.request("POST", "/t?x=1", {"Content-Type": "application/json"}, b"[1]")
    assert (answer.status_code, answer.reason_phrase, answer.json()) == (200, "OK", {"a": 1})
    assert answer.headers["etag"] == answer.headers.get("ETag") == 'W/"1"'
    assert "Etag" in answer.headers and "nope" not in answer.headers
    sent = server.requests[0]
    assert sent.startswith(b"POST /t?x=1 HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}\r\n".encode() in sent
    assert b"Content-Length: 3\r\n" in sent and sent.endswith(b"\r\n\r\n[1]")
    await pool.request("POST", "/t", {})  # a POST without a body says its length is zero
    await pool.request("GET", "/t", {})
    assert b"Content-Length: 0\r\n" in server.requests[1]
    assert b"Content-Length" not in server.requests[2]
    await pool.close()


async def test_chunked_answer_with_extensions_and_trailers(serve) -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n"
    )
    server = await serve(lambda request, n: (chunked, False))
    pool = ConnectionPool(server.origin)
    assert (await pool.request("GET", "/", {})).content == b"hello world"
    assert (await pool.request("GET", "/", {})).content == b"hello world"
    assert server.connections == 1  # the framing ended where it should: reused
    await pool.close()


async def test_large_answers_arrive_whole_over_many_reads(serve) -> None:
    big = bytes(range(256)) * 8192  # 2 MiB: many reads
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(part), part) for part in (big[:700_000], big[700_000:])
    )
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    server = await serve(lambda request, n: ((ok(big) if n == 1 else chunked), False))
    pool = ConnectionPool(server.origin)
    assert (await pool.request("GET", "/", {})).content == big
    assert (await pool.request("GET", "/", {}, b"x" * 1_000_000)).content == big
    assert server.connections == 1
    await pool.close()


async def test_answer_read_to_the_end_of_the_connection_is_not_reused(serve) -> None:
    server = await serve(lambda request, n: (b"HTTP/1.1 200 OK\r\n\r\nall of it", True))
    pool = ConnectionPool(server.origin)
    assert (await pool.request("GET", "/", {})).text == "all of it"
    assert (await pool.request("GET", "/", {})).text == "all of it"
    assert server.connections == 2


async def test_interim_answers_are_skipped_and_bodiless_answers_have_none(serve) -> None:
    answers = {
        1: b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"after"),
        2: b"HTTP/1.1 204 No Content\r\nETag: e\r\n\r\n",
        3: b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
    }
    server = await serve(lambda request, n: (answers[n], False))
    pool = ConnectionPool(server.origin)
    assert (await pool.request("GET", "/", {})).content == b"after"
    assert (await pool.request("DELETE", "/", {})).status_code == 204
    assert (await pool.request("HEAD", "/", {})).content == b""
    assert server.connections == 1
    await pool.close()


async def test_keep_alive_reuses_one_connection_and_connection_close_does_not(serve) -> None:
    server = await serve(
        lambda request, n: (ok(b"x", "Connection: close") if n == 3 else ok(), False)
    )
    pool = ConnectionPool(server.origin)
    for _ in range(4):
        await pool.request("GET", "/", {})
    assert server.connections == 2  # requests 1-3 on the first; the 3rd said close
    await pool.close()


async def test_concurrent_requests_take_their_own_connections_then_reuse_them(serve) -> None:
    async def slow(request: bytes, n: int) -> Reply:
        await asyncio.sleep(0.05)
        return ok(), False

    server = await serve(slow)
    pool = ConnectionPool(server.origin)
    await asyncio.gather(*(pool.request("GET", "/", {}) for _ in range(3)))
    await asyncio.gather(*(pool.request("GET", "/", {}) for _ in range(3)))
    assert server.connections == 3 and len(server.requests) == 6
    await pool.close()


async def test_a_connection_the_server_closed_while_idle_is_not_reused(serve) -> None:
    server = await serve(lambda request, n: (ok(), True))  # answers, then closes
    pool = ConnectionPool(server.origin)
    await pool.request("GET", "/", {})
    await settle()
    assert (await pool.request("GET", "/", {})).status_code == 200
    assert server.connections == 2


async def test_an_idle_connection_the_server_wrote_to_is_not_reused(serve) -> None:
    server = await serve(lambda request, n: (ok(), False))
    pool = ConnectionPool(server.origin)
    await pool.request("GET", "/", {})
    server.writers[0].write(b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n\r\n")
    await settle()
    answer = await pool.request("GET", "/", {})  # not the 408: a new connection
    assert answer.status_code == 200 and server.connections == 2
    await pool.close()


async def test_a_connection_idle_past_the_servers_keep_alive_is_not_reused(serve) -> None:
    server = await serve(lambda request, n: (ok(b"", "Keep-Alive: timeout=1"), False))
    pool = ConnectionPool(server.origin)
    await pool.request("GET", "/", {})
    await pool.request("GET", "/", {})  # at once: reused
    assert server.connections == 1
    await asyncio.sleep(0.8)  # past timeout=1 less its margin (a quarter of it)
    await pool.request("GET", "/", {})
    assert server.connections == 2
    await pool.close()


async def test_a_kept_alive_connection_closed_as_it_was_taken_says_so(serve) -> None:
    server = await serve(lambda request, n: (ok(), False) if n == 1 else None)
    pool = ConnectionPool(server.origin)
    await pool.request("GET", "/", {})
    with pytest.raises(TransportError, match="closed the connection") as raised:
        await pool.request("GET", "/x", {})
    assert raised.value.reused
    with pytest.raises(TransportError) as raised:  # a fresh connection: an outage, not a race
        await pool.request("GET", "/y", {})
    assert not raised.value.reused


async def test_an_answer_cut_short_is_an_error_and_not_a_race(serve) -> None:
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nonly5"
    server = await serve(lambda request, n: (ok(), False) if n == 1 else (cut, True))
    pool = ConnectionPool(server.origin)
    await pool.request("GET", "/", {})
    with pytest.raises(TransportError, match="closed the connection") as raised:
        await pool.request("GET", "/", {})
    assert not raised.value.reused  # the answer had started: the request was seen


@pytest.mark.parametrize(
    "reply",
    [
        b"SMTP ready\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n",
    ],
)
async def test_malformed_answers_are_transport_errors(serve, reply: bytes) -> None:
    server = await serve(lambda request, n: (reply, True))
    with pytest.raises(TransportError):
        await ConnectionPool(server.origin).request("GET", "/", {})


async def test_a_malformed_answer_on_an_open_connection_says_what(serve) -> None:
    server = await serve(lambda request, n: (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", False))
    with pytest.raises(TransportError, match="GET /: malformed answer") as raised:
        await ConnectionPool(server.origin).request("GET", "/?q=1", {})
    assert not raised.value.reused


async def test_no_answer_within_the_read_timeout(serve) -> None:
    async def late(request: bytes, n: int) -> Reply:
        await asyncio.sleep(1.0 if n == 1 else 0)
        return ok(), False

    server = await serve(late)
    pool = ConnectionPool(server.origin, read_timeout=0.2)
    with pytest.raises(TransportError, match="GET /: no answer within the read timeout"):
        await pool.request("GET", "/", {})
    await pool.request("GET", "/", {})  # the late connection was closed, not reused
    assert server.connections == 2
    await pool.close()


async def test_a_cancelled_request_closes_its_connection(serve) -> None:
    async def late(request: bytes, n: int) -> Reply:
        await asyncio.sleep(0.3 if n == 1 else 0)
        return ok(str(n).encode()), False

    server = await serve(late)
    pool = ConnectionPool(server.origin, max_connections=1)
    task = asyncio.create_task(pool.request("GET", "/", {}))
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    answer = await pool.request("GET", "/", {})  # its slot was freed; not the first's answer
    assert answer.content == b"2" and server.connections == 2
    await pool.close()


async def test_refused_connection() -> None:
    with socket.create_server(("127.0.0.1", 0)) as unused:
        port = unused.getsockname()[1]
    with pytest.raises(TransportError, match=r"cannot connect to 127\.0\.0\.1"):
        await ConnectionPool(f"http://127.0.0.1:{port}").request("GET", "/", {})


async def test_at_most_max_connections_at_once(serve) -> None:
    inside, most = [0], [0]

    async def slow(request: bytes, n: int) -> Reply:
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        await asyncio.sleep(0.05)
        inside[0] -= 1
        return ok(), False

    server = await serve(slow)
    pool = ConnectionPool(server.origin, max_connections=2)
    await asyncio.gather(*(pool.request("GET", "/", {}) for _ in range(6)))
    assert most[0] == 2 and server.connections == 2 and len(server.requests) == 6
    await pool.close()


async def test_waiting_for_a_free_connection_is_bounded(serve) -> None:
    async def slow(request: bytes, n: int) -> Reply:
        await asyncio.sleep(0.3)
        return ok(), False

    server = await serve(slow)
    pool = ConnectionPool(server.origin, max_connections=1, read_timeout=0.5)
    first = asyncio.create_task(pool.request("GET", "/", {}))
    await settle()
    pool._read_timeout = 0.1  # the second waits less than the first takes
    with pytest.raises(TransportError, match=r"no connection to 127\.0\.0\.1 free within 0\.1 s"):
        await pool.request("GET", "/", {})
    assert (await first).status_code == 200
    await pool.close()


async def test_a_closed_pool_refuses_requests(serve) -> None:
    server = await serve(lambda request, n: (ok(), False))
    pool = ConnectionPool(server.origin)
    await pool.request("GET", "/", {})
    await pool.close()
    with pytest.raises(TransportError, match="closed"):
        await pool.request("GET", "/", {})


def test_not_an_http_origin() -> None:
    with pytest.raises(ValueError, match="origin"):
        ConnectionPool("ftp://example.com")


def test_a_pool_moves_to_another_event_loop() -> None:
    """Each asyncio.run is a new loop: the previous loop's connections are not used."""
    answers = []

    async def serve_and_ask(pool: list[ConnectionPool]) -> int:
        server = await Server(lambda request, n: (ok(), False)).start()
        if not pool:
            pool.append(ConnectionPool(server.origin))
        pool[0].port = server.port  # this loop's server
        answers.append((await pool[0].request("GET", "/", {})).status_code)
        await server.close()
        return server.connections

    pool: list[ConnectionPool] = []
    assert asyncio.run(serve_and_ask(pool)) == 1
    assert asyncio.run(serve_and_ask(pool)) == 1
    assert answers == [200, 200]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1: (certificate file, key file)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path)


async def test_https_is_verified_and_kept_alive(serve, certificate) -> None:
    cert, key = certificate
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)
    server = await serve(lambda request, n: (ok(b"secret"), False), server_side)
    origin = f"https://127.0.0.1:{server.port}"
    pool = ConnectionPool(origin, ssl_context=ssl.create_default_context(cafile=cert))
    assert (await pool.request("GET", "/", {})).content == b"secret"
    await settle()  # anything the server sends after the handshake has arrived
    assert (await pool.request("GET", "/", {})).content == b"secret"
    assert server.connections == 1
    await pool.close()
    with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
        await ConnectionPool(origin).request("GET", "/", {})  # the default trust store
