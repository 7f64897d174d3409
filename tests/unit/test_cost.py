"""benchmarks.cost: the price file's shape, and the arithmetic from usage to dollars."""

from __future__ import annotations

from datetime import date

import pytest

from benchmarks import cost

REQUIRED_PRICES = {
    "flex_on_demand_execution_time",
    "flex_on_demand_executions",
    "flex_always_ready_baseline",
    "flex_always_ready_execution_time",
    "servicebus_standard_base",
    "servicebus_premium_messaging_unit",
    "table_transactions_lrs",
    "blob_hot_lrs_write_operations",
}


def test_the_price_file_names_every_price_its_status_and_where_to_check_it() -> None:
    prices = cost.load_prices()
    assert prices.currency == "USD" and prices.as_of <= date.today()
    assert prices.prices.keys() >= REQUIRED_PRICES
    for name, price in prices.prices.items():
        assert price.usd > 0, name
        # A figure read on a page names that page; one from memory names where to check it.
        assert price.source if price.status != "from_memory" else price.official, name
    for name, grant in prices.free_grants.items():
        assert grant.amount > 0 and grant.official, name
    tiers = prices.servicebus_standard_operation_tiers.tiers
    bounds = [t.up_to_millions for t in tiers]
    assert bounds[-1] is None and bounds[:-1] == sorted(b for b in bounds if b is not None)
    assert tiers[0].usd_per_million == 0, "Standard includes its first operations"
    assert prices.cores(2048) == 1 and prices.cores(4096) == 2


def synthetic_prices() -> cost.Prices:
    """Round numbers, so that each line's arithmetic can be checked by hand."""

    def price(usd: float) -> dict:
        return {"usd": usd, "per": "unit", "status": "from_memory", "official": "https://x"}

    return cost.Prices.model_validate(
        {
            "as_of": "2026-01-01",
            "currency": "USD",
            "region": "test",
            "hours_per_month": 700,
            "how_checked": "synthetic",
            "prices": {
                "flex_on_demand_execution_time": price(0.00002),
                "flex_on_demand_executions": price(0.5),
                "servicebus_standard_base": price(0.01),
                "table_transactions_lrs": price(0.001),
                "blob_hot_lrs_write_operations": price(0.1),
            },
            "free_grants": {
                "flex_on_demand_gb_s_per_month": {"amount": 1000, "status": "from_memory"},
                "flex_on_demand_executions_per_month": {"amount": 1_000_000, "status": "verified"},
            },
            "servicebus_standard_operation_tiers": {
                "status": "from_memory",
                "tiers": [
                    {"up_to_millions": 10, "usd_per_million": 0},
                    {"up_to_millions": 100, "usd_per_million": 1.0},
                    {"up_to_millions": None, "usd_per_million": 0.5},
                ],
            },
            "flex_billing_rules": {
                "status": "verified",
                "source": "https://x",
                "minimum_billable_ms": 1000,
                "rounding_ms": 100,
                "instance_cores_by_memory_mb": {"2048": 1, "4096": 2},
            },
        }
    )


@pytest.mark.parametrize(
    ("millions", "usd"),
    [(0, 0.0), (10, 0.0), (50, 40.0), (100, 90.0), (300, 90.0 + 100.0)],
)
def test_tiers_price_each_part_at_its_own_rate(millions: float, usd: float) -> None:
    tiers = synthetic_prices().servicebus_standard_operation_tiers.tiers
    assert cost.tiered(millions, tiers) == pytest.approx(usd)


def test_a_month_of_orders_line_by_line() -> None:
    usage = cost.OrderUsage(
        executions=7,
        instance_seconds=0.05,
        servicebus_operations=20,
        table_transactions=9,
        blob_operations=0.1,
        instance_memory_mb=2048,
    )
    bill = cost.monthly_bill(usage, synthetic_prices(), orders_per_month=10_000_000)
    assert bill.lines == pytest.approx(
        {
            # 70 M executions, 1 M free, at 0.5 per million
            "functions_executions": 69 * 0.5,
            # 0.05 s x 2 GB x 10 M = 1 M GB-s, 1,000 free, at 0.00002
            "functions_execution_time": (1_000_000 - 1000) * 0.00002,
            "servicebus_base": 0.01 * 700,
            # 200 M operations: 10 free, 90 at 1.0, 100 at 0.5
            "servicebus_operations": 90 * 1.0 + 100 * 0.5,
            # 90 M transactions = 9,000 x 10,000, at 0.001
            "table_transactions": 9000 * 0.001,
            "blob_operations": 100 * 0.1,
        }
    )
    assert bill.total == pytest.approx(sum(bill.lines.values()))


def test_cost_per_million_spreads_the_month_over_its_orders() -> None:
    usage = cost.OrderUsage(
        executions=3, instance_seconds=0.02, servicebus_operations=8, table_transactions=4
    )
    prices = synthetic_prices()
    month = cost.monthly_bill(usage, prices, orders_per_month=5_000_000)
    per_million = cost.cost_per_million(usage, prices, orders_per_month=5_000_000)
    assert per_million.total == pytest.approx(month.total / 5)
    assert per_million.lines["servicebus_base"] == pytest.approx(0.01 * 700 / 5)
    with pytest.raises(ValueError):
        cost.cost_per_million(usage, prices, orders_per_month=0)


def test_free_grants_leave_a_small_month_free() -> None:
    usage = cost.OrderUsage(
        executions=3, instance_seconds=0.004, servicebus_operations=8, table_transactions=4
    )
    # 300,000 executions (1 M free); 0.004 s x 2 GB x 100,000 = 800 GB-s (1,000 free)
    bill = cost.monthly_bill(usage, synthetic_prices(), orders_per_month=100_000)
    assert bill.lines["functions_executions"] == 0
    assert bill.lines["functions_execution_time"] == 0
    assert bill.lines["servicebus_operations"] == 0  # 0.8 M operations, within the free tier


def test_billable_instance_time_is_host_cpu_over_the_instance_cores() -> None:
    prices = synthetic_prices()
    assert cost.instance_seconds_from_cpu(0.03, prices, 2048) == pytest.approx(0.03)
    assert cost.instance_seconds_from_cpu(0.03, prices, 4096) == pytest.approx(0.015)


def test_the_shipped_prices_give_a_positive_cost_per_million() -> None:
    usage = cost.OrderUsage(
        executions=7, instance_seconds=0.03, servicebus_operations=21, table_transactions=9
    )
    bill = cost.cost_per_million(usage, cost.load_prices(), orders_per_month=10_000_000)
    assert bill.total > 0
    assert set(bill.rounded()) == {*bill.lines, "total"}
