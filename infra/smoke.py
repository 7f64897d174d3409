"""Post-deploy smoke test: submit one order to the deployed app and wait until it is Processed.

    python infra/smoke.py --namespace <ns>.servicebus.windows.net \\
        --storage-table-endpoint https://<account>.table.core.windows.net/ [--timeout 120]

After ``azd up``, ``eval "$(azd env get-values)"`` exports SERVICEBUS_FULLY_QUALIFIED_NAMESPACE,
AZURE_STORAGE_TABLE_ENDPOINT, ORDERS_QUEUE and ORDERS_TABLE, which are the defaults of the
options, so ``python infra/smoke.py`` alone works.

It signs in with DefaultAzureCredential (``az login``, ``azd auth login``, environment or
managed identity), through the app's own clients (adapters.clients: Service Bus's asyncio client,
the app's Table client). The signed-in principal needs Azure Service Bus Data Sender on the orders
queue and Storage Table Data Reader on the orders table; infra/main.bicep grants both to the
principal that ran the deployment (AZURE_PRINCIPAL_ID). Right after a deployment those roles may
not apply yet (Azure documents up to 10 minutes): a refusal is retried every 15 s for
``--roles-timeout`` seconds (600), saying so, before the test gives up.

The order is built and encoded by the app's own code (domain.messages, adapters.servicebus), so its
schema and
MessageId are the app's. It goes through the real remote services the app is configured with:
point INVENTORY/PAYMENT/SHIPPING_SERVICE_URL at test endpoints, or pass ``--workflow
single_step`` to touch only the inventory service.

The command prints every change of the order's record (state, current step, attempt, LockedBy,
retry time, each step's state). If the order does not reach Processed in time, it prints where
it got stuck: state, current step, attempt, generation, LockedBy, CompleteBy, when the retry is
due, LastError, each step's state, generation and attempts, and the last timeline rows, with a
hint at what to look at.

Exit status: 0 Processed, 1 the order ended in Error, 2 usage error, 3 timed out.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as `python infra/smoke.py` from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from domain.messages import OrderSubmitted  # noqa: E402
from domain.order import Order, TimelineEntry  # noqa: E402
from domain.states import ProcessState  # noqa: E402

DEFAULT_ORDERS_QUEUE = "orders"
DEFAULT_ORDERS_TABLE = "orders"
DEFAULT_TIMEOUT_SECONDS = 120.0
DEFAULT_ROLES_TIMEOUT_SECONDS = 600.0
"""How long to wait for new role assignments to apply (Azure documents up to 10 minutes)."""
ROLES_RETRY_SECONDS = 15.0
DEFAULT_POLL_SECONDS = 2.0
TIMELINE_ROWS_SHOWN = 8

EXIT_PROCESSED = 0
EXIT_ERROR = 1
EXIT_TIMEOUT = 3

ENV_NAMESPACE = "SERVICEBUS_FULLY_QUALIFIED_NAMESPACE"
ENV_TABLE_ENDPOINT = "AZURE_STORAGE_TABLE_ENDPOINT"
ENV_ORDERS_QUEUE = "ORDERS_QUEUE"
ENV_ORDERS_TABLE = "ORDERS_TABLE"


# ---------------------------------------------------------------------------- arguments


def normalize_namespace(value: str) -> str:
    """'sb://x.servicebus.windows.net/' or 'https://x...:443/' -> 'x.servicebus.windows.net'."""
    host = value.strip()
    for prefix in ("sb://", "https://", "amqps://"):
        if host.lower().startswith(prefix):
            host = host[len(prefix) :]
    host = host.split("/", 1)[0].split(":", 1)[0]
    if "." not in host or not host.replace(".", "").replace("-", "").isalnum():
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a fully qualified Service Bus namespace "
            "(like myns.servicebus.windows.net)"
        )
    return host.lower()


def table_endpoint(value: str) -> str:
    endpoint = value.strip()
    if not endpoint.lower().startswith("https://") or len(endpoint) <= len("https://"):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a table endpoint (like https://myaccount.table.core.windows.net/)"
        )
    return endpoint


def positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be positive")
    return seconds


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python infra/smoke.py",
        description="Submit one order to the deployed app and wait until it is Processed.",
        epilog=f"Defaults come from {ENV_NAMESPACE}, {ENV_TABLE_ENDPOINT}, {ENV_ORDERS_QUEUE} "
        f"and {ENV_ORDERS_TABLE} (azd env get-values). Exit status: 0 Processed, 1 Error, "
        "2 usage, 3 timed out.",
    )
    parser.add_argument(
        "--namespace",
        type=normalize_namespace,
        default=env.get(ENV_NAMESPACE) or None,
        help=f"Service Bus namespace host name (default: ${ENV_NAMESPACE})",
    )
    parser.add_argument(
        "--storage-table-endpoint",
        type=table_endpoint,
        default=env.get(ENV_TABLE_ENDPOINT) or None,
        help=f"state storage table endpoint (default: ${ENV_TABLE_ENDPOINT})",
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=DEFAULT_TIMEOUT_SECONDS,
        help="seconds to wait for Processed (default: %(default)s)",
    )
    parser.add_argument(
        "--poll-interval",
        type=positive_seconds,
        default=DEFAULT_POLL_SECONDS,
        help="seconds between reads of the order state (default: %(default)s)",
    )
    parser.add_argument(
        "--orders-queue",
        default=env.get(ENV_ORDERS_QUEUE) or DEFAULT_ORDERS_QUEUE,
        help=f"queue the app takes submissions from (default: ${ENV_ORDERS_QUEUE} or %(default)s)",
    )
    parser.add_argument(
        "--orders-table",
        default=env.get(ENV_ORDERS_TABLE) or DEFAULT_ORDERS_TABLE,
        help=f"table of the order state (default: ${ENV_ORDERS_TABLE} or %(default)s)",
    )
    parser.add_argument(
        "--roles-timeout",
        type=positive_seconds,
        default=DEFAULT_ROLES_TIMEOUT_SECONDS,
        help="seconds to keep retrying while the principal's new role assignments are not in "
        "effect yet (default: %(default)s)",
    )
    parser.add_argument("--order-id", help="order id to use (default: a new smoke-... id)")
    parser.add_argument(
        "--workflow", default="order", help="workflow to run (default: %(default)s)"
    )
    parser.add_argument("--reply-to", help="queue for StatusUpdate messages (default: none)")
    return parser


def parse_args(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> argparse.Namespace:
    env = os.environ if env is None else env
    parser = build_parser(env)
    # argparse runs `type` on string defaults too, so values from the environment are checked.
    args = parser.parse_args(argv)
    if args.namespace is None:
        parser.error(f"--namespace is required (or set {ENV_NAMESPACE})")
    if args.storage_table_endpoint is None:
        parser.error(f"--storage-table-endpoint is required (or set {ENV_TABLE_ENDPOINT})")
    args.order_id = args.order_id or new_order_id()
    return args


def new_order_id(now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    return f"smoke-{now:%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:8]}"


def build_order(order_id: str, workflow: str, reply_to: str | None) -> OrderSubmitted:
    """One small order, validated by the app's own schema."""
    return OrderSubmitted.model_validate(
        {
            "order_id": order_id,
            "customer_id": "smoke-test",
            "items": [{"sku": "SMOKE-1", "quantity": 1, "unit_price_cents": 100}],
            "currency": "USD",
            "workflow": workflow,
            "reply_to": reply_to,
        }
    )


