"""Message schemas: strict, frozen, round-trippable, with clear reasons for bad input."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from domain import messages
from domain.messages import (
    AgentRequest,
    AgentResponse,
    BadMessage,
    OperatorAlert,
    OrderSubmitted,
    SchedulerCommand,
    SignedBody,
    StatusUpdate,
    encode,
    message_id_for,
    parse_message,
)
from domain.states import ProcessState

T0 = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def order(**overrides) -> OrderSubmitted:
    fields = {
        "order_id": "o-1",
        "customer_id": "c-9",
        "items": [
            {"sku": "SKU-1", "quantity": 2, "unit_price_cents": 1250},
            {"sku": "SKU-2", "quantity": 1, "unit_price_cents": 99},
        ],
        "currency": "EUR",
        "reply_to": "status-o-1",
        "submitted_at": T0,
    }
    fields.update(overrides)
    return OrderSubmitted(**fields)


def request(**overrides) -> AgentRequest:
    fields = {
        "order_id": "o-1",
        "step": "charge_payment",
        "operation": "do",
        "action": "charge",
        "attempt": 2,
        "complete_by": T0 + timedelta(seconds=30),
        "idempotency_key": "o-1:charge_payment:do:1",
        "payload": {"amount_cents": 2599, "lines": [1, 2.5, None, True, {"x": "y"}]},
        "requested_at": T0,
    }
    fields.update(overrides)
    return AgentRequest(**fields)


def response(**overrides) -> AgentResponse:
    fields = {
        "order_id": "o-1",
        "step": "charge_payment",
        "operation": "do",
        "attempt": 2,
        "idempotency_key": "o-1:charge_payment:do:1",
        "outcome": "succeeded",
        "result": {"charge_id": "ch_1"},
        "responded_at": T0,
    }
    fields.update(overrides)
    return AgentResponse(**fields)


ALL_MESSAGES = [
    order(),
    request(),
    response(),
    response(outcome="failed", result={}, error_code="card_declined", error_message="no"),
    SchedulerCommand(
        order_id="o-1",
        command="retry",
        attempt=3,
        failure_count=1,
        reason="deadline passed",
        requested_by="supervisor-1",
        requested_at=T0,
    ),
    StatusUpdate(order_id="o-1", sequence=4, state="Processing", step="charge_payment"),
    OperatorAlert(
        order_id=None,
        severity="critical",
        reason="bad_message",
        detail="not JSON",
        raw_excerpt="\x00\x01",
        source="scheduler-1",
    ),
]

RESUMABLE = [request(), response()]
"""The messages that may carry the order's snapshot (``resume``)."""


@pytest.mark.parametrize("message", ALL_MESSAGES, ids=lambda m: m.MESSAGE_TYPE)
def test_round_trip_through_encode_and_parse(message):
    body = encode(message)
    assert isinstance(body, bytes)
    assert b": " not in body and b", " not in body  # compact
    assert parse_message(body, type(message)) == message
    assert parse_message(body.decode(), type(message)) == message


@pytest.mark.parametrize("message", ALL_MESSAGES, ids=lambda m: m.MESSAGE_TYPE)
def test_a_signed_body_reads_as_any_other(message):
    body = encode(message)
    assert parse_message(SignedBody(body), type(message)) == parse_message(body, type(message))


SIGNED_REFUSALS = [
    pytest.param(b"", id="empty"),
    pytest.param(b"[1]", id="not an object"),
    pytest.param(b'{"type": "AgentResponse", "x": NaN}', id="NaN"),
    pytest.param(encode(response())[:-1], id="cut short"),
    pytest.param(encode(request()), id="another type"),
    pytest.param(encode(response()).replace(b'"attempt":2', b'"attempt":"2"'), id="a string"),
    pytest.param(encode(response()).replace(b'"outcome":"succeeded"', b'"outcome":"x"'), id="bad"),
]


@pytest.mark.parametrize("body", SIGNED_REFUSALS)
def test_a_signed_body_is_refused_for_the_same_reason_as_any_other(body):
    with pytest.raises(BadMessage) as strict:
        parse_message(body, AgentResponse)
    with pytest.raises(BadMessage) as signed:
        parse_message(SignedBody(body), AgentResponse)
    assert vars(signed.value) == vars(strict.value)


