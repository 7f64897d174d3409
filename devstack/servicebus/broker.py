"""A development broker that speaks the Azure Service Bus dialect of AMQP 1.0.

The unmodified `azure-servicebus` SDK (sync and async) connects to it with
`Endpoint=sb://localhost:<port>;SharedAccessKeyName=<name>;SharedAccessKey=<key>;
UseDevelopmentEmulator=true`. It plays the part Azurite plays for Storage: local development and
tests with real sends, receives and settlements over the wire, and no cloud account or Docker.

Run `python -m devstack.servicebus.broker --help` for the options. Protocol notes the design
relies on are in the README and in the contract tests (tests/contract), which state every
behaviour the application needs and can be pointed at any Service Bus endpoint.
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
from pathlib import Path
from typing import Any

from proton import Condition, Delivery, Endpoint, Handler, Link, Message, symbol
from proton.reactor import Container

from devstack.servicebus import codec, management
from devstack.servicebus.auth import SharedAccessPolicy, TokenRejected, entity_path
from devstack.servicebus.config import ConfigError, QueueSettings, load_queues
from devstack.servicebus.framing import RepairingIOHandler
from devstack.servicebus.persistence import SqlitePersistence
from devstack.servicebus.queues import LockLost, Queue, parse_incoming

log = logging.getLogger("servicebus.broker")

CBS_NODE = "$cbs"
MANAGEMENT_SUFFIX = "/$management"
DEAD_LETTER_SUFFIX = "/$deadletterqueue"
CREDIT_WINDOW = 1000
SESSION_FILTER = "com.microsoft:session-filter"
TICK_SECONDS = 0.05


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

    return wrapper


class Broker(Handler):
    """The proton event handler: connections, links, transfers and settlements."""

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
    ) -> None:
        super().__init__()
        self.policy = policy
        self.host = host
        self.port = port
        self.port_file = port_file
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
        self._acceptor: Any = None
        self._container: Container | None = None
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
        """Safe from a signal handler: the next tick shuts the broker down."""
        self._stopping = True

    def on_reactor_init(self, event: Any) -> None:
        self._container = event.container
        self._acceptor = event.container.listen(f"{self.host}:{self.port}")
        self.port = self._acceptor._selectable._delegate.getsockname()[1]
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
        event.container.schedule(TICK_SECONDS, self)

    def on_timer_task(self, event: Any) -> None:
        if self._stopping:
            self._shutdown(event.container)
            return
        now = self.clock()
        for key, queue in self.queues.items():
            try:  # one queue's failure must not stop the others' expiries and schedules
                with self._atomic():
                    queue.tick(now)
                if self.consumers[key] and queue.has_available(now):
                    self._dispatch(key)
            except Exception:
                log.exception("error in the timer tick of %s", queue.name)
        event.container.schedule(TICK_SECONDS, self)

    def _shutdown(self, container: Container) -> None:
        log.info("shutting down")
        if self._acceptor is not None:
            self._acceptor.close()
        container.stop()
        if self.persistence:
            self.persistence.close()
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
        event.connection.close()

    @_guarded
    def on_transport_closed(self, event: Any) -> None:
        conn = event.connection
        if conn is None:
            return
        link = conn.link_head(0)
        while link:
            self._forget_link(link)
            link = link.next(0)

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
            messages = [parse_incoming(m) for m in _batch_members(raw)] or [parse_incoming(raw)]
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
        consumers = [link for link in self.consumers.get(key, ()) if link.credit > 0]
        if not consumers:
            return
        queue = self.queues[key]
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
        locked = queue.lock_next(now)
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
        reply = management.handle(queue, request, self.clock(), self._atomic)
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


def _batch_members(raw: bytes) -> list[bytes]:
    """The messages inside a batch transfer, or [] when `raw` is a single message.

    The SDK marks a batch with message-format 0x80013700, which proton does not expose, so a
    batch is recognised as a message whose body is data sections that each hold a whole
    encoded message.
    """
    try:
        sections = codec.split_sections(raw)
    except codec.CodecError:
        return []
    data = [s for s in sections if s.code == codec.DATA]
    if not data or any(s.code in (codec.AMQP_VALUE, codec.AMQP_SEQUENCE) for s in sections):
        return []
    members = []
    for section in data:
        payload = codec.section_value(section)
        if not isinstance(payload, bytes) or payload[:2] != b"\x00\x53":
            return []
        try:
            codec.split_sections(payload)
        except codec.CodecError:
            return []
        members.append(payload)
    return members


def _peer(event: Any) -> str:
    url = getattr(event.connection, "url", None)
    return str(url) if url else "unknown peer"


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
    )
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: broker.request_stop())
    try:
        Container(broker, global_handler=RepairingIOHandler()).run()
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
