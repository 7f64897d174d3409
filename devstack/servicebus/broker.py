"""A development broker that speaks the Azure Service Bus dialect of AMQP 1.0.

The unmodified `azure-servicebus` SDK (sync and async) connects to it with
`Endpoint=sb://localhost:<port>;SharedAccessKeyName=<name>;SharedAccessKey=<key>;
UseDevelopmentEmulator=true`. It plays the part Azurite plays for Storage: local development and
tests with real sends, receives and settlements over the wire, and no cloud account or Docker.

Run `python -m devstack.servicebus.broker --help` for the options. Protocol notes the design
relies on are in the README and in the contract tests (tests/contract), which state every
behaviour the application needs and can be pointed at any Service Bus endpoint.

`Broker` handles proton engine events; driver.py runs the sockets and the engine. Every lock is
given to the receiver link it went out on, and the broker records how that link went away, so an
expired lock can be told apart as lost (its receiver was alive) or as a crash's (its connection
dropped without an AMQP close); the counters are in the stats file (stats.py).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from proton import Condition, Delivery, Endpoint, Link, Message, symbol

from devstack.servicebus import codec, management, stats
from devstack.servicebus.auth import SharedAccessPolicy, TokenRejected, entity_path
from devstack.servicebus.config import ConfigError, QueueSettings, load_queues
from devstack.servicebus.driver import Driver
from devstack.servicebus.persistence import SqlitePersistence
from devstack.servicebus.queues import (
    HOLDER_CLOSED,
    HOLDER_CLOSED_BY_BROKER,
    HOLDER_DROPPED,
    LockHolder,
    LockLost,
    Queue,
    parse_sections,
)

log = logging.getLogger("servicebus.broker")

CBS_NODE = "$cbs"
MANAGEMENT_SUFFIX = "/$management"
DEAD_LETTER_SUFFIX = "/$deadletterqueue"
CREDIT_WINDOW = 1000
SESSION_FILTER = "com.microsoft:session-filter"
TICK_SECONDS = 0.05
STATS_EVERY_S = 1.0
# proton's condition for a connection whose input ended without an AMQP close: this name, and a
# description that starts with these words (a protocol error is a framing-error too, described
# otherwise)
ABORTED = ("amqp:connection:framing-error", "connection aborted")


def _guarded(method: Callable[..., None]) -> Callable[..., None]:
    """One misbehaving peer must not stop the broker: log, close what failed, carry on."""

    @functools.wraps(method)
    def wrapper(self: Broker, event: Any) -> None:
        try:
            method(self, event)
        except Exception as exc:
            log.exception("error handling %s", event.type)
            endpoint = event.link or event.connection
            if endpoint is not None and endpoint.state & Endpoint.LOCAL_ACTIVE:
                endpoint.condition = _condition("amqp:internal-error", f"{type(exc).__name__}")
                endpoint.close()
                for link in _links_of(endpoint):
                    _holder_leaves(link, HOLDER_CLOSED_BY_BROKER)

    return wrapper


class Broker:
    """The engine event handler (driver.py runs it): connections, links, transfers,
    settlements, and a tick for lock expiries, schedules and TTLs."""

    def __init__(
        self,
        queues: dict[str, QueueSettings],
        policy: SharedAccessPolicy,
        *,
        host: str = "127.0.0.1",
        port: int = 5672,
        port_file: Path | None = None,
        persistence: SqlitePersistence | None = None,
        clock: Callable[[], float] = time.time,
        stats_file: Path | None = None,
    ) -> None:
        self.policy = policy
        self.host = host
        self.port = port
        self.port_file = port_file
        self.stats_file = stats_file
        self.started_utc = _utc_now()
        self._stats_written: dict[str, Any] | None = None
        self._stats_due = 0.0
        self.persistence = persistence
        self.clock = clock
        self.queues: dict[str, Queue] = {}
        for settings in queues.values():
            queue = Queue.with_dead_letter_queue(settings, persistence)
            self.queues[queue.name.lower()] = queue
            assert queue.dead_letter_queue is not None
            self.queues[queue.dead_letter_queue.name.lower()] = queue.dead_letter_queue
        self.consumers: dict[str, list[Link]] = {key: [] for key in self.queues}
        self._round_robin = 0
        self._stopping = False
        self._reset_requested = False
        self._driver: Driver | None = None
        if persistence:
            self._restore(persistence)

    def _restore(self, persistence: SqlitePersistence) -> None:
        for key, queue in self.queues.items():
            queue.next_seq = persistence.load_next_seq(key)
            for message in persistence.load_messages(key):
                queue.restore(message)
            for message_id, seen_at in persistence.load_seen_ids(key):
                queue.restore_seen_id(message_id, seen_at)
            if queue.messages:
                log.info("restored %d message(s) on %s", len(queue.messages), queue.name)

    # --- lifecycle --------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Safe from a signal handler: the broker stops within a tick."""
        self._stopping = True

    def request_connection_reset(self) -> None:
        """Safe from a signal handler: every client connection is dropped within a tick
        (:meth:`Driver.reset_connections`), the queues and their messages kept."""
        self._reset_requested = True

    def listen(self) -> None:
        """Take the port (raises OSError when it cannot be had) and write the port file."""
        driver = Driver(self, tick_seconds=TICK_SECONDS)
        self.port = driver.listen(self.host, self.port)
        self._driver = driver
        log.info(
            "listening on %s:%d with %d queue(s): %s",
            self.host,
            self.port,
            len(self.queues) // 2,
            ", ".join(q.name for q in self.queues.values() if not q.is_dead_letter_queue),
        )
        if self.port_file:
            tmp = self.port_file.with_suffix(".tmp")
            tmp.write_text(f"{self.port}\n")
            tmp.replace(self.port_file)

    def serve(self) -> None:
        """Serve until :meth:`request_stop`, then shut down."""
        assert self._driver is not None, "listen first"
        try:
            self._driver.run(lambda: self._stopping)
        finally:
            self._shutdown(self._driver)

    def on_tick(self) -> None:
        """Every TICK_SECONDS: expire locks and messages, release schedules, deliver."""
        now = self.clock()
        if self._reset_requested and self._driver is not None:
            self._reset_requested = False
            dropped = self._driver.reset_connections()
            log.warning("dropped %d client connection(s), as a network fault would", dropped)
        for key, queue in self.queues.items():
            try:  # one queue's failure must not stop the others' expiries and schedules
                if queue.has_due(now):
                    with self._atomic():
                        queue.tick(now)
                if self.consumers[key] and queue.has_available(now):
                    self._dispatch(key)
            except Exception:
                log.exception("error in the timer tick of %s", queue.name)
        if self.stats_file and now >= self._stats_due:
            self._stats_due = now + STATS_EVERY_S
            self.write_stats()

    def _shutdown(self, driver: Driver) -> None:
        log.info("shutting down")
        driver.close()
        if self.persistence:
            self.persistence.close()
        if self.stats_file:
            self.write_stats()
        if self.port_file:
            with contextlib.suppress(FileNotFoundError):
                self.port_file.unlink()

    # --- connections ------------------------------------------------------------------------

    @_guarded
    def on_connection_bound(self, event: Any) -> None:
        sasl = event.transport.sasl()
        sasl.allowed_mechs("ANONYMOUS")
        sasl.allow_insecure_mechs = True

    @_guarded
    def on_connection_remote_open(self, event: Any) -> None:
        conn = event.connection
        conn.authorized = set()
        conn.reply_links = {}
        conn.container = "servicebus-devbroker"
        conn.open()
        log.info("connection opened: %s (%s)", conn.remote_container, _peer(event))

    @_guarded
    def on_connection_remote_close(self, event: Any) -> None:
        log.info("connection closed: %s", event.connection.remote_container)
        for link in _links_of(event.connection):
            _holder_leaves(link, HOLDER_CLOSED)
        event.connection.close()

    @_guarded
    def on_transport_closed(self, event: Any) -> None:
        conn = event.connection
        if conn is None:
            return
        transport = event.transport
        how = _how_it_ended(conn, transport)
        links = _links_of(conn)
        if links and how != HOLDER_CLOSED:
            condition = transport.condition if transport is not None else None
            log.info(
                "connection ended (%s): %s%s",
                how,
                conn.remote_container,
                f" ({condition.name}: {condition.description})" if condition else "",
            )
        for link in links:
            _holder_leaves(link, how)
            self._forget_link(link)

    @_guarded
    def on_session_remote_open(self, event: Any) -> None:
        event.session.open()

    @_guarded
    def on_session_remote_close(self, event: Any) -> None:
        event.session.close()

    # --- links ------------------------------------------------------------------------------

    @_guarded
    def on_link_remote_open(self, event: Any) -> None:
        link = event.link
        terminus = link.remote_target if link.is_receiver else link.remote_source
        address = terminus.address or ""
        path = entity_path(address)
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        if path == CBS_NODE.lower():
            self._open_service_link(link, "cbs", path)
            return
        entity = path.removesuffix(MANAGEMENT_SUFFIX)
        if not self._is_authorized(link.connection, path):
            self._refuse(
                link,
                "amqp:unauthorized-access",
                f"Unauthorized access to '{entity}': put a token for it on $cbs first.",
            )
            return
        queue = self.queues.get(entity)
        if queue is None:  # reached with a namespace-wide token only (else $cbs said 404)
            self._refuse(
                link,
                "amqp:not-found",
                f"The messaging entity '{address}' could not be found. Declare it in the "
                "entity config file (UserConfig.Namespaces[].Queues[]).",
            )
            return
        management = path.endswith(MANAGEMENT_SUFFIX)  # peek, renew...: allowed on a DLQ
        if link.is_receiver and not management and entity.endswith(DEAD_LETTER_SUFFIX):
            # Service Bus: a dead-letter queue takes messages only through the dead-letter
            # operation of its parent entity; a sender link to it is refused.
            self._refuse(
                link,
                "amqp:not-allowed",
                f"Cannot send to '{queue.name}': a dead-letter queue receives messages only "
                f"when they are dead-lettered from '{queue.name.removesuffix(DEAD_LETTER_SUFFIX)}'"
                " (receiver.dead_letter_message). Send to the queue itself.",
            )
            return
        if link.is_sender and _has_session_filter(link.remote_source):
            self._refuse(
                link,
                "amqp:not-implemented",
                f"'{queue.name}' is not a session-enabled queue, and the development broker "
                "does not implement sessions: receive without a session id.",
            )
            return
        if path.endswith(MANAGEMENT_SUFFIX):
            self._open_service_link(link, "management", path, queue)
            return
        link.role = "queue"
        link.queue_key = entity
        if link.is_receiver:
            link.max_message_size = queue.settings.max_message_bytes
            link.open()
            link.flow(CREDIT_WINDOW)
        else:
            link.presettled = link.remote_snd_settle_mode == Link.SND_SETTLED
            link.holder = _new_holder(link)
            link.open()
            self.consumers[entity].append(link)
        log.info(
            "%s attached to %s (%s)",
            "sender" if link.is_receiver else "receiver",
            queue.name,
            "receive-and-delete" if getattr(link, "presettled", False) else "peek-lock",
        )

    def _open_service_link(self, link: Link, role: str, path: str, queue: Queue | None = None):
        link.role = role
        link.queue_key = queue.name.lower() if queue else None
        link.pending_replies = []
        link.holder = _new_holder(link) if queue else None
        link.open()
        if link.is_receiver:
            link.flow(CREDIT_WINDOW)
        else:
            link.connection.reply_links[entity_path(link.remote_target.address or path)] = link
            link.connection.reply_links[path] = link

    def _refuse(self, link: Link, condition: str, description: str) -> None:
        log.info("refused link to %s: %s", link.name, description)
        link.role = "refused"
        link.condition = _condition(condition, description)
        link.open()
        link.close()

    def _is_authorized(self, conn: Any, path: str) -> bool:
        granted = getattr(conn, "authorized", set())
        return any(g == "" or path == g or path.startswith(g + "/") for g in granted)

    @_guarded
    def on_link_remote_close(self, event: Any) -> None:
        link = event.link
        _holder_leaves(link, HOLDER_CLOSED)
        self._forget_link(link)
        if link.state & Endpoint.LOCAL_ACTIVE:
            link.close()

    def _forget_link(self, link: Link) -> None:
        key = getattr(link, "queue_key", None)
        if getattr(link, "role", None) == "queue" and link.is_sender and key in self.consumers:
            with contextlib.suppress(ValueError):
                self.consumers[key].remove(link)
                log.info("receiver detached from %s", self.queues[key].name)

    @_guarded
    def on_link_flow(self, event: Any) -> None:
        link = event.link
        if not link.is_sender:
            return
        role = getattr(link, "role", None)
        if role == "queue":
            self._dispatch(link.queue_key)
            if link.drain_mode and link.credit > 0:
                link.drained()
        elif role in ("cbs", "management"):
            self._flush_replies(link)

    # --- transfers --------------------------------------------------------------------------

    @_guarded
    def on_delivery(self, event: Any) -> None:
        link, delivery = event.link, event.delivery
        if link.is_receiver:
            self._receive(link, delivery)
        else:
            self._settle(link, delivery)

    def _receive(self, link: Link, delivery: Delivery) -> None:
        if delivery.partial or not delivery.readable:
            return
        raw = link.recv(delivery.pending)
        link.advance()
        if delivery.aborted:
            delivery.settle()
            return
        role = getattr(link, "role", None)
        if role == "queue":
            self._accept_send(link, delivery, raw)
        elif role == "cbs":
            self._put_token(link, raw)
            delivery.update(Delivery.ACCEPTED)
            delivery.settle()
        elif role == "management":
            self._management_request(link, raw)
            delivery.update(Delivery.ACCEPTED)
            delivery.settle()
        if link.credit < CREDIT_WINDOW // 2:
            link.flow(CREDIT_WINDOW - link.credit)

    def _accept_send(self, link: Link, delivery: Delivery, raw: bytes) -> None:
        queue = self.queues[link.queue_key]
        limit = queue.settings.max_message_bytes
        if len(raw) > limit:
            self._reject(
                delivery,
                "amqp:link:message-size-exceeded",
                f"The message of {len(raw)} bytes exceeds the {limit}-byte limit of "
                f"'{queue.name}'. Send a smaller message (or store the payload elsewhere).",
            )
            return
        try:
            sections = codec.split_sections(raw)
            members = _batch_members(sections) or [sections]
            messages = [parse_sections(member) for member in members]
        except codec.CodecError as exc:
            self._reject(delivery, "amqp:decode-error", f"The message is not valid AMQP: {exc}")
            return
        now = self.clock()
        with self._atomic():
            for incoming in messages:
                queue.enqueue(incoming, now)
        if not delivery.settled:  # `settled` is the remote's flag; pre-settled sends need no echo
            delivery.update(Delivery.ACCEPTED)
        delivery.settle()
        if self.consumers[link.queue_key]:
            self._dispatch(link.queue_key)

    def _reject(self, delivery: Delivery, condition: str, description: str) -> None:
        log.info("rejected a transfer: %s", description)
        delivery.local.condition = _condition(condition, description)
        delivery.update(Delivery.REJECTED)
        delivery.settle()

    def _atomic(self) -> contextlib.AbstractContextManager[None]:
        return self.persistence.atomic() if self.persistence else contextlib.nullcontext()

    # --- delivering -------------------------------------------------------------------------

    def _dispatch(self, key: str) -> None:
        queue = self.queues[key]
        if not queue.may_have_available():  # most calls: nothing waiting, look at no link
            return
        consumers = [link for link in self.consumers.get(key, ()) if link.credit > 0]
        if not consumers:
            return
        now = self.clock()
        with self._atomic():
            index = self._round_robin
            while consumers:
                link = consumers[index % len(consumers)]
                if not self._deliver_one(link, queue, now):
                    break
                if link.credit <= 0:
                    consumers.remove(link)
                else:
                    index += 1
            self._round_robin = index + 1

    def _deliver_one(self, link: Link, queue: Queue, now: float) -> bool:
        if link.presettled:
            message = queue.take_next(now)
            if message is None:
                return False
            delivery = link.delivery(uuid.uuid4().bytes_le)
            link.stream(queue.render(message))
            link.advance()
            delivery.settle()
            return True
        locked = queue.lock_next(now, link.holder)
        if locked is None:
            return False
        message, token, locked_until = locked
        delivery = link.delivery(token.bytes_le)
        delivery.lock_token = token
        link.stream(queue.render(message, token, locked_until))
        link.advance()
        return True

    # --- settlement -------------------------------------------------------------------------

    def _settle(self, link: Link, delivery: Delivery) -> None:
        token = getattr(delivery, "lock_token", None)
        if token is None:
            return
        outcome = delivery.remote_state
        if not outcome:
            if not delivery.settled:
                return  # a progress update, not a settlement
            outcome = Delivery.RELEASED  # settled with no outcome: it was never processed
        queue = self.queues[link.queue_key]
        now = self.clock()
        try:
            with self._atomic():
                self._apply_outcome(queue, delivery, token, outcome, now)
        except LockLost as exc:
            delivery.local.condition = _condition("com.microsoft:message-lock-lost", str(exc))
            delivery.update(Delivery.REJECTED)
        else:
            delivery.update(outcome)
        delivery.settle()
        self._dispatch(link.queue_key)

    @staticmethod
    def _apply_outcome(
        queue: Queue, delivery: Delivery, token: uuid.UUID, outcome: int, now: float
    ) -> None:
        if outcome == Delivery.ACCEPTED:
            queue.complete(token, now)
        elif outcome == Delivery.RELEASED:
            queue.release(token, now)
        elif outcome == Delivery.MODIFIED and delivery.remote.undeliverable:
            queue.defer(token, now)
        elif outcome == Delivery.MODIFIED:
            queue.abandon(token, now)
        elif outcome == Delivery.REJECTED:
            info = delivery.remote.condition.info if delivery.remote.condition else None
            info = {str(k): v for k, v in (info or {}).items()}
            queue.dead_letter(
                token,
                now,
                str(info.get("DeadLetterReason") or ""),
                str(info.get("DeadLetterErrorDescription") or ""),
            )

    # --- $cbs and $management ---------------------------------------------------------------

    def _put_token(self, link: Link, raw: bytes) -> None:
        request = Message()
        request.decode(raw)
        props = request.properties or {}
        audience = str(props.get("name", ""))
        try:
            if props.get("operation") != "put-token":
                raise TokenRejected(f"unsupported $cbs operation {props.get('operation')!r}")
            granted = self.policy.authorize(str(request.body), audience)
        except TokenRejected as exc:
            log.info("put-token for %s refused: %s", audience, exc)
            status, description = 401, str(exc)
        else:
            status, description = self._check_entity(granted, audience)
        if status == 202:
            link.connection.authorized.add(granted)
        reply = Message(
            correlation_id=request.id,
            properties={"status-code": status, "status-description": description},
        )
        self._reply(link, request, reply, CBS_NODE.lower())

    def _check_entity(self, path: str, audience: str) -> tuple[int, str]:
        """Service Bus answers a token for a missing entity with 404, as this does (it checks
        the signature first, so a caller without the key cannot probe which entities exist)."""
        entity = path.removesuffix(MANAGEMENT_SUFFIX)
        if entity and entity not in self.queues:
            log.info("put-token for %s refused: no such entity", audience)
            return 404, (
                f"The messaging entity '{audience}' could not be found. Declare it in the "
                "entity config file (UserConfig.Namespaces[].Queues[])."
            )
        return 202, "Accepted"

    def _management_request(self, link: Link, raw: bytes) -> None:
        request = Message()
        request.decode(raw)
        queue = self.queues[link.queue_key]
        reply = management.handle(queue, request, self.clock(), self._atomic, link.holder)
        reply.correlation_id = request.id
        self._reply(link, request, reply, link.queue_key + MANAGEMENT_SUFFIX)
        self._dispatch(link.queue_key)

    def _reply(self, link: Link, request: Message, reply: Message, node: str) -> None:
        links = link.connection.reply_links
        target = links.get(entity_path(request.reply_to or "")) or links.get(node)
        if target is None:
            log.info("no reply link for %s on this connection; reply dropped", node)
            return
        target.pending_replies.append(reply.encode())
        self._flush_replies(target)

    @staticmethod
    def _flush_replies(link: Link) -> None:
        while link.pending_replies and link.credit > 0:
            delivery = link.delivery(uuid.uuid4().bytes)
            link.stream(link.pending_replies.pop(0))
            link.advance()
            delivery.settle()

    # --- stats ------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Lock and redelivery counters per queue, and their totals (see stats.py)."""
        queues = {q.name: q.stats.as_dict() for q in self.queues.values()}
        return {"totals": stats.totals(queues.values()), "queues": queues}

    def write_stats(self) -> None:
        """Write the stats file if a counter changed since the last write."""
        assert self.stats_file is not None
        current = self.stats()
        if current == self._stats_written:
            return
        document = {"pid": os.getpid(), "started_utc": self.started_utc}
        document |= {"updated_utc": _utc_now(), **current}
        try:
            stats.write(self.stats_file, document)
        except OSError:
            log.warning("could not write the stats file %s", self.stats_file, exc_info=True)
            return
        self._stats_written = current


