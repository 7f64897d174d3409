"""A lean event loop for proton's AMQP engine: sockets, engine events and a periodic tick.

proton's own reactor (``proton.reactor.Container`` with its ``IOHandler``) wraps every engine
event, and several events of its own for each socket read or write (selectable updated,
readable, writable, reactor quiesced), in Python objects, and dispatches each one to two
handlers. Profiled under the lockstep benchmark that was about 35 dispatches and 4,000 Python
calls per message: most of the broker's CPU. This loop drives the same engine objects
(``proton.Connection``, ``Transport``, ``Collector``), so links, deliveries and their state are
handled exactly as before, and does the rest itself with ``selectors``:

- it accepts, reads, writes and closes non-blocking sockets (TCP_NODELAY), and runs every read
  through :class:`~devstack.servicebus.framing.DeliveryIdRepair`;
- an engine event reaches the handler only if it has a method for it (``on_<event name>``,
  proton's names), as an :class:`EngineEvent` that looks up its link, delivery, session,
  connection or transport only when asked; other events are dropped without being wrapped;
- a connection's output is written right after the events that produced it (the engine marks
  such a connection with a ``PN_TRANSPORT`` event), not one select round later;
- ``handler.on_tick(now)`` runs every ``tick_seconds``, and each transport's own timer (AMQP
  heartbeats, idle timeouts) is serviced about once a second.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from cproton import (
    PN_TRANSPORT,
    PN_TRANSPORT_CLOSED,
    addressof,
    isnull,
    pn_collector_peek,
    pn_collector_pop,
    pn_event_connection,
    pn_event_delivery,
    pn_event_link,
    pn_event_session,
    pn_event_transport,
    pn_event_type,
)
from proton import Collector, Connection, Delivery, Link, Session, Transport
from proton._events import EventType

from devstack.servicebus.framing import DeliveryIdRepair, push

log = logging.getLogger("servicebus.driver")

LISTEN_BACKLOG = 256
TRANSPORT_TICK_S = 1.0
_UNSET = object()


class EngineEvent:
    """One engine event, valid only while the handler method it is passed to runs."""

    __slots__ = ("_impl", "_link", "type")

    def __init__(self, impl: Any, event_type: EventType) -> None:
        self._impl = impl
        self._link: Any = _UNSET
        self.type = event_type

    @property
    def connection(self) -> Connection | None:
        return Connection.wrap(pn_event_connection(self._impl))

    @property
    def session(self) -> Session | None:
        return Session.wrap(pn_event_session(self._impl))

    @property
    def link(self) -> Link | None:
        if self._link is _UNSET:  # looked up once: the handler and its guard both ask
            self._link = Link.wrap(pn_event_link(self._impl))
        return self._link

    @property
    def delivery(self) -> Delivery | None:
        return Delivery.wrap(pn_event_delivery(self._impl))

    @property
    def transport(self) -> Transport | None:
        return Transport.wrap(pn_event_transport(self._impl))


class _Socket:
    """One accepted connection: its socket, its engine transport and its read filter."""

    __slots__ = ("closed", "deadline", "events", "repair", "sock", "transport", "unpushed")

    def __init__(self, sock: socket.socket, transport: Transport) -> None:
        self.sock = sock
        self.transport = transport
        self.repair = DeliveryIdRepair()
        self.unpushed = b""  # repaired bytes the transport had no room for yet
        self.deadline = 0.0  # when the transport's timer is due (0: not known yet)
        self.events = selectors.EVENT_READ
        self.closed = False


class Driver:
    """Runs ``handler`` over the connections accepted on one listening socket."""

    def __init__(self, handler: Any, *, tick_seconds: float) -> None:
        self.handler = handler
        self.tick_seconds = tick_seconds
        self.collector = Collector()
        self.selector = selectors.DefaultSelector()
        self.listener: socket.socket | None = None
        self._methods: dict[int, tuple[EventType, Callable[[EngineEvent], None]]] = {}
        for number, event_type in EventType.TYPES.items():
            method = getattr(handler, event_type.method, None)
            if method is not None:
                self._methods[number] = (event_type, method)
        self._sockets: dict[int, _Socket] = {}  # by the address of the transport
        self._dirty: dict[int, _Socket] = {}  # transports with output to write
        self._closing: list[_Socket] = []

    # --- lifecycle ----------------------------------------------------------------------------

    def listen(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: a free port); return the port."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((host, port))
            listener.listen(LISTEN_BACKLOG)
        except OSError:
            listener.close()
            raise
        listener.setblocking(False)
        self.selector.register(listener, selectors.EVENT_READ, None)
        self.listener = listener
        return int(listener.getsockname()[1])

    def run(self, should_stop: Callable[[], bool]) -> None:
        """Serve until ``should_stop()`` (checked at least every ``tick_seconds``)."""
        next_tick = time.monotonic()
        next_transport_tick = next_tick + TRANSPORT_TICK_S
        while not should_stop():
            now = time.monotonic()
            if now >= next_tick:
                self._call(self.handler.on_tick)
                next_tick = now + self.tick_seconds
                self._process()
            if now >= next_transport_tick:
                self._tick_transports(now)
                next_transport_tick = now + TRANSPORT_TICK_S
            for key, mask in self.selector.select(max(0.0, next_tick - time.monotonic())):
                if key.data is None:
                    self._accept()
                else:
                    self._io(key.data, mask)
            self._process()

    def close(self) -> None:
        """Close the listener and every connection (their peers see the socket end)."""
        if self.listener is not None:
            self.selector.unregister(self.listener)
            self.listener.close()
            self.listener = None
        for conn in list(self._sockets.values()):
            self._teardown(conn)
        self.selector.close()

    def reset_connections(self) -> int:
        """Drop every client connection as a network fault would: each socket is closed with a
        TCP reset and no AMQP close, so the engine sees a dropped peer (locks handed out on it
        are left to expire, as after a crash). Returns how many were dropped."""
        dropped = [conn for conn in self._sockets.values() if not conn.closed]
        for conn in dropped:
            with contextlib.suppress(OSError):
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self._watch(conn, reading=False, writing=False)
        return len(dropped)

    # --- sockets ------------------------------------------------------------------------------

    def _accept(self) -> None:
        assert self.listener is not None
        while True:
            try:
                sock, peer = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: try again next round
                log.warning("accept failed: %s", exc)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = Connection()
            connection.collect(self.collector)
            connection.peer = f"{peer[0]}:{peer[1]}"
            transport = Transport(Transport.SERVER)
            transport.bind(connection)
            conn = _Socket(sock, transport)
            self._sockets[addressof(transport._impl)] = conn
            self.selector.register(sock, conn.events, conn)
            self._process()  # CONNECTION_BOUND first: the handler sets up SASL before any read

    def _io(self, conn: _Socket, mask: int) -> None:
        if conn.closed:
            return
        if mask & selectors.EVENT_READ:
            self._read(conn)
        if mask & selectors.EVENT_WRITE:
            self._write(conn)

    def _read(self, conn: _Socket) -> None:
        transport = conn.transport
        if conn.unpushed:
            conn.unpushed = push(transport, conn.unpushed)
        capacity = transport.capacity()
        if capacity < 0:  # the engine takes no more input (it closed the connection)
            self._watch(conn, reading=False)
            return
        if capacity == 0 or conn.unpushed:
            return  # the engine is full: read again once it has taken what it holds
        try:
            data = conn.sock.recv(capacity)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the peer is gone: nothing more comes in or can go out
            transport.close_tail()
            transport.close_head()
            self._watch(conn, reading=False)
            return
        conn.unpushed = push(transport, conn.repair.feed(data))
        self._dirty[addressof(transport._impl)] = conn  # input may call for output

    def _write(self, conn: _Socket) -> None:
        transport = conn.transport
        while True:
            pending = transport.pending()
            if pending <= 0:
                break
            try:
                sent = conn.sock.send(transport.peek(pending))
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                transport.close_head()
                pending = 0
                break
            transport.pop(sent)
        self._watch(conn, writing=pending > 0)

    def _watch(self, conn: _Socket, *, reading: bool | None = None, writing: bool | None = None):
        events = conn.events
        if reading is not None:
            events = events | selectors.EVENT_READ if reading else events & ~selectors.EVENT_READ
        if writing is not None:
            events = events | selectors.EVENT_WRITE if writing else events & ~selectors.EVENT_WRITE
        if events == conn.events or conn.closed:
            return
        conn.events = events
        if events:
            self.selector.modify(conn.sock, events, conn)
            return
        # Neither way is open: wait for nothing, and make sure the engine reports the transport
        # closed (the handler forgets the connection then, and _process tears it down).
        self.selector.unregister(conn.sock)
        with contextlib.suppress(Exception):
            conn.transport.close_tail()
            conn.transport.close_head()

    def _tick_transports(self, now: float) -> None:
        for conn in list(self._sockets.values()):
            if conn.deadline <= now and not conn.closed:
                deadline = conn.transport.tick(now)
                conn.deadline = deadline if deadline > 0 else now + TRANSPORT_TICK_S
                self._dirty[addressof(conn.transport._impl)] = conn
        self._process()

    def _teardown(self, conn: _Socket) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._sockets.pop(addressof(conn.transport._impl), None)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(conn.sock)
        conn.sock.close()
        with contextlib.suppress(Exception):
            conn.transport.unbind()

    # --- engine events ------------------------------------------------------------------------

    def _process(self) -> None:
        """Hand every pending engine event to the handler, write what they produced, and
        repeat until the engine is quiet."""
        collector = self.collector._impl
        while True:
            impl = pn_collector_peek(collector)
            if isnull(impl):
                if not self._dirty:
                    break
                dirty, self._dirty = self._dirty, {}
                for conn in dirty.values():
                    if not conn.closed:
                        self._write(conn)
                continue
            number = pn_event_type(impl)
            if number in (PN_TRANSPORT, PN_TRANSPORT_CLOSED):
                self._note_transport(impl, number)
            handled = self._methods.get(number)
            if handled is not None:
                self._call(handled[1], EngineEvent(impl, handled[0]))
            pn_collector_pop(collector)
        while self._closing:
            self._teardown(self._closing.pop())

    def _note_transport(self, impl: Any, number: int) -> None:
        """PN_TRANSPORT: the connection has output to write; PN_TRANSPORT_CLOSED: it is over."""
        address = addressof(pn_event_transport(impl))
        conn = self._sockets.get(address)
        if conn is None:
            return
        if number == PN_TRANSPORT:
            self._dirty[address] = conn
        else:
            self._closing.append(conn)

    @staticmethod
    def _call(method: Callable[..., None], *args: Any) -> None:
        try:
            method(*args)
        except Exception:  # the handler guards itself; this keeps the loop alive regardless
            log.exception("unhandled error in %s", getattr(method, "__name__", method))