@pytest.mark.parametrize("message", ALL_MESSAGES, ids=lambda m: m.MESSAGE_TYPE)
def test_every_message_has_version_and_type(message):
    data = json.loads(encode(message))
    assert data["schema_version"] == 1
    assert data["type"] == type(message).__name__ == message.MESSAGE_TYPE


@pytest.mark.parametrize("message", ALL_MESSAGES, ids=lambda m: m.MESSAGE_TYPE)
def test_messages_are_frozen(message):
    with pytest.raises(ValidationError, match="frozen"):
        message.order_id = "other"  # type: ignore[misc]


@pytest.mark.parametrize("message", ALL_MESSAGES, ids=lambda m: m.MESSAGE_TYPE)
def test_unknown_field_is_rejected_with_its_path(message):
    data = json.loads(encode(message))
    data["surprise"] = 1
    with pytest.raises(BadMessage) as caught:
        parse_message(json.dumps(data), type(message))
    assert "surprise: unknown field" in caught.value.reason
    with pytest.raises(ValidationError):
        type(message)(**{**message.model_dump(), "surprise": 1})


class TestOrderSubmitted:
    def test_total_is_computed_when_omitted(self):
        assert order().total_cents == 2 * 1250 + 99

    def test_total_is_checked_when_given(self):
        assert order(total_cents=2599).total_cents == 2599
        with pytest.raises(ValidationError, match="total_cents is 2600 but the items add up"):
            order(total_cents=2600)

    def test_wire_total_is_checked_too(self):
        data = json.loads(encode(order()))
        data["total_cents"] = 1
        with pytest.raises(BadMessage, match="total_cents is 1 but the items add up to 2599"):
            parse_message(json.dumps(data), OrderSubmitted)

    @pytest.mark.parametrize(
        ("item", "fragment"),
        [
            ({"sku": "A", "quantity": 0, "unit_price_cents": 1}, "items.0.quantity"),
            ({"sku": "A", "quantity": -1, "unit_price_cents": 1}, "items.0.quantity"),
            ({"sku": "A", "quantity": 1, "unit_price_cents": -1}, "items.0.unit_price_cents"),
            ({"sku": "A", "quantity": 1.5, "unit_price_cents": 1}, "items.0.quantity"),
            ({"sku": "A", "quantity": "2", "unit_price_cents": 1}, "items.0.quantity"),
            ({"sku": "A", "quantity": True, "unit_price_cents": 1}, "items.0.quantity"),
            ({"sku": "A", "quantity": 1, "unit_price_cents": 9.99}, "items.0.unit_price_cents"),
            ({"sku": "../etc", "quantity": 1, "unit_price_cents": 1}, "items.0.sku"),
        ],
    )
    def test_bad_items_are_named_by_path(self, item, fragment):
        data = json.loads(encode(order()))
        data["items"] = [item]
        del data["total_cents"]
        with pytest.raises(BadMessage) as caught:
            parse_message(json.dumps(data), OrderSubmitted)
        assert caught.value.reason.startswith(f"OrderSubmitted is invalid: {fragment}: ")
        assert "total_cents" not in caught.value.reason  # only the real problem is reported

    def test_total_is_capped_below_the_table_integer_range(self):
        line = {"sku": "A", "quantity": 1_000_000, "unit_price_cents": 10**12}
        with pytest.raises(ValidationError, match="total_cents"):
            order(items=[line] * 100)
        assert messages.MAX_TOTAL_CENTS < 2**63

    def test_an_order_needs_an_item(self):
        with pytest.raises(ValidationError, match="at least one item"):
            order(items=[])

    @pytest.mark.parametrize("currency", ["eur", "EURO", "EU", "EUR\n", "€€€"])
    def test_currency_is_three_capitals(self, currency):
        with pytest.raises(ValidationError, match="currency"):
            order(currency=currency)

    @pytest.mark.parametrize("reply_to", ["q/$DeadLetterQueue", "q'", "", "a" * 261, "-q"])
    def test_reply_to_must_be_a_plain_queue_name(self, reply_to):
        with pytest.raises(ValidationError, match="reply_to"):
            order(reply_to=reply_to)

    def test_naive_datetime_is_rejected_and_aware_is_normalised_to_utc(self):
        with pytest.raises(ValidationError, match="timezone"):
            order(submitted_at=datetime(2025, 1, 1))
        local = datetime(2025, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))
        assert order(submitted_at=local).submitted_at == datetime(2025, 1, 1, 10, tzinfo=UTC)
        assert order(submitted_at=local).submitted_at.utcoffset() == timedelta(0)

    def test_unix_timestamps_are_not_datetimes_on_the_wire(self):
        data = json.loads(encode(order()))
        data["submitted_at"] = 1_700_000_000
        with pytest.raises(BadMessage, match="submitted_at: expected an ISO 8601"):
            parse_message(json.dumps(data), OrderSubmitted)

    def test_content_hash_ignores_submitted_at_only(self):
        base = order()
        assert base.content_hash() == order(submitted_at=T0 + timedelta(hours=1)).content_hash()
        assert base.content_hash() != order(reply_to="elsewhere").content_hash()
        assert base.content_hash() != order(customer_id="c-10").content_hash()
        assert len(base.content_hash()) == 64


