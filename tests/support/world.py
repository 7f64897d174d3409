"""A small world for lifecycle tests: the app's handlers on a store and a bus, honest remote
services, queues that deliver in any order and twice, a clock, and crashes between the write
and the sends.

The agents are modelled here (the real agent talks HTTP): an agent request is answered as the
remote-service contract says (docs/remote-service-contract.md) - at most one effect per key, an
undo that names its forward key either undoes it or tombstones it - with a fault chosen by the
test: a decline, a transient failure, an open circuit, a reply lost before or after the effect,
a call that took effect but ran out of its run budget (a transient ``timed_out``), a request
that hangs and lands later, or an undo the service refuses. A request taken up after its
complete-by is not carried out and is answered ``expired``, as the real agent does. The agents'
host may also freeze for several deadlines while orders compensate (:meth:`World.hosts_silent`).
Besides the agents' honest answers, a test may deliver validly signed answers to requests the
order never asked for (:meth:`World.answer_unasked`): they must change nothing and raise one
alert each.

The submitters' reply queue may refuse sends for a while (deleted, disabled or closed to the
app: :class:`ReplyQueue`); it takes them again once everything is left to settle.

The store notes the transitions each write makes (:func:`moves`) and refuses a step transition
that domain.order.STEP_TRANSITIONS does not allow, at the write.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from azure.servicebus._pyamqp.error import AuthenticationException, ErrorCondition
from azure.servicebus.exceptions import MessagingEntityNotFoundError, ServiceBusAuthenticationError

from adapters.settings import Connection, Settings
from adapters.store.rows import ActiveRow, AlreadyExists
from devstack.memory import MemoryBus, MemoryStore, SendFailed
from domain import ids
from domain.lifecycle import UNREQUESTED_REASON
from domain.messages import (
    EXPIRED,
    AgentRequest,
    AgentResponse,
    DueRows,
    MessageBase,
    OperatorAlert,
    OrderSubmitted,
    StatusUpdate,
    encode,
    message_id_for,
)
from domain.operator_actions import Refused
from domain.order import (
    COMPENSATION_DELAYED,
    STEP_TRANSITIONS,
    TERMINAL_ALERT_REASONS,
    Order,
    StepRecord,
    StepState,
    TimelineEntry,
)
from domain.states import ProcessState
from service import apply, control, hand_out, migration
from service.commands import handle_command
from service.intake import handle_submission
from service.replies import handle_response
from service.runtime import Runtime
from service.sweep import run_tick

QUEUES = {
    "orders": "orders",
    "inventory": "inventory-requests",
    "payment": "payment-requests",
    "shipping": "shipping-requests",
    "responses": "agent-responses",
    "commands": "scheduler-commands",
    "alerts": "operator-alerts",
}
REPLY_QUEUE = "client-replies"
AGENT_QUEUES = {QUEUES[name]: name for name in ("inventory", "payment", "shipping")}

Fault = Literal[
    "ok",
    "decline",
    "transient",
    "deferred",
    "lost_before",
    "lost_after",
    "late",
    "timed_out",
    "refuse_undo",
]
FAULTS: tuple[Fault, ...] = (
    "ok",
    "decline",
    "transient",
    "deferred",
    "lost_before",
    "lost_after",
    "late",
    "timed_out",
    "refuse_undo",
)
COMPENSATION_BUDGET = timedelta(minutes=30)
"""Short enough for a long silence of the agents' host (:meth:`World.hosts_silent`) to spend it."""
RETRY_CAP = timedelta(seconds=60)


Lie = Literal["succeeded", "refused", "nothing_to_undo", "transient", "deferred"]
LIES: tuple[Lie, ...] = ("succeeded", "refused", "nothing_to_undo", "transient", "deferred")
"""What an answer to a request never asked for may claim."""


ANSWER_STATES = {
    ("do", "succeeded", False): {StepState.SUCCEEDED, StepState.COMPENSATED},
    ("do", "failed", False): {StepState.FAILED, StepState.VOIDED},
    ("undo", "succeeded", False): {StepState.COMPENSATED},
    ("undo", "nothing_to_undo", False): {StepState.VOIDED, StepState.FAILED},
}
"""What a step may be once a definitive answer for its key was handled."""


