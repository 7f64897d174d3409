"""orderctl refuses bad input with a message that says what is wrong, before touching anything."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from devstack.cli import app
from devstack.orders import build_order, parse_item

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_submit_without_a_stack_says_how_to_start_one(tmp_path):
    result = run("submit", "--workdir", str(tmp_path))
    assert result.exit_code == 2
    assert "no running stack" in result.output and "orderctl up" in result.output


def test_status_without_a_stack_says_how_to_start_one(tmp_path):
    result = run("status", "order-1", "--workdir", str(tmp_path))
    assert result.exit_code == 2
    assert "orderctl up" in result.output


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("SKU-1", "must be SKU:QUANTITY:UNIT_PRICE_CENTS"),
        ("SKU-1:two:100", "must be integers"),
        ("SKU-1:1:9.99", "must be integers"),
    ],
)
def test_malformed_items_are_explained(item, message):
    with pytest.raises(ValueError, match=message):
        parse_item(item)


def test_orders_are_validated_like_the_app_validates_them():
    with pytest.raises(ValueError, match="order_id"):
        build_order("x' or PartitionKey ne '", ["SKU-1:1:100"], "c-1", "EUR", "order", None)
    with pytest.raises(ValueError, match="unknown workflow"):
        build_order(None, ["SKU-1:1:100"], "c-1", "EUR", "teleport", None)
    order = build_order(None, ["SKU-1:2:150", "SKU-2:1:100"], "c-1", "EUR", "order", None)
    assert order.total_cents == 400


def test_a_bad_profile_file_is_refused_with_the_line_at_fault(tmp_path):
    profile = tmp_path / "profile.json"
    profile.write_text('{\n  "default": {\n    "transient_rate": 0.1,\n  }\n}\n')
    result = run("up", "--profile", str(profile), "--workdir", str(tmp_path / "stack"))
    assert result.exit_code == 2
    assert "line 4" in result.output


def test_an_unknown_profile_name_lists_the_known_ones(tmp_path):
    result = run("demo", "--profile", "apocalyptic", "--workdir", str(tmp_path))
    assert result.exit_code == 2
    assert "chaotic" in result.output and "flaky" in result.output