# ------------------------------------------------------------------------------ watching


@dataclass(frozen=True)
class StepSnapshot:
    """One step as the order record knows it: what is known of its effect at its service."""

    name: str
    state: str
    generation: int
    attempt: int

    def line(self) -> str:
        return f"{self.name}:{self.state}(gen {self.generation}, attempt {self.attempt})"


@dataclass(frozen=True)
class Snapshot:
    """What the smoke test shows of the order record; a change of any field is printed.

    The outbox, timeline sequence and ETag are left out: they change with every write without
    telling a person anything the fields here do not."""

    state: str
    step: str | None
    operation: str
    attempt: int
    failure_count: int
    locked_by: str | None
    complete_by: datetime | None
    last_error: str | None
    next_attempt_at: datetime | None = None
    generation: int = 1
    compensation_cause: str | None = None
    steps: tuple[StepSnapshot, ...] = ()

    @classmethod
    def of(cls, record: Order) -> Snapshot:
        return cls(
            state=str(record.state),
            step=record.current_step,
            operation=record.current_operation,
            attempt=record.attempt,
            failure_count=record.failure_count,
            locked_by=record.locked_by,
            complete_by=record.complete_by,
            last_error=record.last_error,
            next_attempt_at=record.next_attempt_at,
            generation=record.generation,
            compensation_cause=record.compensation_cause,
            steps=tuple(
                StepSnapshot(s.name, str(s.state), s.generation, s.attempt) for s in record.steps
            ),
        )

    def line(self) -> str:
        step = f"{self.step}/{self.operation}" if self.step else "-"
        text = (
            f"{self.state:<12} step={step} attempt={self.attempt} "
            f"failures={self.failure_count} locked_by={self.locked_by or '-'}"
        )
        if self.next_attempt_at is not None:
            text += f" retry_due={self.next_attempt_at:%H:%M:%S}"
        if self.steps:
            text += " steps=" + ",".join(f"{s.name}:{s.state}" for s in self.steps)
        return f"{text} last_error={_one_line(self.last_error, 120)}" if self.last_error else text