def _utc_now() -> str:
    return datetime.now(UTC).isoformat()


def _new_holder(link: Link) -> LockHolder:
    return LockHolder(f"{link.connection.remote_container or 'unknown'}/{link.name}")


def _holder_leaves(link: Link, how: str) -> None:
    holder = getattr(link, "holder", None)
    if holder is not None:
        holder.leave(how)


def _links_of(endpoint: Any) -> list[Link]:
    """A link itself, or every link of a connection."""
    if isinstance(endpoint, Link):
        return [endpoint]
    links = []
    link = endpoint.link_head(0) if hasattr(endpoint, "link_head") else None
    while link:
        links.append(link)
        link = link.next(0)
    return links


def _how_it_ended(conn: Any, transport: Any) -> str:
    """How a connection whose transport closed went away: closed by the client (an AMQP close),
    closed by the broker, or dropped (the socket ended without a close: the process died)."""
    if conn.state & Endpoint.REMOTE_CLOSED:
        return HOLDER_CLOSED
    if conn.state & Endpoint.LOCAL_CLOSED:
        return HOLDER_CLOSED_BY_BROKER
    condition = transport.condition if transport is not None else None
    if condition is None or _aborted(condition):
        return HOLDER_DROPPED
    return HOLDER_CLOSED_BY_BROKER  # proton refused the peer's frames: a protocol error