@dataclass
class Services:
    """The remote services' truth: what took effect, per idempotency key."""

    forward: dict[str, str] = field(default_factory=dict)  # key -> done | declined | tombstoned
    undone: set[str] = field(default_factory=set)  # forward keys whose undo took effect
    effects: Counter[str] = field(default_factory=Counter)  # key -> effects applied
    refused_undos: set[str] = field(default_factory=set)  # forward keys whose undo was refused

    def call(
        self, request: AgentRequest, decline: bool, refuse_undo: bool = False
    ) -> tuple[str, str | None]:
        """Apply one request; (outcome, error code). ``refuse_undo``: the service refuses an
        undo of an effect in place (a permanent failure; it stays in place)."""
        key = request.idempotency_key
        if request.operation == "do":
            state = self.forward.get(key)
            if state is None:
                state = "declined" if decline else "done"
                self.forward[key] = state
                if state == "done":
                    self.effects[key] += 1
            if state == "done":
                return "succeeded", None
            return "failed", "undone_before_applied" if state == "tombstoned" else "declined"
        forward = request.undoes
        assert forward is not None
        if refuse_undo and self.in_place(forward):
            self.refused_undos.add(forward)
            return "failed", "undo_refused"
        if self.forward.get(forward) == "done":
            if forward not in self.undone:
                self.undone.add(forward)
                self.effects[key] += 1
            return "succeeded", None
        self.forward.setdefault(forward, "tombstoned")
        return "nothing_to_undo", None

    def in_place(self, forward_key: str) -> bool:
        return self.forward.get(forward_key) == "done" and forward_key not in self.undone


RECORD_ROWS = frozenset({"replies_held", "replies_resent", "replies_dropped", "late_answer"})
"""Timeline rows that change what is recorded about an order, not the order: which status
updates it still owes, whose failure an attempt given up on unanswered was."""


Asked = tuple[str, str, str, str, int]
"""A request an order asked for: order id, step, operation, idempotency key, attempt."""

Move = tuple[Literal["order", "step"], str, str]
"""A transition one write made: ``("order", from, to)`` of its ProcessState, ``("step", from,
to)`` of one step's StepState (a request sent again for a step is a move to the same state)."""


def moves(before: Order | None, after: Order, entry: TimelineEntry) -> set[Move]:
    """The transitions the write of ``after`` over ``before`` (None: its creation) made. A row
    that only records something about an ended order (:data:`RECORD_ROWS`) is no transition
    (domain.states); a step the write added (a migration's) had no state before it; a step
    whose generation changed started afresh (-> Pending), and may have been requested since."""
    made: set[Move] = set()
    was = entry.from_state
    if was is not None and not (
        was.terminal and entry.to_state.terminal and entry.event in RECORD_ROWS
    ):
        made.add(("order", was.value, entry.to_state.value))
    known = {s.name: s for s in before.steps} if before is not None else None
    for step in after.steps:
        old = known.get(step.name) if known is not None else StepRecord(step.name, step.index)
        if old is None:
            continue
        if old.state is not StepState.PENDING and step.generation != old.generation:
            made.add(("step", old.state.value, StepState.PENDING.value))  # afresh...
            old = StepRecord(step.name, step.index)  # ...and maybe requested in the same write
        if old.state is not step.state or step.attempt > old.attempt:
            made.add(("step", old.state.value, step.state.value))
    return made


class RecordingStore(MemoryStore):
    """The memory store, noting each AgentRequest an order's writes put in its outbox: every
    request the app decided to send, whether or not the send then happened."""

    def __init__(self, clock) -> None:  # type: ignore[no-untyped-def]
        super().__init__(clock)
        self.asked: set[Asked] = set()
        self.moves: set[Move] = set()
        """Every transition a write made (:func:`moves`)."""

    async def create(
        self,
        submitted: OrderSubmitted,
        order: Order,
        entry: TimelineEntry,
        *,
        due: datetime | None = None,
    ) -> Order | AlreadyExists:
        created = await super().create(submitted, order, entry, due=due)
        if isinstance(created, Order):
            self._note(None, created, entry)
        return created

    async def save(
        self, before: Order, after: Order, entry: TimelineEntry, *, due: datetime | None = None
    ) -> Order:
        saved = await super().save(before, after, entry, due=due)
        self._note(before, saved, entry)
        return saved

    def _note(self, before: Order | None, order: Order, entry: TimelineEntry) -> None:
        made = moves(before, order, entry)
        for kind, old, new in made:
            if kind == "step":
                assert StepState(new) in STEP_TRANSITIONS[StepState(old)], (
                    f"{order.order_id}: {entry.event} made a step {old} -> {new}, which "
                    "domain.order.STEP_TRANSITIONS does not allow"
                )
        self.moves |= made
        for outgoing in order.outbox:
            m = outgoing.message
            if isinstance(m, AgentRequest):
                self.asked.add((m.order_id, m.step, m.operation, m.idempotency_key, m.attempt))


class ReplyQueue:
    """The submitters' side of the bus: while ``refusing``, a send to the reply queue is refused
    as Service Bus refuses one to a queue that does not exist (``refused`` counts them); the
    next ``fail_next`` sends fail as when a broker restart breaks the token link."""

    def __init__(self, bus: MemoryBus) -> None:
        self.bus = bus
        self.refusing = False
        self.refused = 0
        self.fail_next = 0

    async def send(
        self, queue: str, message: MessageBase, *, scheduled_at: datetime | None = None
    ) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise ServiceBusAuthenticationError(
                message="CBS link", error=AuthenticationException(ErrorCondition.InternalError)
            )
        if self.refusing:
            self.refused += 1
            raise MessagingEntityNotFoundError(message=f"the messaging entity {queue} is gone")
        await self.bus.send(queue, message, scheduled_at=scheduled_at)