@dataclass(frozen=True)
class Outcome:
    status: int
    snapshot: Snapshot | None
    waited: float


def _one_line(text: str | None, limit: int) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _ago(when: datetime | None, now: datetime) -> str:
    if when is None:
        return "-"
    seconds = (now - when).total_seconds()
    relation = "ago" if seconds >= 0 else "from now"
    return f"{when:%Y-%m-%dT%H:%M:%SZ} ({abs(seconds):.0f} s {relation})"


_HINTS = {
    None: "The order never reached the state store: the scheduler intake did not take it. Is "
    "the code deployed (azd deploy) and the app running? Look at the orders queue (active or "
    "dead-lettered messages) and at the app's traces in Application Insights.",
    ProcessState.PENDING.value: "A step failed for now (or its service's circuit is open) and "
    "the order waits for its retry, due at NextAttemptAt: a scheduled retry command on the "
    "scheduler-commands queue claims it then, or the Supervisor (SUPERVISOR_SCHEDULE) once it "
    "is overdue by PENDING_STALE_AFTER_SECONDS. Look at that queue and the Supervisor's traces.",
    ProcessState.PROCESSING.value: "A step is out with its agent and no reply has been recorded. "
    "Look at the agent's request queue, its *_SERVICE_URL and its traces; after CompleteBy the "
    "Supervisor retries the step.",
    ProcessState.COMPENSATING.value: "The order is undoing, latest first, every step that may "
    "have taken effect (Succeeded, or Running: outcome unknown), because a step was declined, "
    "the failure threshold was reached or an operator cancelled it (see LastError). It ends in "
    "Error with one operator alert; an undo that fails or times out is retried for "
    "COMPENSATION_BUDGET_SECONDS (a compensation_delayed warning after "
    "COMPENSATION_WARN_AFTER_SECONDS), and an undo the service refuses, or the budget running "
    "out, leaves it in Error with a critical alert (compensation_incomplete).",
    ProcessState.ERROR.value: "The order failed: one OperatorAlert with the reason is on the "
    "operator alerts queue, and Azure Monitor emails the operators. The steps above say what "
    "was undone (Compensated), never took effect (Failed, Voided) or may still be in place "
    "(Succeeded, Running).",
}