def _aborted(condition: Condition) -> bool:
    name, words = ABORTED
    return condition.name == name and (condition.description or "").startswith(words)


def _condition(name: str, description: str) -> Condition:
    """An AMQP error as Service Bus sends it: always with an info map (the SDK indexes it)."""
    return Condition(name, description, {symbol("com.microsoft:tracking-id"): str(uuid.uuid4())})


def _has_session_filter(terminus: Any) -> bool:
    """Whether a receiver asks for a session (the SDK's `session_id=` / NEXT_AVAILABLE_SESSION)."""
    data = terminus.filter if terminus is not None else None
    if data is None:
        return False
    data.rewind()
    if not data.next():
        return False
    filters = data.get_object()
    if not isinstance(filters, dict):
        return False
    return any(str(key) == SESSION_FILTER for key in filters)


def _batch_members(sections: list[codec.Section]) -> list[list[codec.Section]]:
    """The sections of each message inside a batch transfer, or [] when ``sections`` are one
    message.

    The SDK marks a batch with message-format 0x80013700, which proton does not expose, so a
    batch is recognised as a message whose body is data sections that each hold a whole
    encoded message.
    """
    data = [s for s in sections if s.code == codec.DATA]
    if not data or any(s.code in (codec.AMQP_VALUE, codec.AMQP_SEQUENCE) for s in sections):
        return []
    members = []
    for section in data:
        payload = codec.section_value(section)
        if not isinstance(payload, bytes) or payload[:2] != b"\x00\x53":
            return []
        try:
            members.append(codec.split_sections(payload))
        except codec.CodecError:
            return []
    return members