class TestAgentMessages:
    def test_idempotency_key_must_belong_to_the_request(self):
        with pytest.raises(ValidationError, match="does not belong to o-1:charge_payment:do"):
            request(idempotency_key="o-2:charge_payment:do:1")
        with pytest.raises(ValidationError, match="does not belong"):
            request(idempotency_key="o-1:charge_payment:undo:1")
        with pytest.raises(ValidationError, match="idempotency key"):
            request(idempotency_key="nonsense")
        assert request(idempotency_key="o-1:charge_payment:do:4").generation == 4

    @pytest.mark.parametrize("attempt", [0, -1, 1_000_001])
    def test_attempt_bounds(self, attempt):
        with pytest.raises(ValidationError, match="attempt"):
            request(attempt=attempt)

    def test_operation_is_do_or_undo(self):
        with pytest.raises(ValidationError, match="operation"):
            request(operation="redo")

    def test_an_undo_names_the_forward_key_it_undoes(self):
        undo = {"operation": "undo", "action": "refund"}
        with pytest.raises(ValidationError, match="must name the forward key"):
            request(**undo, idempotency_key="o-1:charge_payment:undo:1")
        with pytest.raises(ValidationError, match="must name the forward key"):
            request(
                **undo,
                idempotency_key="o-1:charge_payment:undo:2",
                undoes="o-1:charge_payment:do:1",
            )
        with pytest.raises(ValidationError, match="undoes nothing"):
            request(undoes="o-1:charge_payment:do:1")
        made = request(
            **undo, idempotency_key="o-1:charge_payment:undo:2", undoes="o-1:charge_payment:do:2"
        )
        assert made.undoes == "o-1:charge_payment:do:2"

    def test_a_response_names_the_key_it_answers(self):
        with pytest.raises(ValidationError, match="does not belong"):
            response(idempotency_key="o-1:reserve_inventory:do:1")
        assert response(idempotency_key="o-1:charge_payment:do:3").generation == 3

    def test_nothing_to_undo_answers_an_undo_only(self):
        with pytest.raises(ValidationError, match="answers an undo only"):
            response(outcome="nothing_to_undo", result={})
        undone = response(
            operation="undo", idempotency_key="o-1:charge_payment:undo:1", outcome="nothing_to_undo"
        )
        assert undone.outcome == "nothing_to_undo"

    def test_deferred_goes_with_retry_at(self):
        with pytest.raises(ValidationError, match="retry_at goes with a deferred"):
            response(outcome="deferred", result={})
        with pytest.raises(ValidationError, match="retry_at goes with a deferred"):
            response(retry_at=T0)
        assert response(outcome="deferred", result={}, retry_at=T0).retry_at == T0

    def test_failed_response_needs_error_code(self):
        with pytest.raises(ValidationError, match="needs an error_code"):
            response(outcome="failed", result={})

    def test_succeeded_response_carries_no_error(self):
        with pytest.raises(ValidationError, match="a succeeded response"):
            response(error_code="x")
        with pytest.raises(ValidationError, match="a succeeded response"):
            response(transient=True)

    def test_long_error_message_is_truncated_not_refused(self):
        reply = response(outcome="failed", result={}, error_code="boom", error_message="é" * 5000)
        assert len(reply.error_message.encode()) <= messages.MAX_ERROR_MESSAGE_BYTES
        assert reply.error_message.endswith("...[truncated]")


