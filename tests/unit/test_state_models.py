"""Table entity shapes of the state store, and its checks that run before any request.

No Azurite: entities are built and read back in memory (tests/integration/test_state_store.py
writes them to a real table).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from azure.data.tables import EntityProperty

from adapters.store.records import OrderRecords
from adapters.store.rows import (
    DETAILS_ROW,
    JSON_CHUNK_CHARS,
    MAX_LAST_ERROR_BYTES,
    MAX_TIMELINE_DETAIL_BYTES,
    PROCESS_ROW,
    SCHEMA_VERSION,
    TIMELINE_END,
    CorruptOrderState,
    details_entity,
    get_json,
    order_entity,
    order_from_entity,
    put_json,
    timeline_entity,
    timeline_from_entity,
    timeline_row_key,
    utc,
)
from adapters.tables import TableService
from domain import ids, lifecycle
from domain.ids import InvalidId
from domain.messages import (
    MESSAGE_TYPES,
    AgentRequest,
    AgentResponse,
    OperatorAlert,
    OrderSubmitted,
    SchedulerCommand,
    StatusUpdate,
)
from domain.order import Failures, Order, Outgoing, Requests, StepRecord, StepState, TimelineEntry
from domain.states import ProcessState
from domain.workflows import ORDER_WORKFLOW
from tests.support.submissions import submission

pytestmark = pytest.mark.anyio

T0 = datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)
PLUS2 = timezone(timedelta(hours=2))
ETAG = "W/\"datetime'2025-03-04T05%3A06%3A07.890123Z'\""
MAX_PROPERTY_BYTES = 64 * 1024  # a Table string property: at most 64 KiB of UTF-16
HOSTILE = "x' or PartitionKey ne '"
TRUNCATED = "...[truncated]"  # the marker domain.messages.truncate_utf8 appends
UNREACHABLE = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "TableEndpoint=http://127.0.0.1:9/devstoreaccount1;"
)


def submitted(order_id: str = "o-1", **overrides: Any) -> OrderSubmitted:
    return submission(order_id, at=T0, **overrides)


def ctx(now: datetime = T0, actor: str = "scheduler-1") -> lifecycle.Context:
    return lifecycle.Context(workflow=ORDER_WORKFLOW, now=now, actor=actor)


def created() -> Order:
    """A new order as the lifecycle makes it: claimed, a StatusUpdate and an AgentRequest owed."""
    decision = lifecycle.submit(submitted(), ctx())
    assert decision.order is not None
    return dataclasses.replace(decision.order, etag=ETAG, write_id="w-1")


def request(order_id: str = "o-1", *, undo: bool = False, payload: Any = None) -> AgentRequest:
    operation: ids.Operation = "undo" if undo else "do"
    return AgentRequest(
        order_id=order_id,
        step="charge_payment",
        operation=operation,
        action="refund" if undo else "charge",
        attempt=7,
        complete_by=T0 + timedelta(seconds=30),
        idempotency_key=ids.idempotency_key(order_id, "charge_payment", operation, 2),
        undoes=ids.idempotency_key(order_id, "charge_payment", "do", 2) if undo else None,
        payload=payload if payload is not None else {"amount": 1500, "items": [{"sku": "a"}]},
        requested_at=T0,
    )


def every_message_outbox(order_id: str = "o-1") -> tuple[Outgoing, ...]:
    return (
        Outgoing(
            "reply",
            StatusUpdate(
                order_id=order_id,
                sequence=4,
                state="Compensating",
                event="compensating",
                step="charge_payment",
                detail="card declined; undoing charge_payment ✓",
                updated_at=T0,
            ),
        ),
        Outgoing(
            "alerts",
            OperatorAlert(
                order_id=order_id,
                severity="critical",
                reason="compensation_incomplete",
                detail="refund refused",
                raw_excerpt='{"x": 1}',
                source="scheduler-1",
                timeline_seq=7,
                raised_at=T0,
            ),
        ),
        Outgoing(
            "commands",
            SchedulerCommand(
                order_id=order_id,
                command="retry",
                attempt=7,
                failure_count=2,
                reason="payment timed out",
                requested_by="supervisor-1",
                requested_at=T0,
            ),
            not_before=datetime(2025, 3, 4, 7, 6, 8, 1, tzinfo=PLUS2),
        ),
        Outgoing("payment", request(order_id, undo=True)),
    )


def every_step_state() -> tuple[StepRecord, ...]:
    later = T0 + timedelta(seconds=3, microseconds=7)
    return (
        StepRecord(
            "reserve_inventory",
            0,
            StepState.COMPENSATED,
            generation=2,
            attempt=3,
            result={"reservation": "r-1", "lines": [1, 2.5, None, True], "ü": {"😀": "é"}},
            completed_at=T0,
            compensated_at=later,
            requests=(Requests("do", 1, 2), Requests("undo", 6, 7)),
        ),
        StepRecord(
            "charge_payment",
            1,
            StepState.FAILED,
            generation=2,
            attempt=2,
            error_code="card_declined",
            error_message="insufficient funds",
            completed_at=datetime(2025, 3, 4, 7, 6, 7, tzinfo=PLUS2),
        ),
        StepRecord(
            "create_shipment",
            2,
            StepState.RUNNING,
            generation=1,
            attempt=9,
            requests=(Requests("do", 3, 3),),
            forward_failures=Failures(at_service=1, unanswered=(3,)),
            undo_failures=Failures(at_service=2, on_our_side=1, unanswered=(7, 8)),
        ),
        StepRecord("gift_wrap", 3, StepState.SUCCEEDED, 1, 1, {}, completed_at=later),
        StepRecord("notify", 4, StepState.VOIDED, 1, 1, None, compensated_at=later, requests=None),
        StepRecord("archive", 5, StepState.PENDING),
    )


def rich_order() -> Order:
    return dataclasses.replace(
        created(),
        state=ProcessState.COMPENSATING,
        locked_by="scheduler-2@host:1",
        complete_by=T0 + timedelta(seconds=30),
        failure_count=2,
        attempt=7,
        generation=2,
        current_step="charge_payment",
        current_operation="undo",
        payload={"order_id": "o-1", "amount": 1500, "nested": {"list": [1, "two", None]}},
        steps=every_step_state(),
        next_attempt_at=T0 + timedelta(minutes=1),
        last_error="refund timed out",
        compensation_cause="step_declined",
        compensation_reason="charge_payment declined: card_declined",
        compensation_started_at=T0 - timedelta(hours=2),
        compensation_warned=True,
        status_seq=5,
        outbox=every_message_outbox(),
        timeline_seq=12,
        trace_parent=TRACE_PARENT,
        updated_at=T0 + timedelta(seconds=9),
    )


TRACE_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def utf16_bytes(value: str) -> int:
    return len(value.encode("utf-16-le"))


def as_read(entity: dict[str, Any]) -> dict[str, Any]:
    """What the Table returns: None properties are not stored."""
    return {key: value for key, value in entity.items() if value is not None}


# --------------------------------------------------------------------------- trace parent


class TestTraceParent:
    def test_it_round_trips_as_one_property(self):
        entity = order_entity(rich_order())
        assert entity["TraceParent"] == TRACE_PARENT
        assert order_from_entity(as_read(entity), "etag").trace_parent == TRACE_PARENT

    def test_an_order_without_one_stores_no_property(self):
        entity = as_read(order_entity(created()))
        assert "TraceParent" not in entity
        assert order_from_entity(entity, "etag").trace_parent is None

    @pytest.mark.parametrize(
        "stored",
        [TRACE_PARENT.upper(), TRACE_PARENT + "-x", "x" * 70_000, "", 17, "01" + TRACE_PARENT[2:]],
    )
    def test_a_malformed_one_is_neither_written_nor_read(self, stored):
        forged = dataclasses.replace(rich_order(), trace_parent=stored)
        assert "TraceParent" not in as_read(order_entity(forged))
        entity = as_read(order_entity(rich_order())) | {"TraceParent": stored}
        order = order_from_entity(entity, "etag")
        assert order.trace_parent is None  # dropped, and the order is still readable
        assert order.order_id == "o-1"


# ------------------------------------------------------------------------------- row keys


class TestRowKeys:
    def test_timeline_keys_sort_in_order_after_the_order_rows(self):
        keys = [timeline_row_key(n) for n in (0, 9, 10, 99_999_999)]
        assert keys == sorted(keys)
        assert keys[0] == "timeline-00000000"
        assert DETAILS_ROW < PROCESS_ROW < keys[0] < keys[-1] < TIMELINE_END

    @pytest.mark.parametrize("seq", [-1, 100_000_000])
    def test_timeline_sequence_bounds(self, seq):
        with pytest.raises(ValueError, match="outside"):
            timeline_row_key(seq)


# ----------------------------------------------------------------------------- json parts


class TestJsonChunks:
    @pytest.mark.parametrize("length", [0, 1, JSON_CHUNK_CHARS, JSON_CHUNK_CHARS + 1, 70_000])
    def test_round_trip(self, length):
        entity: dict = {}
        text = ("😀a" * length)[:length]
        put_json(entity, "Result", text)
        assert entity["ResultParts"] == max(1, -(-length // JSON_CHUNK_CHARS))
        assert all(utf16_bytes(v) <= 64_000 for v in entity.values() if isinstance(v, str))
        assert get_json(entity, "Result") == text

    def test_absent_is_none(self):
        assert get_json({}, "Result") is None

    def test_a_missing_part_is_corrupt(self):
        entity: dict = {"PartitionKey": "o-1"}
        put_json(entity, "Result", "x" * (JSON_CHUNK_CHARS * 2 + 1))
        del entity["ResultPart1"]
        with pytest.raises(CorruptOrderState, match="Result of o-1 has a missing part"):
            get_json(entity, "Result")

    def test_parts_count_may_be_an_entity_property(self):
        entity: dict = {}
        put_json(entity, "Result", "y" * (JSON_CHUNK_CHARS + 5))
        entity["ResultParts"] = EntityProperty(2, "Edm.Int32")
        assert get_json(entity, "Result") == "y" * (JSON_CHUNK_CHARS + 5)


# ---------------------------------------------------------------------------------- utc


class TestUtc:
    def test_refuses_naive(self):
        with pytest.raises(ValueError, match="no timezone"):
            utc(datetime(2025, 1, 1))

    def test_normalises_to_plain_utc(self):
        plus2 = datetime(2025, 1, 1, 12, 0, 0, 5, tzinfo=PLUS2)
        result = utc(plus2)
        assert result == datetime(2025, 1, 1, 10, 0, 0, 5, tzinfo=UTC)
        assert result.tzinfo is UTC
        assert type(result) is datetime

    def test_subclasses_become_plain_datetimes(self):
        class TablesDatetime(datetime):  # what the SDK returns for Edm.DateTime
            pass

        value = TablesDatetime(2025, 1, 1, tzinfo=UTC)
        assert type(utc(value)) is datetime


# ------------------------------------------------------------------------------- process


class TestProcessRow:
    def test_new_order_round_trips(self):
        order = created()
        kinds = [type(o.message) for o in order.outbox]
        assert kinds[-1] is AgentRequest and set(kinds[:-1]) == {StatusUpdate}
        entity = order_entity(order)
        assert (entity["PartitionKey"], entity["RowKey"]) == ("o-1", PROCESS_ROW)
        assert entity["SchemaVersion"] == SCHEMA_VERSION
        assert (entity["OrderID"], entity["ProcessState"]) == ("o-1", "Processing")
        assert entity["WriteId"] == "w-1"
        assert order_from_entity(entity, ETAG) == order

    def test_rich_order_round_trips(self):
        order = rich_order()
        assert {s.state for s in order.steps} == set(StepState)
        outbox_types = {type(o.message) for o in order.outbox}
        assert outbox_types == {AgentRequest, StatusUpdate, OperatorAlert, SchedulerCommand}
        back = order_from_entity(order_entity(order), ETAG)
        assert back == order
        assert back.etag == ETAG
        undo = back.outbox[-1].message
        assert isinstance(undo, AgentRequest) and undo.undoes == "o-1:charge_payment:do:2"
        assert back.outbox[2].not_before == datetime(2025, 3, 4, 5, 6, 8, 1, tzinfo=UTC)

    def test_steps_keep_the_requests_they_sent(self):
        entity = order_entity(rich_order())
        steps = {step["name"]: step for step in json.loads(get_json(entity, "Steps") or "")}
        assert steps["reserve_inventory"]["requests"] == [["do", 1, 2], ["undo", 6, 7]]
        assert steps["notify"]["requests"] is None  # not known
        back = order_from_entity(entity, ETAG)
        assert back.step("create_shipment").requests == (Requests("do", 3, 3),)
        assert back.step("notify").requests is None

    def test_a_row_written_before_steps_recorded_their_requests_loads(self):
        entity = order_entity(rich_order())
        steps = json.loads(get_json(entity, "Steps") or "")
        for step in steps:
            del step["requests"]
        put_json(entity, "Steps", json.dumps(steps))
        back = order_from_entity(entity, ETAG)
        # A Pending step has sent nothing in its generation; of any other, it is not known.
        assert {s.name: s.requests for s in back.steps} == {
            "reserve_inventory": None,
            "charge_payment": None,
            "create_shipment": None,
            "gift_wrap": None,
            "notify": None,
            "archive": (),
        }

    @pytest.mark.parametrize(
        "requests",
        [[["do", 0, 1]], [["do", 2, 1]], [["sideways", 1, 1]], [["do", 1]], [["do", "1", 2]], 7],
    )
    def test_malformed_requests_make_the_row_unreadable(self, requests):
        entity = order_entity(rich_order())
        steps = json.loads(get_json(entity, "Steps") or "")
        steps[0]["requests"] = requests
        put_json(entity, "Steps", json.dumps(steps))
        with pytest.raises(CorruptOrderState, match="process row of o-1 is unreadable"):
            order_from_entity(entity, ETAG)

    def test_every_datetime_reads_back_as_plain_utc(self):
        back = order_from_entity(order_entity(rich_order()), ETAG)
        stamps = [back.created_at, back.updated_at, back.complete_by, back.next_attempt_at]
        stamps += [s.completed_at for s in back.steps if s.completed_at]
        stamps += [s.compensated_at for s in back.steps if s.compensated_at]
        stamps += [o.not_before for o in back.outbox if o.not_before]
        assert len(stamps) == 10
        assert all(type(s) is datetime and s.tzinfo is UTC for s in stamps)
        assert back.step("charge_payment").completed_at == datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)

    def test_round_trips_without_its_null_properties(self):
        order = dataclasses.replace(
            created(),
            locked_by=None,
            complete_by=None,
            reply_to=None,
            last_error=None,
            outbox=(),
        )
        entity = as_read(order_entity(order))
        assert "LockedBy" not in entity and "CompleteBy" not in entity
        assert order_from_entity(entity, ETAG) == order

    def test_every_property_is_a_table_type(self):
        for name, value in order_entity(rich_order()).items():
            assert value is None or isinstance(value, str | int | datetime | EntityProperty), name
            if isinstance(value, str):
                assert utf16_bytes(value) <= MAX_PROPERTY_BYTES, name

    def test_each_message_type_round_trips_in_the_outbox(self):
        for outgoing in every_message_outbox():
            order = dataclasses.replace(created(), outbox=(outgoing,))
            entity = order_entity(order)
            [item] = json.loads(get_json(entity, "Outbox") or "")
            assert MESSAGE_TYPES[item["type"]] is type(outgoing.message)
            assert order_from_entity(entity, ETAG).outbox == (outgoing,)

    def test_a_payload_over_64_kib_is_split_and_read_back(self):
        payload = {"blob": "é😀" * 40_000, "n": list(range(2_000))}
        order = dataclasses.replace(created(), payload=payload)
        entity = order_entity(order)
        assert entity["AgentPayloadParts"] > 2
        assert "AgentPayloadPart2" in entity
        assert all(
            utf16_bytes(v) <= MAX_PROPERTY_BYTES for v in entity.values() if isinstance(v, str)
        )
        assert order_from_entity(entity, ETAG).payload == payload

    def test_an_outbox_over_64_kib_is_split_and_read_back(self):
        big = request(payload={"blob": "x" * 100_000})
        order = dataclasses.replace(
            created(), outbox=(*every_message_outbox(), Outgoing("payment", big))
        )
        entity = order_entity(order)
        assert entity["OutboxParts"] > 1
        assert order_from_entity(entity, ETAG) == order

    def test_large_step_results_are_split_and_read_back(self):
        steps = tuple(
            dataclasses.replace(s, result={"blob": "ü" * 30_000}) for s in every_step_state()
        )
        order = dataclasses.replace(created(), steps=steps)
        entity = order_entity(order)
        assert entity["StepsParts"] > 1
        assert order_from_entity(entity, ETAG).steps == steps

    def test_long_errors_are_clipped_to_whole_characters(self):
        long = "€" * 5_000  # 15,000 bytes of UTF-8
        order = dataclasses.replace(
            created(),
            last_error=long,
            compensation_reason=long,
            steps=(dataclasses.replace(created().steps[0], error_message=long),),
        )
        back = order_from_entity(order_entity(order), ETAG)
        for text in (back.last_error, back.compensation_reason, back.steps[0].error_message):
            assert text is not None and text.endswith(TRUNCATED)
            assert long.startswith(text.removesuffix(TRUNCATED))
            assert len(text.encode("utf-8")) <= MAX_LAST_ERROR_BYTES


class TestUnreadableProcessRow:
    @pytest.mark.parametrize(
        "damage",
        [
            {"ProcessState": "Bogus"},
            {"ProcessState": None},
            {"CurrentStep": None},
            {"CreatedAt": datetime(2025, 1, 1)},
            {"CurrentOperation": "redo"},
            {"Attempt": "many"},
            {"Steps": "not json"},
            {"Steps": "[1]"},
            {"Steps": '[{"name": "a"}]'},
            {"Steps": '[{"name":"a","index":0,"state":"Lost","generation":1,"attempt":0}]'},
            {"Outbox": '{"to": "alerts"}'},
            {"Outbox": "null"},
            {"Outbox": '[{"to": "alerts", "type": "Nope", "message": {}}]'},
            {"Outbox": '[{"to": "alerts", "type": "OperatorAlert", "message": {"x": 1}}]'},
            {"AgentPayloadParts": 2},
        ],
        ids=lambda d: ",".join(f"{k}={v!r}"[:40] for k, v in d.items()),
    )
    def test_raises_corrupt_order_state_naming_the_row(self, damage):
        entity = order_entity(created())
        for key, value in damage.items():
            if value is None:
                del entity[key]
            else:
                entity[key] = value
        with pytest.raises(CorruptOrderState, match="o-1") as caught:
            order_from_entity(entity, ETAG)
        message = str(caught.value)
        assert "process row of o-1" in message or "AgentPayload of o-1" in message


# ------------------------------------------------------------------------------ timeline


def entry(**overrides: Any) -> TimelineEntry:
    fields: dict[str, Any] = {
        "seq": 3,
        "at": T0,
        "actor": "scheduler-1",
        "event": "step_succeeded",
        "from_state": ProcessState.PROCESSING,
        "to_state": ProcessState.COMPENSATING,
        "step": "charge_payment",
        "attempt": 4,
        "detail": "charge_payment declined; to undo: reserve_inventory",
    }
    fields.update(overrides)
    return TimelineEntry(**fields)


class TestTimelineRow:
    def test_round_trip(self):
        row = timeline_entity("o-1", entry())
        assert (row["PartitionKey"], row["RowKey"]) == ("o-1", "timeline-00000003")
        assert (row["FromState"], row["ToState"]) == ("Processing", "Compensating")
        assert timeline_from_entity(row) == entry()

    def test_first_entry_without_from_state_or_step(self):
        first = entry(seq=0, from_state=None, step=None, detail="", at=T0.astimezone(PLUS2))
        back = timeline_from_entity(as_read(timeline_entity("o-1", first)))
        assert back == first
        assert back.at.tzinfo is UTC

    def test_lifecycle_entry_round_trips(self):
        decision = lifecycle.submit(submitted(), ctx())
        assert decision.entry is not None
        assert timeline_from_entity(timeline_entity("o-1", decision.entry)) == decision.entry

    def test_detail_is_truncated_to_whole_characters(self):
        detail = "ü" * 3_000 + "tail"  # 6,004 bytes of UTF-8
        row = timeline_entity("o-1", entry(detail=detail))
        kept = row["Detail"]
        assert kept.endswith(TRUNCATED) and detail.startswith(kept.removesuffix(TRUNCATED))
        assert len(kept.encode("utf-8")) <= MAX_TIMELINE_DETAIL_BYTES
        assert timeline_from_entity(row).detail == kept

    @pytest.mark.parametrize(
        "damage", [{"ToState": "Bogus"}, {"Seq": None}, {"At": None}, {"FromState": "Nope"}]
    )
    def test_unreadable_row_is_corrupt(self, damage):
        row = timeline_entity("o-1", entry())
        for key, value in damage.items():
            if value is None:
                del row[key]
            else:
                row[key] = value
        with pytest.raises(CorruptOrderState, match="timeline row timeline-00000003 of o-1"):
            timeline_from_entity(row)


# ------------------------------------------------------------------------------- details


class TestDetailsRow:
    def test_round_trip(self):
        order = submitted()
        row = details_entity(order, order.content_hash())
        assert (row["PartitionKey"], row["RowKey"]) == ("o-1", DETAILS_ROW)
        assert row["TotalCents"].value == 1500 and row["TotalCents"].edm_type == "Edm.Int64"
        assert row["ItemCount"] == 1
        assert row["PayloadHash"] == order.content_hash()
        assert OrderSubmitted.model_validate_json(get_json(row, "Payload") or "") == order

    def test_content_hash_ignores_the_submission_time(self):
        again = submitted(submitted_at=T0 + timedelta(minutes=5))
        assert again.content_hash() == submitted().content_hash()
        assert submitted(customer_id="c-2").content_hash() != submitted().content_hash()


def test_states():
    assert ProcessState.PROCESSED.terminal and ProcessState.ERROR.terminal
    assert ProcessState.COMPENSATING.in_flight and ProcessState.PENDING.in_flight
    may = {s for s in StepState if s.may_have_effect}
    assert may == {StepState.RUNNING, StepState.SUCCEEDED}


# -------------------------------------------------------------- refused before any request


class NoRequests(AssertionError):
    pass


@pytest.fixture
def offline_store() -> OrderRecords:
    """A store whose every HTTP request fails the test: what it refuses, it refuses locally."""

    def hook(request):
        raise NoRequests(f"unexpected request {request.method} {request.url}")

    service = TableService.from_connection_string(UNREACHABLE, request_hook=hook)
    return OrderRecords(service, clock=lambda: T0)


def answer(order: Order) -> AgentResponse:
    [sent] = [o.message for o in order.outbox if isinstance(o.message, AgentRequest)]
    return AgentResponse(
        order_id=sent.order_id,
        step=sent.step,
        operation=sent.operation,
        attempt=sent.attempt,
        idempotency_key=sent.idempotency_key,
        outcome="succeeded",
        responded_at=T0,
    )


class TestRefusedBeforeAnyRequest:
    @pytest.mark.parametrize("hostile", [HOSTILE, "../x", "a/b", "", "é", "a" * 65, "~error"])
    async def test_hostile_ids_on_reads(self, offline_store, hostile):
        for call in (
            offline_store.load,
            offline_store.find,
            offline_store.get_order,
            offline_store.get_timeline,
        ):
            with pytest.raises(InvalidId):
                await call(hostile)

    async def test_hostile_id_on_create(self, offline_store):
        decision = lifecycle.submit(submitted(), ctx())
        assert decision.order is not None and decision.entry is not None
        hostile = dataclasses.replace(decision.order, order_id=HOSTILE)
        with pytest.raises(InvalidId):
            await offline_store.create(submitted(), hostile, decision.entry)
        bad_actor = dataclasses.replace(decision.entry, actor="evil/actor")
        with pytest.raises(InvalidId):
            await offline_store.create(submitted(), decision.order, bad_actor)

    async def test_hostile_values_on_save(self, offline_store):
        before = created()
        decision = lifecycle.decide(before, lifecycle.Replied(answer(before)), ctx())
        assert decision.order is not None and decision.entry is not None
        after, step = decision.order, decision.entry
        with pytest.raises(InvalidId):
            await offline_store.save(dataclasses.replace(before, order_id=HOSTILE), after, step)
        with pytest.raises(InvalidId):
            await offline_store.save(before, after, dataclasses.replace(step, actor="a b"))
        with pytest.raises(InvalidId):
            await offline_store.save(before, after, dataclasses.replace(step, event="Drop Table"))
        with pytest.raises(InvalidId):
            await offline_store.annotate(before, actor="evil/actor", event="acknowledged")

    def test_table_names_are_validated(self):
        service = TableService.from_connection_string(UNREACHABLE)
        with pytest.raises(InvalidId):
            OrderRecords(service, orders_table="orders;drop")
        with pytest.raises(ValueError, match="must differ"):
            OrderRecords(service, orders_table="orders", active_table="Orders")

    async def test_list_and_timeline_limits_and_tokens(self, offline_store):
        for bad in (0, 1001):
            with pytest.raises(ValueError, match="limit"):
                await offline_store.list_active(bad)
        for token in ('{"x": 1}', "not json", '{"PartitionKey": 1, "RowKey": "a"}'):
            with pytest.raises(ValueError, match="continuation"):
                await offline_store.list_active(10, continuation=token)
        with pytest.raises(ValueError, match="limit"):
            await offline_store.get_timeline("o-1", limit=0)