def format_stuck_report(
    order_id: str,
    snapshot: Snapshot | None,
    timeline: Sequence[TimelineEntry],
    *,
    waited: float,
    now: datetime,
    ended: bool = False,
) -> str:
    """Where the order got stuck (or how it ended, if ``ended``), for a person to act on."""
    head = (
        f"order {order_id} ended in {snapshot.state if snapshot else '?'} after {waited:.0f} s"
        if ended
        else f"order {order_id} did not reach Processed within {waited:.0f} s"
    )
    lines = [head + "."]
    if snapshot is None:
        lines.append("  no process record in the orders table")
    else:
        step = f"{snapshot.step} ({snapshot.operation})" if snapshot.step else "-"
        lines += [
            f"  state:        {snapshot.state}",
            f"  current step: {step}",
            f"  attempt:      {snapshot.attempt} (failures so far: {snapshot.failure_count})",
            f"  generation:   {snapshot.generation}",
            f"  LockedBy:     {snapshot.locked_by or '-'}",
            f"  CompleteBy:   {_ago(snapshot.complete_by, now)}",
        ]
        if snapshot.next_attempt_at is not None:
            lines.append(f"  retry due:    {_ago(snapshot.next_attempt_at, now)}")
        if snapshot.compensation_cause:
            lines.append(f"  compensation: {snapshot.compensation_cause}")
        lines.append(f"  LastError:    {_one_line(snapshot.last_error, 500) or '-'}")
        if snapshot.steps:
            lines.append("  steps:")
            lines += [f"    {s.line()}" for s in snapshot.steps]
    if timeline:
        shown = timeline[-TIMELINE_ROWS_SHOWN:]
        lines.append(f"last {len(shown)} of {len(timeline)} timeline rows:")
        for entry in shown:
            move = f"{entry.from_state or '-'} -> {entry.to_state}"
            where = f" step={entry.step}" if entry.step else ""
            detail = f"  {_one_line(entry.detail, 160)}" if entry.detail else ""
            lines.append(
                f"  #{entry.seq} {entry.at:%H:%M:%S} {entry.event:<18} {move}{where} "
                f"attempt={entry.attempt} by {entry.actor}{detail}"
            )
    elif snapshot is not None:
        lines.append("no timeline rows")
    lines.append("hint: " + _HINTS.get(snapshot.state if snapshot else None, ""))
    return "\n".join(lines)