class TestResume:
    """``resume``: the order's snapshot a request and its reply carry (service.resume); opaque
    here, bounded, and absent from the wire when there is none."""

    TOKEN = "r1.eyJ0IjoiZTEifQ"

    @pytest.mark.parametrize("message", RESUMABLE, ids=lambda m: m.MESSAGE_TYPE)
    def test_carried_and_round_tripped(self, message):
        carrying = message.model_copy(update={"resume": self.TOKEN})
        assert parse_message(encode(carrying), type(message)).resume == self.TOKEN

    @pytest.mark.parametrize("message", RESUMABLE, ids=lambda m: m.MESSAGE_TYPE)
    def test_absent_it_is_left_out_of_the_json(self, message):
        assert message.resume is None
        assert b"resume" not in encode(message)
        assert "resume" not in message.model_dump(mode="json")
        assert parse_message(encode(message), type(message)) == message

    @pytest.mark.parametrize(
        "token", ["", "r1.a b", 'r1."', "r1.\n", "x" * (messages.MAX_RESUME_CHARS + 1)]
    )
    def test_only_a_bounded_url_safe_token_is_accepted(self, token):
        with pytest.raises(ValidationError, match="resume"):
            request(resume=token)
        data = json.loads(encode(response()))
        data["resume"] = token
        with pytest.raises(BadMessage, match="resume"):
            parse_message(json.dumps(data), AgentResponse)

    def test_an_explicit_null_is_read_as_absent(self):
        data = json.loads(encode(request())) | {"resume": None}
        assert parse_message(json.dumps(data), AgentRequest) == request()


class TestAlertsAndStatus:
    def test_raw_excerpt_is_bounded_to_2_kib(self):
        alert = OperatorAlert(
            order_id="o-1",
            severity="error",
            reason="bad_message",
            detail="d" * 10_000,
            raw_excerpt="x" * 100_000,
            source="scheduler-1",
        )
        assert len(alert.raw_excerpt.encode()) <= 2048
        assert len(alert.detail.encode()) <= messages.MAX_DETAIL_BYTES

    def test_unpaired_surrogates_in_free_text_are_replaced_so_encoding_never_fails(self):
        update = StatusUpdate(order_id="o", sequence=0, state="Pending", detail="a\ud800b")
        assert json.loads(encode(update))["detail"] == "a?b"

    def test_status_covers_every_process_state(self):
        for state in ProcessState:
            StatusUpdate(order_id="o", sequence=0, state=state.value)
        StatusUpdate(order_id="o", sequence=0, state="Rejected")
        with pytest.raises(ValidationError):
            StatusUpdate(order_id="o", sequence=0, state="Lost")

    def test_alert_order_id_may_be_none_but_not_hostile(self):
        with pytest.raises(ValidationError, match="order_id"):
            OperatorAlert(
                order_id="x' or 1",
                severity="error",
                reason="r",
                detail="",
                source="s",
            )