@dataclass
class Envelope:
    queue: str
    message: MessageBase
    due: datetime


FAILURE_THRESHOLD = 3
CLOCK_SKEW = timedelta(seconds=10)
"""The skew the world's app tolerates; its Supervisor's clock runs up to this far off."""
RECOVERIES = frozenset({"released", "compensation_started", "error"})
"""Timeline events a Supervisor's sweep writes when it finds an order late."""


class World:
    def __init__(self, *, failure_threshold: int = FAILURE_THRESHOLD) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)
        settings = Settings(
            queues=QUEUES,
            service_urls={},
            servicebus=Connection("servicebus"),
            storage=Connection("storage"),
            pending_stale_after=timedelta(seconds=120),
            step_timeout=timedelta(seconds=30),
            failure_threshold=failure_threshold,
            retry_base_delay=timedelta(seconds=5),
            retry_max_delay=RETRY_CAP,
            compensation_budget=COMPENSATION_BUDGET,
            compensation_warn_after=COMPENSATION_BUDGET / 3,
            clock_skew=CLOCK_SKEW,
        )
        self.store = RecordingStore(self.clock)
        self.bus = MemoryBus()
        self.rt = Runtime(
            settings=settings,
            store=self.store,  # type: ignore[arg-type]
            bus=self.bus,  # type: ignore[arg-type]
            workflows=settings.workflows(),
            instance_id="test-instance",
            clock=self.clock,
            rng=random.Random(0),
        )
        self.replies = ReplyQueue(self.bus)
        self.rt._status_bus = self.replies  # type: ignore[assignment]
        self.supervisor_offset = timedelta(0)
        """How far the Supervisor's clock runs ahead (negative: behind) of the world's."""
        self.supervisor_rt = dataclasses.replace(
            self.rt, instance_id="test-supervisor", clock=self.supervisor_clock
        )
        self.recovery_offset = timedelta(0)
        """How far the clock of the instance that recovers handed-out rows runs ahead."""
        self.recovery_rt = dataclasses.replace(
            self.rt, instance_id="test-recovery", clock=self.recovery_clock
        )
        self.inline_rows = hand_out.INLINE_ROWS
        """How many rows due a tick handles itself; more, it hands them out (service.hand_out)."""
        self.services = Services()
        self.pending: list[Envelope] = []
        self.parked: list[AgentRequest] = []
        self.frozen: list[Envelope] = []
        """Requests a frozen agents' host holds: taken up, late, when it wakes."""
        self.submissions: dict[str, OrderSubmitted] = {}
        self._seen = 0
        self._dropped_seen = 0
        self.crashes = 0
        self.consumed: list[AgentResponse] = []
        """Replies the Scheduler handled to the end (no crash)."""
        self.lies: list[AgentResponse] = []
        """Answers to requests never asked for, delivered by :meth:`answer_unasked`."""

    def clock(self) -> datetime:
        return self.now

    def supervisor_clock(self) -> datetime:
        return self.now + self.supervisor_offset

    def recovery_clock(self) -> datetime:
        return self.now + self.recovery_offset

    # -------------------------------------------------------------------------- plumbing

    def _collect(self) -> None:
        for sent in self.bus.sent[self._seen :]:
            due = sent.scheduled_at or self.now
            self.pending.append(Envelope(sent.queue, sent.message, due))
        self._seen = len(self.bus.sent)

    async def run(
        self, action: Callable[[], Awaitable[object]], crash_after: int | None = None
    ) -> bool:
        """Run a handler; with ``crash_after``, every send after that many fails (a crash).
        True if it ran to the end."""
        self.bus.fail_after = crash_after
        try:
            await action()
            return True
        except SendFailed:
            self.crashes += 1
            return False
        except Refused:
            return True
        finally:
            self.bus.fail_after = None
            self._collect()

    def deliverable(self, kind: str) -> list[Envelope]:
        if kind == "agent":
            return [e for e in self.pending if e.queue in AGENT_QUEUES and e.due <= self.now]
        queue = QUEUES[kind]
        return [e for e in self.pending if e.queue == queue and e.due <= self.now]

    # ---------------------------------------------------------------------------- events

    async def submit(  # type: ignore[no-untyped-def]
        self,
        order_id: str,
        *,
        reply_to: str | None = REPLY_QUEUE,
        crash_after=None,
        version: int | None = None,
    ):
        """Submit ``order_id`` (again: the same submission), on workflow ``order`` at
        ``version`` (None: the current one, 1)."""
        order = self.submissions.get(order_id) or OrderSubmitted(
            order_id=order_id,
            customer_id="customer-1",
            items=[{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 500}],
            currency="EUR",
            reply_to=reply_to,
            workflow_version=version,
            submitted_at=self.now,
        )
        self.submissions[order_id] = order
        return await self.run(lambda: handle_submission(encode(order), self.rt), crash_after)

    async def deliver(self, envelope: Envelope, fault: Fault = "ok", crash_after=None, keep=False):  # type: ignore[no-untyped-def]
        """Deliver one message; it stays queued if the handler crashed (or ``keep``)."""
        body = encode(envelope.message)
        if envelope.queue in AGENT_QUEUES:
            done = await self.run(lambda: self._agent(envelope.message, fault), None)  # type: ignore[arg-type]
        elif envelope.queue == QUEUES["responses"]:
            done = await self.run(lambda: handle_response(body, self.rt), crash_after)
            if done:
                self.consumed.append(envelope.message)  # type: ignore[arg-type]
        elif envelope.queue == QUEUES["commands"] and isinstance(envelope.message, DueRows):
            # Rows a tick handed out: recovered by whichever instance takes them, on its clock.
            before = {o.order_id: o for o in self.store.orders()}
            done = await self.run(lambda: handle_command(body, self.recovery_rt), crash_after)
            await self._check_none_early(before, self.recovery_offset)
        elif envelope.queue == QUEUES["commands"]:
            done = await self.run(lambda: handle_command(body, self.rt), crash_after)
        else:
            raise AssertionError(f"nothing consumes {envelope.queue}")
        if done and not keep:
            self.pending.remove(envelope)

    async def land_late(self, index: int) -> None:
        request = self.parked.pop(index % len(self.parked))
        await self.run(lambda: self._answer(request, decline=False), None)

    async def tick(self, crash_after=None) -> bool:  # type: ignore[no-untyped-def]
        """A Supervisor tick, on the Supervisor's own clock; it must find no order late that is
        not late in real time (the world's)."""
        before = {o.order_id: o for o in self.store.orders()}
        inline = self.inline_rows
        done = await self.run(lambda: run_tick(self.supervisor_rt, inline_rows=inline), crash_after)
        await self._check_none_early(before, self.supervisor_offset)
        return done

    async def _check_none_early(self, before: dict[str, Order], offset: timedelta) -> None:
        for order in self.store.orders():
            was = before.get(order.order_id)
            if was is not None and order.timeline_seq > was.timeline_seq:
                await self._check_not_early(was, offset)

    async def cancel(self, order_id: str, crash_after=None) -> bool:  # type: ignore[no-untyped-def]
        return await self.run(
            lambda: control.cancel(self.rt, order_id, actor="operator:alice", reason="test"),
            crash_after,
        )

    async def resubmit(self, order_id: str, crash_after=None) -> bool:  # type: ignore[no-untyped-def]
        return await self.run(
            lambda: control.resubmit(self.rt, order_id, actor="operator:alice", reason="test"),
            crash_after,
        )

    async def restart(self, order_id: str, step: str, crash_after=None) -> bool:  # type: ignore[no-untyped-def]
        return await self.run(
            lambda: control.restart(
                self.rt, order_id, step=step, actor="operator:alice", reason="test"
            ),
            crash_after,
        )

    async def migrate(self, crash_after=None) -> bool:  # type: ignore[no-untyped-def]
        """Move every order in flight on order@1 that may move onto order@2."""
        return await self.run(
            lambda: migration.migrate(
                self.rt, "order@1", "order@2", actor="operator:alice", reason="test", dry_run=False
            ),
            crash_after,
        )

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def compensating(self) -> bool:
        return any(o.state is ProcessState.COMPENSATING for o in self.store.orders())

    async def hosts_silent(self, deadlines: int) -> None:
        """The agents' host freezes while the Scheduler and the Supervisor run on: for
        ``deadlines`` rounds, every agent request is held unanswered past its CompleteBy, the
        Supervisor releases what is overdue, and due retries are claimed. Then it wakes and
        takes up what it held, each after its complete-by."""
        budget = max(s.deadline_budget for flow in self.rt.workflows.values() for s in flow.steps)
        for _ in range(deadlines):
            for envelope in self.deliverable("agent"):
                self.pending.remove(envelope)
                self.frozen.append(envelope)
            self.advance(budget.total_seconds() + 1)
            await self.tick()
            self.advance(RETRY_CAP.total_seconds() + 1)
            for envelope in self.deliverable("commands"):
                await self.deliver(envelope)
        self.pending += self.frozen
        self.frozen = []

    # ------------------------------------------------------------------------------ agent

    async def _agent(self, request: AgentRequest, fault: Fault) -> None:
        if request.complete_by <= self.now:  # not carried out: its time is over
            await self._reply(request, "transient", EXPIRED)
            return
        if fault == "lost_before":
            return
        if fault == "late":
            self.parked.append(request)
            return
        if fault in ("transient", "deferred"):
            await self._reply(request, fault)
            return
        outcome, code = self.services.call(
            request, decline=fault == "decline", refuse_undo=fault == "refuse_undo"
        )
        if fault == "timed_out":  # it took effect, but the run budget ran out before the answer
            await self._reply(request, "transient", "timed_out")
        elif fault != "lost_after":
            await self._reply(request, outcome, code)

    async def _answer(self, request: AgentRequest, decline: bool) -> None:
        outcome, code = self.services.call(request, decline=decline)
        await self._reply(request, outcome, code)

    async def _reply(self, request: AgentRequest, outcome: str, code: str | None = None) -> None:
        response = AgentResponse(
            order_id=request.order_id,
            step=request.step,
            operation=request.operation,
            attempt=request.attempt,
            idempotency_key=request.idempotency_key,
            responded_at=self.now,
            **self._outcome(outcome, code),  # type: ignore[arg-type]
        )
        await self.bus.send(QUEUES["responses"], response)

    def _outcome(self, outcome: str, code: str | None) -> dict[str, object]:
        if outcome == "transient":
            return {"outcome": "failed", "transient": True, "error_code": code or "unavailable"}
        if outcome == "deferred":
            return {"outcome": "deferred", "retry_at": self.now + timedelta(seconds=7)}
        if outcome == "failed":
            return {"outcome": "failed", "error_code": code}
        return {"outcome": outcome}

    # ------------------------------------------------------------------------------- lies

    async def answer_unasked(
        self,
        order_id: str,
        *,
        step: int,
        operation: ids.Operation,
        newer: bool,
        attempt: int,
        lie: Lie,
    ) -> None:
        """Deliver a validly signed answer to a request ``order_id`` never asked for: the
        ``step``-th step's ``operation`` under the key its next request would carry (or the
        next generation's, ``newer``), as an attempt the order used for something else or not
        yet; unless the order did ask for exactly that."""
        order = await self.store.find(order_id)
        if order is None or (operation == "do" and lie == "nothing_to_undo"):
            return
        record = order.steps[step % len(order.steps)]
        key = ids.idempotency_key(
            order_id, record.name, operation, _next_generation(order, record) + newer
        )
        used = sorted({asked[4] for asked in self.store.asked if asked[0] == order_id})
        choices = [*used, order.attempt + 1]
        number = choices[attempt % len(choices)]
        if (order_id, record.name, operation, key, number) in self.store.asked:
            return
        outcome = {"refused": "failed"}.get(lie, lie)
        answer = AgentResponse(
            order_id=order_id,
            step=record.name,
            operation=operation,
            attempt=number,
            idempotency_key=key,
            responded_at=self.now,
            resume=self._resume_of(order_id),
            **self._outcome(outcome, "declined"),  # type: ignore[arg-type]
        )
        self.lies.append(answer)
        await self.run(lambda: handle_response(encode(answer), self.rt))

    def _resume_of(self, order_id: str) -> str | None:
        """The snapshot a lie carries (none here: the order is read)."""
        return None

    # ----------------------------------------------------------------------------- drain

    async def drain(self, max_rounds: int = 400) -> None:
        """Let everything finish without faults: deliver, land what hangs, tick, let time go."""
        self.replies.refusing = False
        for _ in range(max_rounds):
            while self.parked:
                await self.land_late(0)
            ready = [e for e in self.pending if e.due <= self.now and e.queue != REPLY_QUEUE]
            ready = [e for e in ready if e.queue != QUEUES["alerts"]]
            if ready:
                for envelope in ready:
                    await self.deliver(envelope)
                continue
            if self.quiet():
                return
            if self._supervisor_finds_due():
                await self.tick()
            if not [e for e in self.pending if e.due <= self.now and _consumed(e)]:
                self.advance(15)
        raise AssertionError(f"not quiet after {max_rounds} rounds: {self.describe()}")

    def _supervisor_finds_due(self) -> bool:
        """Whether a tick now would find an index row due, on the Supervisor's clock. One that
        would not touches no order (a tick reads and acts on due rows only, and only renews
        its leases otherwise), so the drain lets time go without it: most of its rounds wait
        out a retry delay or a deadline."""
        now = self.supervisor_clock()
        return any(row.due_at <= now for row in self.store.index.rows())

    def quiet(self) -> bool:
        return (
            all(o.state.terminal for o in self.store.orders())
            and not self.store.index.rows()
            and not [e for e in self.pending if _consumed(e)]
        )

    def describe(self) -> str:
        orders = [
            (o.order_id, o.state.value, o.current_step, o.current_operation, o.locked_by)
            for o in self.store.orders()
        ]
        index = [(r.order_id, r.generation) for r in self.store.index.rows()]
        return f"orders={orders} index={index} pending={len(self.pending)}"

    # ------------------------------------------------------------------------- checking

    def sent(self, queue: str) -> list[MessageBase]:
        return self.bus.on(queue)

    def terminal_alerts(self) -> Counter[str]:
        return self._alerts(TERMINAL_ALERT_REASONS)

    def _alerts(self, reasons: frozenset[str]) -> Counter[str]:
        return Counter(
            a.order_id or ""
            for a in self.sent(QUEUES["alerts"])
            if isinstance(a, OperatorAlert) and a.reason in reasons
        )

    async def compensations(self, order_id: str) -> list[tuple[datetime, datetime | None]]:
        """Each compensation of the order: when it started, and when it ended in Error (None:
        it has not)."""
        found: list[tuple[datetime, datetime | None]] = []
        for entry in await self.store.get_timeline(order_id):
            if entry.event in ("compensation_started", "compensation_resumed"):
                found.append((entry.at, None))
            elif found and found[-1][1] is None and entry.to_state is ProcessState.ERROR:
                found[-1] = (found[-1][0], entry.at)
        return found

    async def budget_spent(self, order_id: str) -> bool:
        """Whether the order's last compensation ended in Error only once it had lasted its
        budget."""
        spans = await self.compensations(order_id)
        if not spans or spans[-1][1] is None:
            return False
        started, ended = spans[-1]
        return ended - started >= COMPENSATION_BUDGET  # type: ignore[operator]

    async def error_entries(self, order_id: str) -> int:
        return sum(
            1
            for e in await self.store.get_timeline(order_id)
            if e.to_state is ProcessState.ERROR and e.from_state is not ProcessState.ERROR
        )

    def statuses(self, order_id: str) -> list[int]:
        return [u.sequence for u in self.updates(order_id)]

    def updates(self, order_id: str) -> list[StatusUpdate]:
        """The status updates the submitter received for ``order_id``, in arrival order."""
        return [
            s
            for s in self.sent(REPLY_QUEUE)
            if isinstance(s, StatusUpdate) and s.order_id == order_id
        ]

    async def finishes(self, order_id: str) -> int:
        """How often the order entered Processed or Error (an operator may resubmit it)."""
        return sum(
            1
            for e in await self.store.get_timeline(order_id)
            if e.to_state.terminal and (e.from_state is None or not e.from_state.terminal)
        )

    def forward_keys(self, order_id: str) -> set[str]:
        """Every forward key the app ever requested for ``order_id`` of a step that can be
        undone (a step with no undo, such as order@2's verify_address, stays in effect)."""
        flows = self.rt.workflows.values()
        irreversible = {step.name for flow in flows for step in flow.steps if not step.compensable}
        return {
            message.undoes or message.idempotency_key
            for queue in AGENT_QUEUES
            for message in self.sent(queue)
            if isinstance(message, AgentRequest)
            and message.order_id == order_id
            and message.step not in irreversible
        }

    async def check_safety(self) -> None:
        """What must hold after every step, crashes included."""
        alerts = self.terminal_alerts()
        warnings = self._alerts(frozenset({COMPENSATION_DELAYED}))
        for order in self.store.orders():
            entries = await self.error_entries(order.order_id)
            assert alerts[order.order_id] <= entries, (
                f"{order.order_id}: {alerts[order.order_id]} terminal alerts for "
                f"{entries} entries into Error"
            )
            compensations = len(await self.compensations(order.order_id))
            assert warnings[order.order_id] <= compensations, (
                f"{order.order_id}: {warnings[order.order_id]} compensation warnings for "
                f"{compensations} compensations"
            )
            sequences = self.statuses(order.order_id)
            assert sequences == list(range(len(sequences))), (
                f"{order.order_id}: status sequences out of order or with a gap: {sequences}"
            )
            if order.state.in_flight:
                row = self.store.index.get(order.order_id, order.generation)
                assert row is not None, f"{order.order_id} is in flight without an index row"
                self._check_row_in_time(order, row)
            if order.state is ProcessState.PROCESSED:
                for step in order.steps:
                    key = step.forward_key(order.order_id)
                    assert self.services.in_place(key), (
                        f"{order.order_id} is Processed but {step.name} ({key}) is not in place"
                    )
        for key, count in self.services.effects.items():
            assert count == 1, f"{key} took effect {count} times"
        for order in self.store.orders():
            for step in order.steps:
                self._check_agrees(order.order_id, step)
            await self._check_after_the_end(order.order_id)
        for reply in self.consumed:
            await self._check_applied(reply)
        self._check_lies_alerted()
        self._check_only_copies_dropped()

    async def _check_not_early(self, was: Order, offset: timedelta) -> None:
        """A Supervisor that recovered ``was`` for being late did so no earlier, in real time,
        than it was late by the stamps of the hosts that wrote it, whatever its own clock."""
        timeline = await self.store.get_timeline(was.order_id)
        recovered = [
            e
            for e in timeline
            if e.seq > was.timeline_seq
            and e.actor.startswith("supervisor:")
            and e.event in RECOVERIES
        ]
        if not recovered or was.state.terminal:
            return
        if was.locked_by is not None and was.complete_by is not None:
            late_at = was.complete_by
        else:
            stale = self.rt.settings.pending_stale_after
            late_at = (was.next_attempt_at or was.updated_at) + stale
        early = (late_at - self.now).total_seconds()
        assert early <= 0, (
            f"{was.order_id}: recovered ({recovered[0].event}) {early} s before it was late, "
            f"by a Supervisor {offset} off"
        )

    def _check_row_in_time(self, order: Order, row: ActiveRow) -> None:
        """An order's index row is due no later than the order; or, while a tick has handed it
        out (its order due already), no later than the hand-out's lease: a hand-out that nobody
        carries out (its message lost, its recovery failed) ends in time for the next tick."""
        due = apply.due(self.rt, order)
        if row.due_at <= due:
            return
        lease = self.rt.settings.supervisor_claim
        assert row.dispatch_id and row.dispatched_at is not None, (
            f"{order.order_id}: index row due {row.due_at}, later than the order's {due}, "
            "and not handed out: the Supervisor would look too late"
        )
        assert row.due_at <= row.dispatched_at + lease, (
            f"{order.order_id}: handed-out row due {row.due_at}, past its hand-out's lease "
            f"({row.dispatched_at} + {lease})"
        )

    def _check_agrees(self, order_id: str, step: StepRecord) -> None:
        """A step's recorded state agrees with what its service was asked and answered."""
        if step.state is StepState.PENDING:
            return
        key = step.forward_key(order_id)
        forward = self.services.forward.get(key)
        asked = {(a[2], a[3]) for a in self.store.asked if a[:2] == (order_id, step.name)}
        undo_asked = ("undo", step.key(order_id, "undo")) in asked
        never = forward in ("declined", "tombstoned")  # no effect, and none ever
        truth = {
            StepState.RUNNING: ("do", key) in asked,
            StepState.SUCCEEDED: forward == "done",
            StepState.FAILED: never,
            StepState.COMPENSATED: undo_asked and key in self.services.undone,
            StepState.VOIDED: undo_asked and never,
        }
        assert truth[step.state], (
            f"{order_id}: {step.name} is {step.state}, but its service was asked "
            f"{sorted(asked)} and holds {key} as {forward or 'never applied'}"
            f"{' (undone)' if key in self.services.undone else ''}"
        )

    async def _check_after_the_end(self, order_id: str) -> None:
        """Once an order ended, only its settling changes it: ``settling`` rows and one
        ``settled``, if its ``error`` row said it ended settling; nothing once it is settled
        (until an operator puts it back in flight). Rows that change what is recorded about
        it, not the order (:data:`RECORD_ROWS`), may come at any time."""
        settling = False
        for entry in await self.store.get_timeline(order_id):
            if entry.from_state is None or not entry.from_state.terminal:
                settling = "; settling: " in entry.detail
                continue
            if entry.to_state.terminal and entry.event not in RECORD_ROWS:
                assert settling and entry.event in ("settling", "settled"), (
                    f"{order_id}: {entry.event} ({entry.detail}) after it ended settled"
                )
                settling = entry.event == "settling"

    def _check_lies_alerted(self) -> None:
        """Each distinct answer to a request never asked for raised one alert, and no answer
        to a request the app did ask for raised one."""
        alerts = [
            a
            for a in self.sent(QUEUES["alerts"])
            if isinstance(a, OperatorAlert) and a.reason == UNREQUESTED_REASON
        ]
        lies = {(a.idempotency_key, a.attempt, a.outcome, a.transient) for a in self.lies}
        named = {f"attempt {attempt}, key {key}," for key, attempt, *_ in lies}
        for alert in alerts:
            assert any(lie in alert.detail for lie in named), f"not a lie: {alert.detail}"
        assert len(alerts) == len(lies), (
            f"{len(alerts)} {UNREQUESTED_REASON} alerts for {len(lies)} answers to requests "
            f"never asked for: {[a.detail for a in alerts]}"
        )

    def _check_only_copies_dropped(self) -> None:
        """Every message the bus dropped as a duplicate is a copy of the one it kept under that
        MessageId: the same message but for what copies may differ in (domain.messages, "Message
        ids"): a request's snapshot, an answer to the same request, an alert's time and author."""
        for kept, dropped in self.bus.dropped[self._dropped_seen :]:
            assert _one_message(kept, dropped), (
                f"{message_id_for(kept)} names two messages: kept {kept!r}, dropped {dropped!r}"
            )
        self._dropped_seen = len(self.bus.dropped)

    async def _check_applied(self, reply: AgentResponse) -> None:
        """A definitive answer, once handled, is never thrown away: its step shows it."""
        allowed = ANSWER_STATES.get((reply.operation, reply.outcome, reply.transient))
        if allowed is None:
            return
        step = (await self.store.load(reply.order_id)).step(reply.step)
        if step.generation != reply.generation:
            return  # a resubmission started the step again under new keys
        assert step.state in allowed, (
            f"{reply.order_id}: {reply.operation} {reply.step} attempt {reply.attempt} answered "
            f"{reply.outcome}, but the step is {step.state}"
        )

    async def check_final(self) -> None:
        """What must hold once everything has settled."""
        await self.check_safety()
        alerts = self.terminal_alerts()
        for order in self.store.orders():
            order_id = order.order_id
            assert order.state.terminal, f"{order_id} stuck in {order.state}"
            entries = await self.error_entries(order_id)
            assert alerts[order_id] == entries, (
                f"{order_id}: {alerts[order_id]} terminal alerts for {entries} entries into Error"
            )
            if order.reply_to is not None:
                await self._check_updates(order)
            if order.state is ProcessState.ERROR:
                known = {s.forward_key(order_id) for s in order.steps if s.state.may_have_effect}
                left = {k for k in self.forward_keys(order_id) if self.services.in_place(k)}
                # Left in place only if its service refused the undo, or the budget ran out;
                # a refused undo ends compensation at once (the operator decides what next), so
                # the steps before the refused one, which it had not reached, stay too.
                if not await self.budget_spent(order_id):
                    index = {s.forward_key(order_id): s.index for s in order.steps if s.generation}
                    refused = set(index) & self.services.refused_undos  # in place or undone since
                    reached = max((index[k] for k in refused if k in index), default=-1)
                    unrefused = {k for k in left - refused if index.get(k, len(index)) > reached}
                    assert not unrefused, (
                        f"{order_id} ended in Error with effects in place whose undo no service "
                        f"refused, within its compensation budget: {unrefused}; "
                        f"last error: {order.last_error}"
                    )
                assert left <= known, f"{order_id}: effects in place it does not know of: {left}"
            for step in order.steps:
                if step.state in (StepState.FAILED, StepState.VOIDED, StepState.COMPENSATED):
                    key = step.forward_key(order_id)
                    assert not self.services.in_place(key), f"{key} is {step.state} but in place"
        assert not self.store.index.rows(), "active index not empty"
        errors = {(r.order_id, r.generation) for r in self.store.errors.rows()}
        expected = {
            (o.order_id, o.generation) for o in self.store.orders() if o.state is ProcessState.ERROR
        }
        assert errors == expected, f"error index {errors} != Error orders {expected}"

    async def _check_updates(self, order: Order) -> None:
        """Every status update 0..StatusSeq-1 arrived, in order; the last one says the state
        the order ended in; exactly one says it finished, each time it did."""
        updates = self.updates(order.order_id)
        sequences = [u.sequence for u in updates]
        assert sequences == list(range(order.status_seq)), (
            f"{order.order_id}: statuses {sequences} of {order.status_seq}"
        )
        if updates:
            assert updates[-1].state == order.state.value, (
                f"{order.order_id} is {order.state}, its last update says {updates[-1].state}"
            )
        finished = [u for u in updates if u.state in ("Processed", "Error")]
        finishes = await self.finishes(order.order_id)
        assert len(finished) == finishes, (
            f"{order.order_id}: {[(u.sequence, u.event, u.state) for u in finished]} say it "
            f"finished; it did {finishes} times"
        )