async def watch(
    order_id: str,
    read_process: Callable[[], Awaitable[Order | None]],
    read_timeline: Callable[[], Awaitable[list[TimelineEntry]]],
    *,
    timeout: float,
    poll_interval: float,
    out: TextIO,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> Outcome:
    """Poll the process record, print each change, stop at Processed, Error or the timeout."""
    started = monotonic()
    last: Snapshot | str | None = "unset"
    while True:
        record = await read_process()
        snapshot = Snapshot.of(record) if record is not None else None
        waited = monotonic() - started
        if snapshot != last:
            text = snapshot.line() if snapshot else "no process record yet"
            print(f"{waited:6.1f}s  {text}", file=out, flush=True)
            last = snapshot
        if snapshot is not None and snapshot.state == ProcessState.PROCESSED.value:
            print(f"order {order_id} Processed in {waited:.1f} s", file=out, flush=True)
            return Outcome(EXIT_PROCESSED, snapshot, waited)
        if snapshot is not None and snapshot.state == ProcessState.ERROR.value:
            report = format_stuck_report(
                order_id, snapshot, await read_timeline(), waited=waited, now=now(), ended=True
            )
            print(report, file=out, flush=True)
            return Outcome(EXIT_ERROR, snapshot, waited)
        if waited >= timeout:
            timeline = await read_timeline() if snapshot is not None else []
            report = format_stuck_report(order_id, snapshot, timeline, waited=waited, now=now())
            print(report, file=out, flush=True)
            return Outcome(EXIT_TIMEOUT, snapshot, waited)
        await sleep(min(poll_interval, max(timeout - waited, 0.0)))


# ---------------------------------------------------------------------------------- Azure


async def until_roles_apply(
    action: Callable[[], Awaitable[Any]],
    denied: Callable[[BaseException], bool],
    *,
    timeout: float,
    out: TextIO,
    retry_in: float = ROLES_RETRY_SECONDS,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Any:
    """Run ``action``; while it is refused for want of a role (``denied``) and ``timeout`` has
    not passed, say so and try again: role assignments made by the deployment take minutes to
    apply. Any other error, or a refusal past the timeout, propagates."""
    started = monotonic()
    while True:
        try:
            return await action()
        except Exception as exc:
            left = timeout - (monotonic() - started)
            if not denied(exc) or left <= 0:
                raise
            wait = min(retry_in, left)
            print(
                f"refused ({type(exc).__name__}): role assignments not in effect yet? "
                f"trying again in {wait:.0f} s ({left:.0f} s left)",
                file=out,
                flush=True,
            )
            await sleep(wait)


def _denied(exc: BaseException) -> bool:
    from azure.core.exceptions import HttpResponseError
    from azure.servicebus.exceptions import ServiceBusAuthorizationError

    if isinstance(exc, ServiceBusAuthorizationError):
        return True
    return isinstance(exc, HttpResponseError) and exc.status_code == 403


async def submit(client: Any, queue: str, order: OrderSubmitted) -> None:
    """Send ``order`` with ``client`` (an asyncio ServiceBusClient) as the app encodes it."""
    from adapters.servicebus import to_servicebus_message

    async with client.get_queue_sender(queue) as sender:
        await sender.send_messages(to_servicebus_message(order))


ACCESS_HINT = (
    "The signed-in principal needs Azure Service Bus Data Sender on the orders queue and "
    "Storage Table Data Reader on the orders table (main.bicep grants both to "
    "AZURE_PRINCIPAL_ID); new role assignments can take a few minutes to apply."
)


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    args = parse_args(argv)
    try:
        order = build_order(args.order_id, args.workflow, args.reply_to)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        print(f"python infra/smoke.py: error: {exc}", file=sys.stderr)
        return 2
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError
    from azure.servicebus.exceptions import (
        ServiceBusAuthenticationError,
        ServiceBusAuthorizationError,
        ServiceBusError,
    )

    try:
        return asyncio.run(_run(args, order, out))
    except (ClientAuthenticationError, ServiceBusAuthenticationError) as exc:
        print(f"sign-in failed (az login?): {exc}\n{ACCESS_HINT}", file=sys.stderr)
    except ServiceBusAuthorizationError as exc:
        print(f"sending the order was refused: {exc}\n{ACCESS_HINT}", file=sys.stderr)
    except ServiceBusError as exc:
        print(f"sending the order failed: {exc}", file=sys.stderr)
    except HttpResponseError as exc:
        hint = f"\n{ACCESS_HINT}" if exc.status_code in (401, 403) else ""
        print(f"reading the order state failed: {exc.message}{hint}", file=sys.stderr)
    return EXIT_ERROR


async def _run(args: argparse.Namespace, order: OrderSubmitted, out: TextIO) -> int:
    from adapters import clients
    from adapters.settings import Connection
    from adapters.store.records import OrderRecords

    print(
        f"submitting order {order.order_id} ({order.workflow}) to "
        f"{args.namespace}/{args.orders_queue}",
        file=out,
        flush=True,
    )
    async with clients.servicebus_client(Connection("servicebus", endpoint=args.namespace)) as bus:
        await until_roles_apply(
            lambda: submit(bus, args.orders_queue, order),
            _denied,
            timeout=args.roles_timeout,
            out=out,
        )
    service = clients.table_service(Connection("storage", endpoint=args.storage_table_endpoint))
    async with OrderRecords(service, orders_table=args.orders_table, owns_service=True) as store:
        await until_roles_apply(
            lambda: store.find(order.order_id),
            _denied,
            timeout=args.roles_timeout,
            out=out,
        )
        outcome = await watch(
            order.order_id,
            lambda: store.find(order.order_id),
            lambda: store.get_timeline(order.order_id),
            timeout=args.timeout,
            poll_interval=args.poll_interval,
            out=out,
        )
    return outcome.status


if __name__ == "__main__":
    sys.exit(main())