class TestParseMessage:
    def reason(self, body, expected=OrderSubmitted) -> BadMessage:
        with pytest.raises(BadMessage) as caught:
            parse_message(body, expected)
        assert str(caught.value) == caught.value.reason
        assert caught.value.expected == expected.MESSAGE_TYPE
        return caught.value

    def test_not_utf8(self):
        bad = self.reason(b'{"order_id": "\xff"}')
        assert bad.reason == "body is not valid UTF-8 (invalid start byte at byte 14)"
        assert bad.raw_excerpt == '{"order_id": "\\xff"}'

    def test_lone_surrogate_in_a_str_body_is_not_utf8(self):
        assert "not valid UTF-8" in self.reason('{"a": "\ud800"}').reason

    def test_unpaired_surrogate_escape(self):
        assert "unpaired surrogate" in self.reason(b'{"a": "\\ud800"}').reason

    def test_not_json(self):
        bad = self.reason(b'{"order_id": ')
        assert bad.reason.startswith("body is not JSON: Expecting value at line 1 column 14")

    def test_empty(self):
        assert self.reason(b"  ").reason == "body is empty"

    @pytest.mark.parametrize(
        ("body", "kind"),
        [(b"[]", "array"), (b'"x"', "string"), (b"1", "number"), (b"null", "null")],
    )
    def test_not_an_object(self, body, kind):
        assert self.reason(body).reason == (
            f"body is a JSON {kind}; expected an object (OrderSubmitted)"
        )

    def test_duplicate_keys_are_refused(self):
        assert "key 'a' appears twice" in self.reason(b'{"a": 1, "a": 2}').reason

    def test_nan_is_refused(self):
        assert "NaN is not valid JSON" in self.reason(b'{"a": NaN}').reason

    def test_deep_nesting_is_refused_without_crashing(self):
        assert "nested too deeply" in self.reason(b"[" * 200_000).reason

    def test_oversize(self):
        body = b" " * messages.MAX_MESSAGE_BYTES + b"{}"
        bad = self.reason(body)
        assert bad.reason == (
            f"body is {len(body)} bytes; the limit is {messages.MAX_MESSAGE_BYTES} (256 KiB)"
        )
        assert len(bad.raw_excerpt.encode()) <= messages.MAX_RAW_EXCERPT_BYTES

    def test_exactly_the_limit_is_accepted(self):
        body = encode(order())
        padded = body[:-1] + b" " * (messages.MAX_MESSAGE_BYTES - len(body)) + b"}"
        assert len(padded) == messages.MAX_MESSAGE_BYTES
        assert parse_message(padded, OrderSubmitted) == order()

    def test_wrong_type_names_both_and_keeps_the_order_id(self):
        bad = self.reason(encode(request()))
        assert bad.reason == "message type is 'AgentRequest'; expected 'OrderSubmitted'"
        assert bad.order_id == "o-1"

    def test_missing_type(self):
        data = json.loads(encode(order()))
        del data["type"]
        assert self.reason(json.dumps(data)).reason == (
            "field 'type' is missing; expected 'OrderSubmitted'"
        )

    @pytest.mark.parametrize("version", [2, 0, "1", True])
    def test_unsupported_schema_version(self, version):
        data = json.loads(encode(order()))
        data["schema_version"] = version
        assert "is not supported; this build reads 1" in self.reason(json.dumps(data)).reason

    def test_schema_errors_are_summarised_compactly(self):
        data = {"type": "OrderSubmitted", "order_id": "o-1"}
        bad = self.reason(json.dumps(data))
        assert bad.reason == (
            "OrderSubmitted is invalid: customer_id: Field required; items: Field required; "
            "currency: Field required"
        )
        assert bad.order_id == "o-1"

    def test_deep_but_parseable_json_gets_a_short_reason(self):
        data = json.loads(encode(response()))
        nested: object = 1
        for _ in range(900):
            nested = [nested]
        data["result"] = {"x": nested}
        bad = self.reason(json.dumps(data), AgentResponse)
        assert bad.reason.startswith("AgentResponse is invalid: result.x.list.0")
        assert len(bad.reason) < 400

    def test_many_errors_are_capped(self):
        data = json.loads(encode(order()))
        data["items"] = [{"sku": "-", "quantity": 0, "unit_price_cents": -1}] * 5
        assert "(+" in self.reason(json.dumps(data)).reason

    def test_hostile_order_id_is_not_echoed_as_the_alerts_order(self):
        data = json.loads(encode(order()))
        data["order_id"] = "x' or PartitionKey ne '"
        bad = self.reason(json.dumps(data))
        assert bad.order_id is None
        assert "order_id: order id \"x' or PartitionKey ne '\" has" in bad.reason

    def test_bad_message_becomes_an_operator_alert(self):
        bad = self.reason(b"\xfe\xff")
        alert = bad.to_alert("scheduler-7")
        assert alert.order_id is None
        assert alert.reason == "bad_message"
        assert alert.detail.startswith("rejected OrderSubmitted: body is not valid UTF-8")
        assert alert.raw_excerpt == "\\xfe\\xff"
        assert parse_message(encode(alert), OperatorAlert) == alert

    def test_non_bytes_body_is_a_programming_error(self):
        with pytest.raises(TypeError):
            parse_message(123, OrderSubmitted)  # type: ignore[arg-type]


def test_encode_refuses_what_a_receiver_would_refuse():
    big = request(payload={"blob": "x" * messages.MAX_MESSAGE_BYTES})
    with pytest.raises(messages.MessageTooLarge, match="the limit is 262144"):
        encode(big)