def _peer(event: Any) -> str:
    peer = getattr(event.connection, "peer", None)
    return f"amqp://{peer}" if peer else "unknown peer"


# --- command line ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devstack.servicebus.broker",
        description=(
            "Development broker for the Azure Service Bus AMQP dialect. The azure-servicebus SDK "
            "connects with 'Endpoint=sb://localhost:<port>;SharedAccessKeyName=<key-name>;"
            "SharedAccessKey=<key>;UseDevelopmentEmulator=true'. Queues come from entity "
            "config files in the official Service Bus emulator's Config.json format; "
            "undeclared queues are refused, never auto-created."
        ),
        epilog=(
            "Signals: SIGTERM or SIGINT stops it; SIGUSR1 drops every client connection with a "
            "TCP reset, as a network fault would (the chaos run's broker nemesis)."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument(
        "--port", type=int, default=5672, help="TCP port; 0 picks a free one (see --port-file)"
    )
    parser.add_argument(
        "--config",
        action="append",
        required=True,
        type=Path,
        help="entity config file (emulator Config.json format); repeat to merge several",
    )
    parser.add_argument(
        "--port-file",
        type=Path,
        help="write the listening port here once ready (a health check can wait for it)",
    )
    parser.add_argument(
        "--stats-file",
        type=Path,
        help="keep per-queue lock and redelivery counters in this JSON file (default: "
        "broker.stats.json beside --port-file; see devstack/servicebus/stats.py)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="keep messages, schedules, dead letters and duplicate history in SQLite here, "
        "so they survive a restart; without it everything is in memory",
    )
    parser.add_argument(
        "--key-name",
        default="RootManageSharedAccessKey",
        help="shared access policy name clients must sign with",
    )
    parser.add_argument(
        "--key",
        default=os.environ.get("SERVICEBUS_DEV_KEY"),
        help="shared access key clients must sign with (default: $SERVICEBUS_DEV_KEY); "
        "tokens signed with another key are refused",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # proton logs a peer that hangs up without closing as an error; it is routine here.
    logging.getLogger("proton").setLevel(logging.CRITICAL)
    if not args.key:
        print("error: --key (or SERVICEBUS_DEV_KEY) is required", file=sys.stderr)
        return 2
    try:
        queues = load_queues(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    persistence = SqlitePersistence(args.data_dir) if args.data_dir else None
    broker = Broker(
        queues,
        SharedAccessPolicy(args.key_name, args.key),
        host=args.host,
        port=args.port,
        port_file=args.port_file,
        persistence=persistence,
        stats_file=args.stats_file or stats.default_stats_path(args.port_file),
    )
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: broker.request_stop())
    signal.signal(signal.SIGUSR1, lambda *_: broker.request_connection_reset())
    try:
        broker.listen()
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    broker.serve()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
