"""Azure cost of orders, from counted requests and measured execution time.

The list prices live in ``benchmarks/azure_prices.json`` (each with its source and how it was
checked); :func:`load_prices` reads and validates them. :class:`OrderUsage` is what one order
uses — executions, billable instance-seconds, Service Bus operations, Table transactions, Blob
operations — as ``python -m benchmarks.peers`` measures it. :func:`monthly_bill` prices a month
of ``orders_per_month`` such orders on Flex Consumption (on demand), Service Bus Standard and
Table Storage (LRS): free grants and included operations first, tiers in order, fixed monthly
charges in full. :func:`cost_per_million` divides that bill by the millions of orders, so fixed
charges are spread over the volume.

    python -m benchmarks.cost --executions 7 --instance-seconds 0.05 --servicebus 21 --table 9
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PRICES_FILE = Path(__file__).with_name("azure_prices.json")
MILLION = 1_000_000
TEN_THOUSAND = 10_000
MB_PER_GB = 1024

Status = Literal["verified", "third_party", "from_memory"]
_MODEL = ConfigDict(extra="forbid", frozen=True)


class Price(BaseModel):
    model_config = _MODEL

    usd: float = Field(ge=0)
    per: str
    status: Status
    source: str | None = None
    official: str | None = None
    note: str = ""


class Grant(BaseModel):
    model_config = _MODEL

    amount: float = Field(ge=0)
    status: Status
    official: str | None = None
    note: str = ""


class Tier(BaseModel):
    model_config = _MODEL

    up_to_millions: float | None = Field(default=None, gt=0)
    """Upper bound of the tier in millions a month; None: no bound (the last tier)."""
    usd_per_million: float = Field(ge=0)


class OperationTiers(BaseModel):
    model_config = _MODEL

    status: Status
    note: str = ""
    tiers: list[Tier] = Field(min_length=1)


class FlexBillingRules(BaseModel):
    model_config = _MODEL

    status: Status
    source: str
    minimum_billable_ms: int = Field(gt=0)
    rounding_ms: int = Field(gt=0)
    instance_cores_by_memory_mb: dict[int, float]
    note: str = ""


class Prices(BaseModel):
    model_config = _MODEL

    as_of: date
    currency: Literal["USD"]
    region: str
    hours_per_month: float = Field(gt=0)
    how_checked: str
    prices: dict[str, Price]
    free_grants: dict[str, Grant]
    servicebus_standard_operation_tiers: OperationTiers
    flex_billing_rules: FlexBillingRules

    def usd(self, name: str) -> float:
        return self.prices[name].usd

    def grant(self, name: str) -> float:
        return self.free_grants[name].amount

    def cores(self, instance_memory_mb: int) -> float:
        return self.flex_billing_rules.instance_cores_by_memory_mb[instance_memory_mb]


class OrderUsage(BaseModel):
    """What one order uses in Azure."""

    model_config = _MODEL

    executions: float = Field(ge=0)
    """Function executions (every trigger invocation, the Supervisor's ticks included)."""
    instance_seconds: float = Field(ge=0)
    """Seconds an instance is billed as executing, per order (on-demand GB-s / memory)."""
    servicebus_operations: float = Field(ge=0)
    table_transactions: float = Field(ge=0)
    blob_operations: float = Field(default=0.0, ge=0)
    instance_memory_mb: int = 2048


class Bill(BaseModel):
    """USD per line item: for a month (``monthly_bill``) or per million orders."""

    model_config = _MODEL

    lines: dict[str, float]
    orders_per_month: float

    @property
    def total(self) -> float:
        return sum(self.lines.values())

    def rounded(self, digits: int = 2) -> dict[str, float]:
        return {name: round(usd, digits) for name, usd in self.lines.items()} | {
            "total": round(self.total, digits)
        }


def load_prices(path: Path = PRICES_FILE) -> Prices:
    return Prices.model_validate(json.loads(path.read_text(encoding="utf-8")))


def tiered(quantity_millions: float, tiers: list[Tier]) -> float:
    """USD for ``quantity_millions`` in a month, each tier's part at its own price."""
    usd, floor = 0.0, 0.0
    for tier in tiers:
        ceiling = tier.up_to_millions if tier.up_to_millions is not None else float("inf")
        usd += max(0.0, min(quantity_millions, ceiling) - floor) * tier.usd_per_million
        floor = ceiling
        if quantity_millions <= floor:
            break
    return usd


def monthly_bill(usage: OrderUsage, prices: Prices, orders_per_month: float) -> Bill:
    """A month of ``orders_per_month`` orders (on-demand Flex, Service Bus Standard, LRS)."""
    executions = usage.executions * orders_per_month
    gb_seconds = usage.instance_seconds * usage.instance_memory_mb / MB_PER_GB * orders_per_month
    billable_executions = executions - prices.grant("flex_on_demand_executions_per_month")
    billable_gb_seconds = gb_seconds - prices.grant("flex_on_demand_gb_s_per_month")
    servicebus_millions = usage.servicebus_operations * orders_per_month / MILLION
    table_units = usage.table_transactions * orders_per_month / TEN_THOUSAND
    blob_units = usage.blob_operations * orders_per_month / TEN_THOUSAND
    lines = {
        "functions_executions": max(0.0, billable_executions)
        / MILLION
        * prices.usd("flex_on_demand_executions"),
        "functions_execution_time": max(0.0, billable_gb_seconds)
        * prices.usd("flex_on_demand_execution_time"),
        "servicebus_base": prices.usd("servicebus_standard_base") * prices.hours_per_month,
        "servicebus_operations": tiered(
            servicebus_millions, prices.servicebus_standard_operation_tiers.tiers
        ),
        "table_transactions": table_units * prices.usd("table_transactions_lrs"),
        "blob_operations": blob_units * prices.usd("blob_hot_lrs_write_operations"),
    }
    return Bill(lines=lines, orders_per_month=orders_per_month)


def cost_per_million(usage: OrderUsage, prices: Prices, orders_per_month: float) -> Bill:
    """USD per million orders when ``orders_per_month`` of them run in a month."""
    if orders_per_month <= 0:
        raise ValueError("orders_per_month must be positive")
    month = monthly_bill(usage, prices, orders_per_month)
    millions = orders_per_month / MILLION
    return Bill(
        lines={name: usd / millions for name, usd in month.lines.items()},
        orders_per_month=orders_per_month,
    )


def instance_seconds_from_cpu(host_cpu_s: float, prices: Prices, instance_memory_mb: int) -> float:
    """Billable instance-seconds per order from the hosts' CPU seconds per order, for an
    instance kept busy (a backlog, enough concurrency): it is billed while it executes, and
    while it is CPU-bound that is its CPU time spread over its cores. A lower bound: an
    instance waiting on I/O with executions in flight is billed too."""
    return host_cpu_s / prices.cores(instance_memory_mb)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cost", description=__doc__)
    parser.add_argument("--executions", type=float, required=True, help="per order")
    parser.add_argument("--instance-seconds", type=float, required=True, help="per order")
    parser.add_argument("--servicebus", type=float, required=True, help="operations per order")
    parser.add_argument("--table", type=float, required=True, help="transactions per order")
    parser.add_argument("--blob", type=float, default=0.0, help="operations per order")
    parser.add_argument("--memory-mb", type=int, default=2048, help="Flex instance memory")
    parser.add_argument("--orders-per-month", type=float, default=10 * MILLION)
    args = parser.parse_args(argv)
    usage = OrderUsage(
        executions=args.executions,
        instance_seconds=args.instance_seconds,
        servicebus_operations=args.servicebus,
        table_transactions=args.table,
        blob_operations=args.blob,
        instance_memory_mb=args.memory_mb,
    )
    bill = cost_per_million(usage, load_prices(), args.orders_per_month)
    print(json.dumps({"usd_per_million_orders": bill.rounded()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
