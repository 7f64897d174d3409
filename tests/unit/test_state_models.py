"""State records and the store's checks that run before any request (no Azurite needed)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from azure.data.tables import TableServiceClient

from core.ids import InvalidId
from core.messages import AgentResponse
from core.state_models import (
    JSON_CHUNK_CHARS,
    ProcessRecord,
    StepUpdate,
    get_json,
    put_json,
    step_row_key,
    timeline_row_key,
    utc,
)
from core.state_store import InvalidTransition, OrderStateStore, StaleResult
from core.states import ALLOWED_TRANSITIONS, ProcessState, StepState
from core.workflows import ORDER_WORKFLOW

T0 = datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)
UNREACHABLE = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "TableEndpoint=http://127.0.0.1:9/devstoreaccount1;"
)


class NoRequests(AssertionError):
    pass


@pytest.fixture
def offline_store() -> OrderStateStore:
    """A store whose every HTTP request fails the test: what it refuses, it refuses locally."""

    def hook(request):
        raise NoRequests(f"unexpected request {request.http_request.method}")

    service = TableServiceClient.from_connection_string(UNREACHABLE, raw_request_hook=hook)
    return OrderStateStore(service, clock=lambda: T0)


def process(**overrides) -> ProcessRecord:
    fields = {
        "order_id": "o-1",
        "workflow": "order",
        "state": ProcessState.PROCESSING,
        "locked_by": "scheduler-1",
        "complete_by": T0 + timedelta(seconds=30),
        "failure_count": 0,
        "attempt": 1,
        "generation": 1,
        "current_step": "reserve_inventory",
        "current_operation": "do",
        "reply_to": None,
        "last_error": None,
        "next_attempt_at": None,
        "created_at": T0,
        "updated_at": T0,
        "timeline_seq": 1,
        "write_id": "w",
        "etag": 'W/"1"',
    }
    fields.update(overrides)
    return ProcessRecord(**fields)


def reply(**overrides) -> AgentResponse:
    fields = {
        "order_id": "o-1",
        "step": "reserve_inventory",
        "operation": "do",
        "attempt": 1,
        "outcome": "succeeded",
        "result": {"reservation": "r1"},
    }
    fields.update(overrides)
    return AgentResponse(**fields)


class TestRowKeys:
    def test_step_and_timeline_keys_sort_in_order(self):
        assert step_row_key(2, "charge_payment") == "step-02-charge_payment"
        keys = [timeline_row_key(n) for n in (0, 9, 10, 99_999_999)]
        assert keys == sorted(keys)
        assert keys[0] == "timeline-00000000"
        assert "details" < "process" < "step-00-a" < keys[0] < "timeline."

    def test_timeline_sequence_bounds(self):
        with pytest.raises(ValueError):
            timeline_row_key(100_000_000)
        with pytest.raises(ValueError):
            timeline_row_key(-1)


class TestJsonChunks:
    @pytest.mark.parametrize("length", [0, 1, JSON_CHUNK_CHARS, JSON_CHUNK_CHARS + 1, 70_000])
    def test_round_trip(self, length):
        entity: dict = {}
        text = ("😀a" * length)[:length]
        put_json(entity, "Result", text)
        assert entity["ResultParts"] == max(1, -(-length // JSON_CHUNK_CHARS))
        assert all(
            len(v.encode("utf-16-le")) <= 64_000 for v in entity.values() if isinstance(v, str)
        )
        assert get_json(entity, "Result") == text

    def test_absent_is_none(self):
        assert get_json({}, "Result") is None


class TestProcessRecord:
    def test_entity_round_trip(self):
        record = process(locked_by=None, last_error="boom")
        entity = record.to_entity()
        assert entity["ProcessState"] == "Processing"
        assert entity["OrderID"] == "o-1"
        assert ProcessRecord.from_entity(entity, record.etag) == record

    def test_utc_refuses_naive_and_normalises(self):
        with pytest.raises(ValueError, match="no timezone"):
            utc(datetime(2025, 1, 1))
        plus2 = datetime(2025, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))
        assert utc(plus2) == datetime(2025, 1, 1, 10, tzinfo=UTC)
        assert type(utc(plus2)) is datetime


class TestStepUpdate:
    def test_succeeded_do(self):
        update = StepUpdate.from_response(reply())
        assert update.state is StepState.SUCCEEDED
        assert update.result == {"reservation": "r1"}
        entity = update.to_entity("o-1", 0, T0)
        assert entity["RowKey"] == "step-00-reserve_inventory"
        assert json.loads(entity["Result"]) == {"reservation": "r1"}
        assert "CompletedAt" in entity

    def test_failed_do(self):
        update = StepUpdate.from_response(
            reply(outcome="failed", result={}, error_code="out_of_stock", error_message="none")
        )
        assert update.state is StepState.FAILED
        entity = update.to_entity("o-1", 0, T0)
        assert entity["ErrorCode"] == "out_of_stock"
        assert "Result" not in entity

    def test_undo_outcomes(self):
        assert StepUpdate.from_response(reply(operation="undo")).state is StepState.COMPENSATED
        failed_undo = StepUpdate.from_response(
            reply(operation="undo", outcome="failed", result={}, error_code="x")
        )
        # A failed undo leaves the step Succeeded: its effect is still there.
        assert failed_undo.state is None
        assert "State" not in failed_undo.to_entity("o-1", 0, T0)


def test_state_machine_terminal_states():
    assert ALLOWED_TRANSITIONS[ProcessState.PROCESSED] == frozenset()
    assert ProcessState.PROCESSED.terminal and ProcessState.ERROR.terminal
    assert ProcessState.COMPENSATING.in_flight


HOSTILE = "x' or PartitionKey ne '"


class TestRefusedBeforeAnyRequest:
    def test_hostile_ids_on_reads(self, offline_store):
        for call in (
            offline_store.get_process,
            offline_store.get_order,
            offline_store.get_timeline,
            offline_store.find_process,
        ):
            with pytest.raises(InvalidId):
                call(HOSTILE)

    def test_hostile_instance_id_on_claim(self, offline_store):
        with pytest.raises(InvalidId):
            offline_store.claim(
                process(state=ProcessState.PENDING, locked_by=None),
                instance_id="evil/instance",
                complete_by=T0,
            )

    def test_forbidden_transitions(self, offline_store):
        done = process(state=ProcessState.PROCESSED, locked_by=None)
        with pytest.raises(InvalidTransition, match="Processed -> Error is not allowed"):
            offline_store.mark_error(done, actor="supervisor-1", reason="x")
        with pytest.raises(InvalidTransition, match="only a Pending order"):
            offline_store.claim(process(), instance_id="s-2", complete_by=T0)
        with pytest.raises(InvalidTransition, match="only Error orders"):
            offline_store.resubmit(process(), actor="op", reason="x")

    def test_unknown_and_owned_fields_cannot_be_changed(self, offline_store):
        for changes in ({"order_id": "o-2"}, {"etag": "*"}, {"timeline_seq": 0}, {"nope": 1}):
            with pytest.raises(ValueError, match="cannot be changed"):
                offline_store.transition(process(), changes, actor="a", event="e")

    def test_attempt_and_generation_never_decrease(self, offline_store):
        with pytest.raises(InvalidTransition, match="attempt"):
            offline_store.transition(process(attempt=3), {"attempt": 2}, actor="a", event="e")
        with pytest.raises(InvalidTransition, match="generation"):
            offline_store.transition(process(generation=2), {"generation": 1}, actor="a", event="e")

    def test_naive_deadline_is_refused(self, offline_store):
        with pytest.raises(ValueError, match="no timezone"):
            offline_store.transition(
                process(), {"complete_by": datetime(2025, 1, 1)}, actor="a", event="e"
            )

    def test_unknown_step(self, offline_store):
        with pytest.raises(LookupError, match="no step 'teleport'"):
            offline_store.transition(process(), {"current_step": "teleport"}, actor="a", event="e")

    @pytest.mark.parametrize(
        "stale",
        [
            {"attempt": 2},
            {"step": "charge_payment"},
            {"operation": "undo"},
            {"order_id": "o-2"},
        ],
    )
    def test_stale_replies(self, offline_store, stale):
        with pytest.raises(StaleResult):
            offline_store.advance(
                process(),
                reply(**stale),
                next_step=ORDER_WORKFLOW.step_named("charge_payment"),
                complete_by=T0,
                actor="s-1",
            )

    def test_reply_to_an_order_with_nothing_in_flight_is_stale(self, offline_store):
        with pytest.raises(StaleResult, match="no step is in flight"):
            offline_store.mark_processed(
                process(state=ProcessState.PENDING, locked_by=None), actor="s", response=reply()
            )

    def test_unregistered_workflow_is_refused_on_create(self, offline_store):
        from core.messages import OrderSubmitted
        from core.workflows import Workflow

        other = Workflow("other", ORDER_WORKFLOW.steps, retry=ORDER_WORKFLOW.retry)
        submitted = OrderSubmitted(
            order_id="o-1",
            customer_id="c",
            items=[{"sku": "a", "quantity": 1, "unit_price_cents": 1}],
            currency="EUR",
        )
        with pytest.raises(ValueError, match="not registered"):
            offline_store.create_order(submitted, other)

    def test_table_names_are_validated(self):
        service = TableServiceClient.from_connection_string(UNREACHABLE)
        with pytest.raises(InvalidId):
            OrderStateStore(service, orders_table="orders;drop")
        with pytest.raises(ValueError, match="must differ"):
            OrderStateStore(service, orders_table="orders", active_table="Orders")

    def test_list_active_limits_and_tokens(self, offline_store):
        with pytest.raises(ValueError, match="limit"):
            offline_store.list_active(0)
        with pytest.raises(ValueError, match="continuation"):
            offline_store.list_active(10, continuation='{"x": 1}')
