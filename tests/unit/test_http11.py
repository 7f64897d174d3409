"""core.http11 against a real socket server that answers as scripted: framing
(Content-Length, chunked, to the end of the connection), kept-alive reuse, connections the
server closes, timeouts and malformed answers."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from core.http11 import ConnectionPool, TransportError
from core.tablestorage import client
from core.tablestorage.client import TableService

# What the server does with one request on one connection: the bytes to write back, and
# whether to close the connection afterwards. None: close without answering.
Script = Callable[[bytes, int], tuple[bytes, bool] | None]


@dataclass
class Server:
    """Accepts connections and answers each request from ``script``."""

    script: Script
    tls: ssl.SSLContext | None = None
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    sockets: list[socket.socket] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            self.sockets.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        buffer = b""
        if self.tls is not None:
            try:
                sock = self.tls.wrap_socket(sock, server_side=True)
            except OSError:
                return
        with sock:
            while True:
                try:
                    while b"\r\n\r\n" not in buffer:
                        data = sock.recv(65536)
                        if not data:
                            return
                        buffer += data
                    head, _, buffer = buffer.partition(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    while len(buffer) < length:
                        buffer += sock.recv(65536)
                    request, buffer = head + b"\r\n\r\n" + buffer[:length], buffer[length:]
                    self.requests.append(request)
                    reply = self.script(request, len(self.requests))
                    if reply is None:
                        return
                    data, close = reply
                    sock.sendall(data)
                    if close:
                        return
                except OSError:
                    return

    def close(self) -> None:
        self.listener.close()
        for sock in self.sockets:
            sock.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Script], Server]]:
    servers: list[Server] = []

    def start(script: Script, tls: ssl.SSLContext | None = None) -> Server:
        servers.append(Server(script, tls))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def ok(body: bytes = b"{}", *extra: str) -> bytes:
    head = ["HTTP/1.1 200 OK", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def test_content_length_answer_and_the_request_it_answers(serve) -> None:
    server = serve(lambda request, n: (ok(b'{"a": 1}', 'ETag: W/"1"'), False))
    pool = ConnectionPool(server.origin)
    answer = pool.request("POST", "/t?x=1", {"Content-Type": "application/json"}, b"[1]")
    assert (answer.status_code, answer.reason_phrase, answer.json()) == (200, "OK", {"a": 1})
    assert answer.headers["etag"] == answer.headers.get("ETag") == 'W/"1"'
    assert "Etag" in answer.headers and "nope" not in answer.headers
    sent = server.requests[0]
    assert sent.startswith(b"POST /t?x=1 HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}\r\n".encode() in sent
    assert b"Content-Length: 3\r\n" in sent and sent.endswith(b"\r\n\r\n[1]")


def test_a_post_without_a_body_says_its_length_is_zero(serve) -> None:
    server = serve(lambda request, n: (ok(), False))
    ConnectionPool(server.origin).request("POST", "/t", {})
    ConnectionPool(server.origin).request("GET", "/t", {})
    assert b"Content-Length: 0\r\n" in server.requests[0]
    assert b"Content-Length" not in server.requests[1]


def test_chunked_answer_with_extensions_and_trailers(serve) -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n"
    )
    server = serve(lambda request, n: (chunked, False))
    pool = ConnectionPool(server.origin)
    assert pool.request("GET", "/", {}).content == b"hello world"
    assert pool.request("GET", "/", {}).content == b"hello world"
    assert server.connections == 1  # the framing ended where it should: reused


def test_large_answers_arrive_whole_over_many_reads(serve) -> None:
    big = bytes(range(256)) * 8192  # 2 MiB: many socket reads
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(part), part) for part in (big[:700_000], big[700_000:])
    )
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    server = serve(lambda request, n: ((ok(big) if n == 1 else chunked), False))
    pool = ConnectionPool(server.origin)
    assert pool.request("GET", "/", {}).content == big
    assert pool.request("GET", "/", {}).content == big
    assert server.connections == 1


def test_answer_read_to_the_end_of_the_connection_is_not_reused(serve) -> None:
    server = serve(lambda request, n: (b"HTTP/1.1 200 OK\r\n\r\nall of it", True))
    pool = ConnectionPool(server.origin)
    assert pool.request("GET", "/", {}).text == "all of it"
    assert pool.request("GET", "/", {}).text == "all of it"
    assert server.connections == 2


def test_interim_answers_are_skipped_and_bodiless_answers_have_none(serve) -> None:
    answers = {
        1: b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"after"),
        2: b"HTTP/1.1 204 No Content\r\nETag: e\r\n\r\n",
        3: b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
    }
    server = serve(lambda request, n: (answers[n], False))
    pool = ConnectionPool(server.origin)
    assert pool.request("GET", "/", {}).content == b"after"
    assert pool.request("DELETE", "/", {}).status_code == 204
    assert pool.request("HEAD", "/", {}).content == b""
    assert server.connections == 1


def test_keep_alive_reuses_one_connection_and_connection_close_does_not(serve) -> None:
    server = serve(lambda request, n: (ok(b"x", "Connection: close") if n == 3 else ok(), False))
    pool = ConnectionPool(server.origin)
    for _ in range(4):
        pool.request("GET", "/", {})
    assert server.connections == 2  # requests 1-3 on the first; the 3rd said close


def test_a_connection_the_server_closed_while_idle_is_not_reused(serve) -> None:
    server = serve(lambda request, n: (ok(), True))  # answers, then closes
    pool = ConnectionPool(server.origin)
    pool.request("GET", "/", {})
    time.sleep(0.05)  # the close reaches this side
    assert pool.request("GET", "/", {}).status_code == 200
    assert server.connections == 2


def test_a_connection_idle_past_the_servers_keep_alive_is_not_reused(serve) -> None:
    server = serve(lambda request, n: (ok(b"", "Keep-Alive: timeout=1"), False))
    pool = ConnectionPool(server.origin)
    pool.request("GET", "/", {})
    pool.request("GET", "/", {})  # at once: reused
    assert server.connections == 1
    time.sleep(0.8)  # past timeout=1 less its margin (a quarter of it)
    pool.request("GET", "/", {})
    assert server.connections == 2


def test_a_kept_alive_connection_closed_as_it_was_taken_says_so(serve) -> None:
    server = serve(lambda request, n: (ok(), False) if n == 1 else None)
    pool = ConnectionPool(server.origin)
    pool.request("GET", "/", {})
    with pytest.raises(TransportError, match="closed the connection") as raised:
        pool.request("GET", "/x", {})
    assert raised.value.reused
    with pytest.raises(TransportError) as raised:  # a fresh connection: an outage, not a race
        pool.request("GET", "/y", {})
    assert not raised.value.reused


def test_an_answer_cut_short_is_an_error_and_not_a_race(serve) -> None:
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nonly5"
    server = serve(lambda request, n: (ok(), False) if n == 1 else (cut, True))
    pool = ConnectionPool(server.origin)
    pool.request("GET", "/", {})
    with pytest.raises(TransportError, match="closed the connection") as raised:
        pool.request("GET", "/", {})
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
def test_malformed_answers_are_transport_errors(serve, reply: bytes) -> None:
    server = serve(lambda request, n: (reply, True))
    with pytest.raises(TransportError):
        ConnectionPool(server.origin).request("GET", "/", {})


def test_no_answer_within_the_read_timeout(serve) -> None:
    server = serve(lambda request, n: (time.sleep(1.0), None)[1])
    pool = ConnectionPool(server.origin, read_timeout=0.2)
    with pytest.raises(TransportError, match="read timeout"):
        pool.request("GET", "/", {})


def test_refused_connection() -> None:
    with socket.create_server(("127.0.0.1", 0)) as unused:
        port = unused.getsockname()[1]
    with pytest.raises(TransportError, match="cannot connect"):
        ConnectionPool(f"http://127.0.0.1:{port}").request("GET", "/", {})


def test_at_most_max_connections_at_once(serve) -> None:
    inside, most = [0], [0]
    lock = threading.Lock()

    def slow(request: bytes, n: int) -> tuple[bytes, bool]:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.05)
        with lock:
            inside[0] -= 1
        return ok(), False

    server = serve(slow)
    pool = ConnectionPool(server.origin, max_connections=2)
    threads = [threading.Thread(target=pool.request, args=("GET", "/", {})) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] == 2 and server.connections == 2 and len(server.requests) == 6


def test_a_closed_pool_refuses_requests(serve) -> None:
    server = serve(lambda request, n: (ok(), False))
    pool = ConnectionPool(server.origin)
    pool.request("GET", "/", {})
    pool.close()
    with pytest.raises(TransportError, match="closed"):
        pool.request("GET", "/", {})


def test_not_an_http_origin() -> None:
    with pytest.raises(ValueError, match="origin"):
        ConnectionPool("ftp://example.com")


# ------------------------------------------------------------ through the Table client

CS = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey="
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "TableEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
)


def test_the_table_client_retries_a_closed_kept_alive_connection_at_once(
    serve, monkeypatch
) -> None:
    entity = b'{"PartitionKey":"p","RowKey":"r","odata.etag":"e"}'
    server = serve(lambda request, n: None if n == 2 else (ok(entity), False))
    slept: list[float] = []
    monkeypatch.setattr(client.time, "sleep", slept.append)
    seen: list = []
    table = TableService.from_connection_string(
        CS.format(port=server.port), request_hook=seen.append
    ).get_table_client("t")
    assert table.get_entity("p", "r").metadata["etag"] == "e"
    assert table.get_entity("p", "r").metadata["etag"] == "e"
    assert len(seen) == 3 and slept == []  # the failed attempt counted, no backoff
    assert server.requests[0].startswith(b"GET /devstoreaccount1/t(PartitionKey='p',RowKey='r')")


def test_the_table_client_backs_off_when_the_service_is_down(serve, monkeypatch) -> None:
    server = serve(lambda request, n: None)
    slept: list[float] = []
    monkeypatch.setattr(client.time, "sleep", slept.append)
    table = TableService.from_connection_string(CS.format(port=server.port)).get_table_client("t")
    with pytest.raises(client.ServiceRequestError, match="closed the connection"):
        table.get_entity("p", "r")
    assert len(slept) == client.RETRIES


# ------------------------------------------------------------------------------- TLS


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


def test_https_is_verified_and_kept_alive(serve, certificate) -> None:
    cert, key = certificate
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)
    server = serve(lambda request, n: (ok(b"secret"), False), server_side)
    origin = f"https://127.0.0.1:{server.port}"
    trusted = ssl.create_default_context(cafile=cert)
    pool = ConnectionPool(origin, ssl_context=trusted)
    assert pool.request("GET", "/", {}).content == b"secret"
    time.sleep(0.05)  # anything the server sends after the handshake has arrived
    assert pool.request("GET", "/", {}).content == b"secret"
    assert server.connections == 1
    with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
        ConnectionPool(origin).request("GET", "/", {})  # the default trust store: refused