class TestMessageIds:
    def test_rules_per_type(self):
        assert message_id_for(request()) == "req:o-1:charge_payment:do:1:2"
        assert message_id_for(response()) == "rsp:o-1:charge_payment:do:1:2"
        assert message_id_for(ALL_MESSAGES[4]) == "cmd:o-1:retry:1:3"
        assert message_id_for(ALL_MESSAGES[5]) == "st:o-1:4"
        assert message_id_for(order()) == f"sub:o-1:{order().content_hash()[:16]}"
        assert message_id_for(ALL_MESSAGES[6]).startswith("alert:-:bad_message:")

    def test_deterministic_across_instances_and_timestamps(self):
        later = T0 + timedelta(minutes=5)
        assert message_id_for(request()) == message_id_for(request(requested_at=later))
        assert message_id_for(response()) == message_id_for(
            response(outcome="failed", result={}, error_code="x", responded_at=later)
        )
        assert message_id_for(order()) == message_id_for(order(submitted_at=later))

    def test_a_snapshot_changes_no_id(self):
        """A request resent after a later write carries a later snapshot: still a duplicate."""
        for message in RESUMABLE:
            for token in ("r1.AAAA", "r1.BBBB"):
                carrying = message.model_copy(update={"resume": token})
                assert message_id_for(carrying) == message_id_for(message)

    def test_what_must_differ_does(self):
        base = message_id_for(request())
        assert base != message_id_for(request(attempt=3))
        assert base != message_id_for(
            request(
                operation="undo",
                action="refund",
                idempotency_key="o-1:charge_payment:undo:1",
                undoes="o-1:charge_payment:do:1",
            )
        )
        assert message_id_for(order()) != message_id_for(order(customer_id="c-10"))

    def test_an_answer_for_a_key_never_sent_is_not_taken_for_the_genuine_one(self):
        """Issue 39: an answer to a request for the next generation's key, at the attempt the
        genuine answer had, was named like it and dropped by duplicate detection unseen."""
        genuine = response()
        forged = response(idempotency_key="o-1:charge_payment:do:2", responded_at=T0)
        assert message_id_for(forged) == "rsp:o-1:charge_payment:do:2:2"
        assert message_id_for(forged) != message_id_for(genuine)
        assert message_id_for(request(idempotency_key="o-1:charge_payment:do:2")) != (
            message_id_for(request())
        )

    def test_alerts_of_two_entries_into_error_differ(self):
        first = OperatorAlert(
            order_id="o-1",
            severity="error",
            reason="cancelled",
            detail="d",
            source="s",
            timeline_seq=3,
        )
        again = first.model_copy(update={"timeline_seq": 7})
        assert message_id_for(first) != message_id_for(again)
        assert message_id_for(first) == message_id_for(first.model_copy(update={"raised_at": T0}))

    def test_alerts_raised_by_two_messages_differ_however_alike_their_text(self):
        """Two agents (or one, twice) rejecting identical bodies are two events; the same
        message handled again, by another instance and later, is the same one."""
        alert = OperatorAlert(
            order_id="o-1",
            severity="error",
            reason="bad_message",
            detail="rejected AgentRequest: schema_version 2 is not supported",
            raw_excerpt="{}",
            source="agent-payment:host-a",
            caused_by="payment/m-1",
        )
        others = [
            alert.model_copy(update={"caused_by": "inventory/m-1"}),
            alert.model_copy(update={"caused_by": "payment/m-2"}),
            alert.model_copy(update={"caused_by": None}),
        ]
        ids = {message_id_for(a) for a in (alert, *others)}
        assert len(ids) == 4
        redelivered = alert.model_copy(
            update={"source": "agent-payment:host-b", "raised_at": T0 + timedelta(minutes=3)}
        )
        assert message_id_for(redelivered) == message_id_for(alert)

    def test_ids_never_exceed_service_bus_limit(self):
        long_request = request(
            order_id="o" * 64,
            step="s" * 40,
            operation="undo",
            attempt=1_000_000,
            idempotency_key=f"{'o' * 64}:{'s' * 40}:undo:1",
            undoes=f"{'o' * 64}:{'s' * 40}:do:1",
        )
        long_alert = OperatorAlert(
            order_id="o" * 64, severity="error", reason="r" * 40, detail="", source="s"
        )
        caused = long_alert.model_copy(update={"caused_by": "payment/" + "m" * 128})
        for message in (long_request, long_alert, caused):
            message_id = message_id_for(message)
            assert len(message_id) <= messages.MAX_MESSAGE_ID_LENGTH
            assert message_id == message_id_for(message)