def _one_message(kept: MessageBase, dropped: MessageBase) -> bool:
    if isinstance(kept, AgentResponse):
        return isinstance(dropped, AgentResponse) and (
            (kept.idempotency_key, kept.attempt) == (dropped.idempotency_key, dropped.attempt)
        )
    if isinstance(kept, DueRows):
        return isinstance(dropped, DueRows) and (kept.bucket, _found(kept)) == (
            dropped.bucket,
            _found(dropped),
        )
    ignored = {"resume"} if isinstance(kept, AgentRequest) else set()
    if isinstance(kept, OperatorAlert):
        ignored = {"raised_at", "source"}
    return type(kept) is type(dropped) and kept.model_dump(exclude=ignored) == dropped.model_dump(
        exclude=ignored
    )


def _found(message: DueRows) -> set[tuple[str, int, datetime]]:
    """What names a hand-out (domain.messages): its rows and the due times they were found at;
    copies may differ in the rows' versions, the lease, the sender and the write id."""
    return {(r.order_id, r.generation, r.found_due) for r in message.rows}


def _next_generation(order: Order, step: StepRecord) -> int:
    """The generation of the key ``step``'s next request carries."""
    return order.generation if step.state is StepState.PENDING else step.generation


def _consumed(envelope: Envelope) -> bool:
    return envelope.queue not in (REPLY_QUEUE, QUEUES["alerts"])


def order_id(n: int) -> str:
    return ids.validate_order_id(f"order-{n}")
