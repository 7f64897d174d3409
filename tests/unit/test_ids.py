"""Ids and names are checked before they can reach a Table key, a filter or a queue name."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain import ids
from domain.ids import InvalidId

HOSTILE_ORDER_IDS = [
    pytest.param("x' or PartitionKey ne '", '"\'" at position 1', id="odata-injection"),
    pytest.param("../x", "starts with '.'", id="path-traversal"),
    pytest.param("a/b", "'/' at position 1", id="slash"),
    pytest.param("a\\b", "'\\\\' at position 1", id="backslash"),
    pytest.param("a#b", "'#' at position 1", id="hash"),
    pytest.param("a?b", "'?' at position 1", id="question-mark"),
    pytest.param("a\x00b", "'\\x00' at position 1", id="nul"),
    pytest.param("abc\n", "'\\n' at position 3", id="trailing-newline"),
    pytest.param("ordér", "'é' at position 3", id="unicode-letter"),
    pytest.param("\u0661\u0662\u0663", "starts with '\u0661'", id="arabic-indic-digits"),
    pytest.param("", "is empty", id="empty"),
    pytest.param("a" * 65, "is 65 characters long (at most 64)", id="65-chars"),
    pytest.param("-abc", "starts with '-'", id="leading-dash"),
    pytest.param("_abc", "starts with '_'", id="leading-underscore"),
    pytest.param("a.b", "'.' at position 1", id="dot-is-a-separator"),
    pytest.param("a:b", "':' at position 1", id="colon-is-a-separator"),
    pytest.param("a b", "' ' at position 1", id="space"),
]


@pytest.mark.parametrize(("value", "problem"), HOSTILE_ORDER_IDS)
def test_hostile_order_ids_are_rejected_with_what_is_wrong_and_what_is_allowed(value, problem):
    with pytest.raises(InvalidId) as caught:
        ids.validate_order_id(value)
    message = str(caught.value)
    assert message.startswith("order id ")
    assert problem in message
    assert "allowed: 1-64 characters of A-Z a-z 0-9 '_' '-'" in message


@pytest.mark.parametrize("value", ["a", "A1", "order-42", "o_1-x", "0abc", "Z" * 64])
def test_valid_order_ids_pass_unchanged(value):
    assert ids.validate_order_id(value) == value


@pytest.mark.parametrize("value", [None, 42, b"abc", ["a"]])
def test_non_strings_are_rejected(value):
    with pytest.raises(InvalidId, match="must be a string"):
        ids.validate_order_id(value)


def test_invalid_id_is_a_value_error_so_pydantic_reports_it():
    assert issubclass(InvalidId, ValueError)


def test_long_hostile_values_are_shortened_in_the_message():
    with pytest.raises(InvalidId) as caught:
        ids.validate_order_id("x" * 10_000)
    assert len(str(caught.value)) < 300
    assert "+9960 more characters" in str(caught.value)


@pytest.mark.parametrize(
    ("validator", "good", "bad"),
    [
        (lambda v: ids.validate_name(v, "step name"), "charge_payment", "Charge"),
        (lambda v: ids.validate_name(v, "step name"), "a" * 40, "a" * 41),
        (ids.validate_sku, "SKU-1.v2", "-sku"),
        (ids.validate_instance_id, "host-1.example:1234@x", "host/1"),
        (ids.validate_entity_name, "status.replies-1", "q/$DeadLetterQueue"),
        (ids.validate_entity_name, "a", "q."),
        (ids.validate_table_name, "orders2", "or"),
        (ids.validate_table_name, "activeorders", "1orders"),
    ],
)
def test_other_name_rules(validator, good, bad):
    assert validator(good) == good
    with pytest.raises(InvalidId):
        validator(bad)


class TestIdempotencyKey:
    def test_format_is_order_step_operation_generation(self):
        assert ids.idempotency_key("o-1", "charge_payment", "do") == "o-1:charge_payment:do:1"
        assert ids.idempotency_key("o-1", "charge_payment", "undo", 3) == (
            "o-1:charge_payment:undo:3"
        )

    def test_do_and_undo_never_share_a_key(self):
        assert ids.idempotency_key("o", "s", "do") != ids.idempotency_key("o", "s", "undo")

    def test_round_trip(self):
        key = ids.idempotency_key("o-1", "create_shipment", "undo", 12)
        assert ids.parse_idempotency_key(key) == ("o-1", "create_shipment", "undo", 12)
        assert str(ids.parse_idempotency_key(key)) == key

    def test_longest_key_fits_the_declared_maximum(self):
        key = ids.idempotency_key("a" * 64, "s" * 40, "undo", ids.MAX_GENERATION)
        assert len(key) == ids.IDEMPOTENCY_KEY_MAX_LENGTH

    @pytest.mark.parametrize(
        "key",
        [
            "o-1:step:do",
            "o-1:step:do:1:extra",
            "o-1:step:redo:1",
            "o-1:step:do:0",
            "o-1:step:do:01",
            "o-1:step:do:x",
            "o'1:step:do:1",
            "o-1:Step:do:1",
            "",
        ],
    )
    def test_malformed_keys_are_rejected(self, key):
        with pytest.raises(InvalidId):
            ids.parse_idempotency_key(key)

    @pytest.mark.parametrize("generation", [0, -1, 10_000, True, 1.0])
    def test_generation_bounds(self, generation):
        with pytest.raises(InvalidId):
            ids.idempotency_key("o", "s", "do", generation)


RULES = [ids._ID, ids._SKU, ids._NAME, ids._INSTANCE, ids._ENTITY, ids._TABLE]


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.text[:24])
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_a_rules_one_pattern_accepts_exactly_what_its_walk_accepts(rule, data) -> None:
    """The pattern tells a valid value at once; the walk says why one is not: they agree."""
    alphabet = "".join(sorted(rule.first | rule.rest | frozenset("./:@_- \n\x00é٣")))
    value = data.draw(st.text(alphabet=alphabet, max_size=rule.max_len + 2))
    assert (rule.valid.fullmatch(value) is not None) == (rule._problem(value) is None)
