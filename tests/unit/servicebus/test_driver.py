"""The broker's event loop (driver.py) on real sockets, with a recording handler: what reaches
the handler, and that a connection is torn down however it ends."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from devstack.servicebus.broker import _how_it_ended
from devstack.servicebus.driver import Driver
from devstack.servicebus.queues import HOLDER_CLOSED_BY_BROKER, HOLDER_DROPPED

SASL_HEADER = b"AMQP\x03\x01\x00\x00"


class Recorder:
    """Handles a few events the way the broker does (open what the peer opens)."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.ended: list[str] = []  # how each connection ended, as the broker tells it
        self.ticks = 0

    def on_tick(self) -> None:
        self.ticks += 1

    def on_connection_bound(self, event: Any) -> None:
        self.events.append("bound")
        sasl = event.transport.sasl()
        sasl.allowed_mechs("ANONYMOUS")

    def on_connection_remote_open(self, event: Any) -> None:
        self.events.append("remote_open")
        event.connection.open()

    def on_transport_closed(self, event: Any) -> None:
        self.events.append("transport_closed")
        self.ended.append(_how_it_ended(event.connection, event.transport))


@pytest.fixture
def served() -> Iterator[tuple[Driver, Recorder, int]]:
    recorder = Recorder()
    driver = Driver(recorder, tick_seconds=0.01)
    port = driver.listen("127.0.0.1", 0)
    stop = threading.Event()
    thread = threading.Thread(target=driver.run, args=(stop.is_set,), daemon=True)
    thread.start()
    yield driver, recorder, port
    stop.set()
    thread.join(30)
    driver.close()


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_ticks_run_while_idle(served: tuple[Driver, Recorder, int]) -> None:
    _, recorder, _ = served
    wait_for(lambda: recorder.ticks >= 5, "five ticks")


def test_a_peer_that_hangs_up_is_reported_and_torn_down(served) -> None:
    driver, recorder, port = served
    with socket.create_connection(("127.0.0.1", port)) as peer:
        peer.sendall(SASL_HEADER)
        assert peer.recv(8) == SASL_HEADER, "the engine answers: SASL was set up at bind"
        wait_for(lambda: "bound" in recorder.events, "the bound event")
    wait_for(lambda: "transport_closed" in recorder.events, "the transport to close")
    wait_for(lambda: not driver._sockets, "the socket to be torn down")
    assert recorder.ended == [HOLDER_DROPPED], "a peer gone without a close is a crash"


def test_garbage_closes_the_connection_with_an_error(served) -> None:
    driver, recorder, port = served
    with socket.create_connection(("127.0.0.1", port)) as peer:
        peer.sendall(b"GET / HTTP/1.1\r\n\r\n")
        peer.settimeout(5)
        received = b""
        while chunk := peer.recv(4096):  # the engine answers with its header, then hangs up
            received += chunk
        assert received.startswith(b"AMQP")
    wait_for(lambda: "transport_closed" in recorder.events, "the transport to close")
    wait_for(lambda: not driver._sockets, "the socket to be torn down")
    assert recorder.ended == [HOLDER_CLOSED_BY_BROKER], "a protocol error is not a crash"


def test_peers_that_leave_are_all_torn_down(served) -> None:
    driver, _, port = served
    peers = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    wait_for(lambda: len(driver._sockets) == 3, "three connections")
    for peer in peers:
        peer.close()
    wait_for(lambda: not driver._sockets, "every socket torn down")


def test_close_hangs_up_on_every_peer() -> None:
    driver = Driver(Recorder(), tick_seconds=0.01)
    port = driver.listen("127.0.0.1", 0)
    stop = threading.Event()
    thread = threading.Thread(target=driver.run, args=(stop.is_set,), daemon=True)
    thread.start()
    peers = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    try:
        wait_for(lambda: len(driver._sockets) == 2, "two connections")
        stop.set()
        thread.join(30)
        driver.close()
        for peer in peers:
            peer.settimeout(5)
            assert peer.recv(100) == b"", "the broker's side is closed"
    finally:
        for peer in peers:
            peer.close()
