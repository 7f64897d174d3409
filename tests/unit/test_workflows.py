"""Workflow definitions, lookups and the retry policy."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from domain.workflows import (
    ORDER_WORKFLOW,
    ORDER_WORKFLOW_V2,
    SINGLE_STEP_WORKFLOW,
    WORKFLOW_NAMES,
    WORKFLOWS,
    RetryPolicy,
    Step,
    UnknownStep,
    UnknownWorkflow,
    Workflow,
    resolve,
)


def step(name: str, undo: str | None = "undo_it") -> Step:
    return Step(
        name=name,
        agent="inventory",
        operation="do_it",
        undo_operation=undo,
        complete_by_budget=timedelta(seconds=5),
    )


POLICY = RetryPolicy(base_delay=timedelta(seconds=1), factor=2.0, cap=timedelta(seconds=60))


class TestOrderWorkflow:
    def test_reference_steps_in_order(self):
        assert ORDER_WORKFLOW.step_names == (
            "reserve_inventory",
            "charge_payment",
            "create_shipment",
        )
        assert [(s.agent, s.operation, s.undo_operation) for s in ORDER_WORKFLOW.steps] == [
            ("inventory", "reserve", "release"),
            ("payment", "charge", "refund"),
            ("shipping", "create", "cancel"),
        ]

    def test_next_step(self):
        assert ORDER_WORKFLOW.first_step.name == "reserve_inventory"
        assert ORDER_WORKFLOW.next_step("reserve_inventory").name == "charge_payment"
        assert ORDER_WORKFLOW.next_step("charge_payment").name == "create_shipment"
        assert ORDER_WORKFLOW.next_step("create_shipment") is None

    def test_unknown_step_is_a_clear_error(self):
        with pytest.raises(UnknownStep) as caught:
            ORDER_WORKFLOW.step_named("teleport")
        assert str(caught.value) == (
            "workflow 'order' has no step 'teleport'; its steps are: "
            "reserve_inventory, charge_payment, create_shipment"
        )
        with pytest.raises(UnknownStep):
            ORDER_WORKFLOW.next_step("teleport")

    def test_action_for_direction_and_idempotency_key(self):
        charge = ORDER_WORKFLOW.step_named("charge_payment")
        assert charge.action_for("do") == "charge"
        assert charge.action_for("undo") == "refund"
        assert charge.idempotency_key("o-1", "undo", 2) == "o-1:charge_payment:undo:2"
        with pytest.raises(ValueError, match="no undo operation"):
            step("x", undo=None).action_for("undo")

    def test_registry(self):
        assert resolve(WORKFLOWS, "order@1") is ORDER_WORKFLOW
        assert resolve(WORKFLOWS, "order") is ORDER_WORKFLOW  # stored before versions: version 1
        assert resolve(WORKFLOWS, "order@2") is ORDER_WORKFLOW_V2
        assert WORKFLOWS["single_step@1"] is SINGLE_STEP_WORKFLOW
        assert SINGLE_STEP_WORKFLOW.step_names == ("reserve_inventory",)
        with pytest.raises(UnknownWorkflow, match="no workflow 'nope@1'; it carries order@1"):
            resolve(WORKFLOWS, "nope")
        with pytest.raises(UnknownWorkflow, match="no workflow 'order@7'"):
            resolve(WORKFLOWS, "order@7")
        for bad in ("order@", "order@x", "order@0", "order@-1"):
            with pytest.raises(UnknownWorkflow, match="is not a workflow reference"):
                resolve(WORKFLOWS, bad)
        with pytest.raises(TypeError):
            WORKFLOWS["x"] = ORDER_WORKFLOW  # type: ignore[index]

    def test_version_two_adds_a_step_in_the_middle_and_voids_instead_of_refunding(self):
        assert ORDER_WORKFLOW_V2.ref == "order@2" and ORDER_WORKFLOW.ref == "order@1"
        assert ORDER_WORKFLOW_V2.step_names == (
            "reserve_inventory",
            "charge_payment",
            "verify_address",
            "create_shipment",
        )
        assert ORDER_WORKFLOW_V2.step_named("charge_payment").undo_operation == "void"
        assert not ORDER_WORKFLOW_V2.step_named("verify_address").compensable
        assert WORKFLOW_NAMES == ("order", "single_step")


class TestWorkflowValidation:
    def test_duplicate_step_names(self):
        with pytest.raises(ValueError, match="two steps named 'a'"):
            Workflow("flow", (step("a"), step("a")), retry=POLICY)

    def test_empty(self):
        with pytest.raises(ValueError, match="has no steps"):
            Workflow("flow", (), retry=POLICY)

    def test_too_many_steps_for_one_create_transaction(self):
        with pytest.raises(ValueError, match="at most 90"):
            Workflow("flow", tuple(step(f"s{i}") for i in range(91)), retry=POLICY)

    @pytest.mark.parametrize("name", ["Bad", "a-b", "x' or 1", ""])
    def test_step_names_follow_the_name_rule(self, name):
        with pytest.raises(ValueError):
            step(name)

    def test_agent_must_be_known(self):
        with pytest.raises(ValueError, match="agent 'teleporter'"):
            Step("a", "teleporter", "go", None, timedelta(seconds=1))  # type: ignore[arg-type]

    def test_budget_must_be_positive(self):
        with pytest.raises(ValueError, match="complete_by_budget"):
            Step("a", "payment", "go", None, timedelta(0))

    def test_workflows_are_immutable_and_hashable(self):
        with pytest.raises(AttributeError):
            ORDER_WORKFLOW.name = "x"  # type: ignore[misc]
        assert hash(ORDER_WORKFLOW) == hash(ORDER_WORKFLOW)


class TestRetryPolicy:
    def test_grows_geometrically_until_the_cap(self):
        delays = [POLICY.nominal_delay(n).total_seconds() for n in range(1, 10)]
        assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60]

    def test_without_jitter_delay_is_nominal(self):
        policy = RetryPolicy(timedelta(seconds=3), 3.0, timedelta(minutes=1), jitter=0.0)
        rng = random.Random(1)
        assert [policy.delay(n, rng.random()).total_seconds() for n in (1, 2, 3, 4)] == [
            3,
            9,
            27,
            60,
        ]

    def test_jitter_stays_within_bounds_and_actually_varies(self):
        policy = RetryPolicy(timedelta(seconds=1), 2.0, timedelta(seconds=60), jitter=0.5)
        rng = random.Random(42)
        for failure_count in range(1, 12):
            nominal = policy.nominal_delay(failure_count)
            samples = {policy.delay(failure_count, rng.random()) for _ in range(200)}
            assert all(nominal * 0.5 <= d <= nominal for d in samples)
            assert all(d <= policy.cap for d in samples)
            assert len(samples) > 150

    def test_same_seed_same_delays(self):
        first = [POLICY.delay(n, random.Random(7).random()) for n in range(1, 6)]
        assert first == [POLICY.delay(n, random.Random(7).random()) for n in range(1, 6)]

    def test_huge_failure_counts_do_not_overflow(self):
        assert POLICY.nominal_delay(100_000) == POLICY.cap

    def test_failure_count_starts_at_one(self):
        with pytest.raises(ValueError, match="starts at 1"):
            POLICY.nominal_delay(0)

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"base_delay": timedelta(0)},
            {"factor": 0.5},
            {"cap": timedelta(milliseconds=1)},
            {"jitter": 1.5},
            {"jitter": -0.1},
        ],
    )
    def test_invalid_policies(self, kwargs):
        fields = {
            "base_delay": timedelta(seconds=1),
            "factor": 2.0,
            "cap": timedelta(seconds=10),
            "jitter": 0.1,
        }
        with pytest.raises(ValueError):
            RetryPolicy(**{**fields, **kwargs})
