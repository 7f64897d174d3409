"""infra/ agrees with the code, the local settings and the broker's entity config (offline).

Each test runs one check of tests/infra/checks.py on the repository; test_mutations.py runs the
same checks on broken copies to show they fail.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from croniter import croniter

from adapters.retention_settings import (
    DEFAULT_PURGE_SCHEDULE,
    DEFAULT_RETENTION_DAYS,
    MAX_RETENTION_DAYS,
)
from adapters.settings import (
    QUEUE_SETTINGS,
    SERVICE_URL_SETTINGS,
    SERVICEBUS_CONNECTION,
    STATE_STORAGE_CONNECTION,
)
from infra import smoke
from tests.infra import checks, workbook


@pytest.fixture(scope="module", params=list(checks.SHAPES))
def layout(request) -> checks.Layout:
    """The repository, read in each shape of the templates (public, private network): every
    check of this module holds in both."""
    return checks.Layout(checks.REPO_ROOT, request.param)


def assert_clean(problems: list[str]) -> None:
    assert not problems, "\n".join(problems)


# ------------------------------------------------------- what the code reads (the oracle)


RETENTION_SETTINGS = {
    "RETENTION_DAYS",
    "PURGE_SCHEDULE",
    "ARCHIVE_CONTAINER",
    f"{STATE_STORAGE_CONNECTION}__blobServiceUri",
}


def test_code_facts_cover_the_settings_contract(facts):
    """The oracle the checks compare against really reflects adapters/settings.py and the bindings
    (if the recording trick broke, every other check would pass vacuously)."""
    operations = facts["operations"]
    facts = facts["pattern"]
    required = facts.required_settings
    assert set(QUEUE_SETTINGS.values()) <= required
    assert set(SERVICE_URL_SETTINGS.values()) <= required
    assert {
        "SUPERVISOR_SCHEDULE",
        "ORDERS_TABLE",
        "ACTIVE_ORDERS_TABLE",
        "SUPERVISION_TABLE",
        "SUPERVISOR_CONCURRENCY",
        "PENDING_STALE_AFTER_SECONDS",
        "STEP_TIMEOUT_SECONDS",
        "FAILURE_THRESHOLD",
        "RETRY_BASE_DELAY_SECONDS",
        "RETRY_MAX_DELAY_SECONDS",
        f"{SERVICEBUS_CONNECTION}__fullyQualifiedNamespace",
        f"{SERVICEBUS_CONNECTION}__credential",
        f"{SERVICEBUS_CONNECTION}__clientId",
        f"{STATE_STORAGE_CONNECTION}__tableServiceUri",
        f"{STATE_STORAGE_CONNECTION}__clientId",
    } <= required
    assert not required & {SERVICEBUS_CONNECTION, STATE_STORAGE_CONNECTION}, "secrets"
    # The Supervisor's leases are table rows: no lease container any more.
    assert "SUPERVISOR_LEASE_CONTAINER" not in required
    assert set(checks.FORBIDDEN_SETTINGS).isdisjoint(required)
    assert facts.binding_connections == {SERVICEBUS_CONNECTION}
    assert facts.trigger_queue_settings == set(QUEUE_SETTINGS.values()) - {"OPERATOR_ALERTS_QUEUE"}
    # The pattern app's code touches no blob: the retention purge is the operations app's.
    assert facts.storage_name_settings == {
        "ORDERS_TABLE": "table",
        "ACTIVE_ORDERS_TABLE": "table",
        "SUPERVISION_TABLE": "table",
    }
    assert set(facts.storage_name_settings) <= required
    assert operations.storage_name_settings == {
        "ORDERS_TABLE": "table",
        "ACTIVE_ORDERS_TABLE": "table",
        "SUPERVISION_TABLE": "table",
        "ARCHIVE_CONTAINER": "container",
    }
    # The metrics the Supervisor alerts query, as one tick records them.
    assert facts.metrics[checks.SUPERVISOR_LAG_METRIC] == "Gauge"
    assert checks.SUPERVISOR_TICK_METRIC in facts.metrics
    # The operations app reads the same settings and the retention purge's (the purge runs
    # there: the pattern app reads none of them), and binds no Service Bus trigger: the host
    # reads no connection of its own for it.
    assert operations.required_settings - required == RETENTION_SETTINGS
    assert not required & RETENTION_SETTINGS
    assert required - operations.required_settings == {f"{SERVICEBUS_CONNECTION}__credential"}
    assert operations.binding_connections == set() and operations.trigger_queue_settings == set()


# ---------------------------------------------------------------------- one test per check


def test_every_bicep_file_parses(layout):
    assert len(checks.bicep_files(layout.infra)) >= 8
    assert_clean(checks.check_bicep_parses(layout))


def test_no_preview_api_versions(layout):
    assert_clean(checks.check_api_versions(layout))


def test_service_bus_queues_match_the_broker_config(layout):
    assert_clean(checks.check_queues_match_broker(layout))
    infra = checks.Infra.load(layout)
    assert set(checks.declared_queues(infra)) == set(checks.broker_queues(layout.broker_config))


def test_app_settings_are_exactly_what_the_code_and_host_read(layout, facts):
    assert_clean(checks.check_app_settings(layout, facts))


def test_queue_settings_name_declared_queues(layout, facts):
    assert_clean(checks.check_queue_settings(layout, facts))


def test_receiver_role_exactly_on_the_queues_the_app_reads(layout, facts):
    assert_clean(checks.check_receiver_queues(layout, facts))


def test_tables_and_containers_are_declared_and_used(layout, facts):
    assert_clean(checks.check_storage_names(layout, facts))
    infra = checks.Infra.load(layout)
    settings = checks.function_app_settings(infra.bind(checks.PATTERN))
    operations = checks.function_app_settings(infra.bind(checks.OPERATIONS))
    tables = set()
    for bicep, symbol, resource in infra.resources(
        "Microsoft.Storage/storageAccounts/tableServices/tables"
    ):
        tables |= checks._declared_names(infra, bicep, symbol, resource)
    assert settings["SUPERVISION_TABLE"] == "supervision"
    assert {"orders", "activeorders", "supervision"} == tables
    containers = set()
    for bicep, symbol, resource in infra.resources(
        "Microsoft.Storage/storageAccounts/blobServices/containers"
    ):
        containers |= checks._declared_names(infra, bicep, symbol, resource)
    assert containers == {"app-package", "operations-package", "order-archive"}, (
        "no lease container"
    )
    assert operations["ARCHIVE_CONTAINER"] == "order-archive"
    assert "ARCHIVE_CONTAINER" not in settings, "the pattern app archives nothing"


def test_the_archive_has_its_own_role_and_moves_to_cool_storage(layout):
    assert_clean(checks.check_archive(layout))
    infra = checks.Infra.load(layout)
    settings = checks.function_app_settings(infra.bind(checks.OPERATIONS))
    assert settings["RETENTION_DAYS"] != "", "set from the retentionDays parameter"
    days = infra.main.params["retentionDays"]
    # What adapters/retention_settings.py accepts (0..MAX_RETENTION_DAYS) the parameter allows.
    bounds = {d["type"]: d["argument"] for d in days["decorators"]}
    assert (days["type"], bounds["min_value"], bounds["max_value"]) == (
        "int",
        0,
        MAX_RETENTION_DAYS,
    )
    assert days["default"] == DEFAULT_RETENTION_DAYS
    assert infra.main.params["purgeSchedule"]["default"] == DEFAULT_PURGE_SCHEDULE


def test_only_allowed_roles_are_granted(layout):
    assert_clean(checks.check_roles(layout))
    granted = {role for _, _, role in checks.granted_roles(checks.Infra.load(layout))}
    assert not granted & set(checks.KNOWN_BROAD_ROLES)


def test_every_role_the_app_needs_is_granted(layout):
    assert_clean(checks.check_required_roles(layout))


def test_every_operation_of_the_code_is_allowed_by_a_role(layout, facts):
    assert_clean(checks.check_data_roles(layout, facts))


def test_no_app_identity_holds_a_role_its_code_does_not_use(layout, facts):
    assert_clean(checks.check_surplus_roles(layout, facts))


def test_the_operations_are_read_from_the_code(facts):
    """The oracle of the role check sees what each function (each route of the operations
    app) really does (if the analysis lost its way, the role check would pass vacuously)."""
    pattern, operations = facts["pattern"].access, facts["operations"].access
    for access in (pattern, operations):
        assert not access.unclassified and not access.unfollowed
    access = pattern
    assert set(operations.accesses) >= {"list_orders", "dashboard_summary"}
    assert not set(pattern.accesses) & set(operations.accesses), "each app its own functions"

    def ops(function: str) -> set[tuple[str, str, str]]:
        accesses = pattern.accesses.get(function) or operations.accesses[function]
        return {(a.service, a.kind, a.resource[1]) for a in accesses}

    intake = ops("scheduler_intake")
    assert {
        ("queue", "receive", "ORDERS_QUEUE"),
        ("table", "write", "ORDERS_TABLE"),
        ("table", "write", "ACTIVE_ORDERS_TABLE"),
        ("queue", "send", "INVENTORY_REQUESTS_QUEUE"),
        ("queue", "send", "OPERATOR_ALERTS_QUEUE"),
    } <= intake
    # Status updates go to the queue the submitter names: a queue named at run time.
    assert any(
        a.service == "queue" and a.kind == "send" and a.resource[0] == "runtime"
        for a in access.accesses["scheduler_replies"]
    )
    # Agents reply and alert; the one table they touch is the supervision table, where their
    # circuit breakers' rows go (their requests are signed, not re-read from the orders table).
    for agent in ("inventory", "payment", "shipping"):
        agent_ops = ops(f"{agent}_agent")
        assert {op for op in agent_ops if op[0] != "queue"} == {
            ("table", "write", "SUPERVISION_TABLE")
        }
        assert ("queue", "send", "AGENT_RESPONSES_QUEUE") in agent_ops
    assert ("table", "write", "SUPERVISION_TABLE") in ops("supervisor")
    # The retention purge is the operations app's, beside the operator API's purge: the pattern
    # app's code touches no blob at all.
    assert "retention_purge" in operations.accesses
    assert {("blob", "write", "ARCHIVE_CONTAINER"), ("table", "write", "ORDERS_TABLE")} <= ops(
        "retention_purge"
    )
    assert ("blob", "read", "ARCHIVE_CONTAINER") in ops("show_archived_order")
    assert not any(a.service == "blob" for ops_ in pattern.accesses.values() for a in ops_)
    assert ("queue", "receive", "OPERATOR_ALERTS_QUEUE") in ops("acknowledge_alert")
    assert {a.resource[1] for a in operations.accesses["list_dead_letters"]} >= set(
        QUEUE_SETTINGS.values()
    )
    # The operations app sends to the commands queue only: its actions and its dead-letter
    # replays are sent by the pattern app, which it asks there (service/handover.py,
    # service/replays.py); the pattern app's commands trigger sends to any queue.
    commands = ("queue", "send", "SCHEDULER_COMMANDS_QUEUE")
    for route in (
        "resubmit_order",
        "bulk_cancel",
        "replay_dead_letters",
    ):
        assert commands in ops(route)
    assert {
        (a.service, a.kind, a.resource[1])
        for route in operations.accesses.values()
        for a in route
        if a.kind == "send"
    } == {commands}
    assert {("queue", "send", name) for name in QUEUE_SETTINGS.values()} <= ops(
        "scheduler_commands"
    )
    # The pattern app never reads the alerts queue: only operators (the operations app) do.
    assert not any(
        a.kind == "receive" and a.resource[1] == "OPERATOR_ALERTS_QUEUE"
        for ops_ in pattern.accesses.values()
        for a in ops_
    )
    # Nothing in either app reads a secret itself: MESSAGE_SIGNING_KEYS is resolved by the
    # platform (a Key Vault reference, checked from the Bicep).
    for access in (pattern, operations):
        assert not any(a.service == "secret" for ops_ in access.accesses.values() for a in ops_)


@pytest.mark.parametrize("app", checks.APPS, ids=lambda app: app.name)
def test_role_grants_and_key_vault_references_are_read_from_the_bicep(layout, app):
    """Each app runs as an identity of its own, and its grants are read from the Bicep."""
    infra = checks.Infra.load(layout).bind(app)
    identity = checks.app_identity(infra)
    assert identity == f"{app.name}Identity"
    granted = {
        (checks.ALLOWED_ROLES[g.role_id], g.scope, g.names)
        for g in checks.role_grants(infra)
        if g.principal == f"{identity}.outputs.principalId"
    }
    # The pattern app sends to queues named at run time: a Sender on the whole namespace. The
    # operations app sends to the commands queue only, and holds Sender there alone.
    senders = {names for role, _, names in granted if role == "Azure Service Bus Data Sender"}
    assert senders == ({None} if app is checks.PATTERN else {frozenset({"scheduler-commands"})})
    assert ("Storage Table Data Contributor", "storage", None) in granted
    receivers = {names for role, _, names in granted if role == "Azure Service Bus Data Receiver"}
    flagged = {n for n, q in checks.declared_queues(infra).items() if q.get(app.receive_flag)}
    assert receivers == {frozenset(flagged)}
    assert checks.key_vault_references(infra) == {"MESSAGE_SIGNING_KEYS": "message-signing-keys"}
    other = next(a for a in checks.APPS if a is not app)
    assert checks.app_identity(checks.Infra.load(layout).bind(other)) != identity


def test_shared_keys_and_local_auth_are_off(layout):
    assert_clean(checks.check_security(layout))


def test_telemetry_links_the_app_spans_to_the_host(layout):
    assert_clean(checks.check_telemetry(layout))


def test_alerts_page_operators(layout):
    assert_clean(checks.check_alerts(layout))


def test_supervisor_alerts_query_its_metrics(layout, facts):
    assert_clean(checks.check_supervisor_alerts(layout, facts))
    infra = checks.Infra.load(layout)
    alerts = checks.log_alerts(infra)
    by_metric = {metric: alert for alert in alerts for metric in alert.metrics}
    lag = by_metric[checks.SUPERVISOR_LAG_METRIC]
    assert lag.criterion["threshold"] == checks.LAG_THRESHOLD_PARAMETER
    assert infra.main.params[checks.LAG_THRESHOLD_PARAMETER]["default"] == 120
    assert by_metric[checks.SUPERVISOR_TICK_METRIC].props["windowSize"] == "PT15M"
    assert len(alerts) == 2


def test_no_blob_lease_left_behind(layout):
    """Nothing in the templates, their docs or the local settings names the old lease."""
    stale = ("supervisor-leases", "SUPERVISOR_LEASE_CONTAINER")
    paths = [
        *sorted(layout.infra.rglob("*.bicep")),
        layout.parameters_json,
        layout.infra / "README.md",
        layout.local_settings_example,
        DOC,
    ]
    for path in paths:
        text = path.read_text()
        for name in stale:
            assert name not in text, f"{path.relative_to(layout.root)} still mentions {name}"


def test_parameters_file_maps_the_main_parameters(layout):
    assert_clean(checks.check_parameters(layout))


def test_outputs_and_azure_yaml(layout):
    assert_clean(checks.check_outputs(layout))


def test_the_network_is_what_the_shape_says(layout):
    assert_clean(checks.check_network(layout))
    infra = checks.Infra.load(layout)
    endpoints = checks.private_endpoints(infra)
    # What the apps reach: their state and archive, their hosts' blobs and diagnostic events, the
    # signing key, the queues; no app or host uses a storage queue, so no queue endpoint.
    assert set(checks.private_link_groups(infra)) == {"blob", "table", "vault", "namespace"}
    files = {infra.rel(bicep.path) for bicep in infra.files.values() if infra.deployed(bicep)}
    network_files = {"infra/app/network.bicep", "infra/app/private-endpoint.bicep"}
    if layout.shape == "private":
        assert {group for e in endpoints for group in e.groups} == {
            "blob",
            "table",
            "vault",
            "namespace",
        }
        assert network_files <= files
    else:
        assert endpoints == [] and not network_files & files


def test_the_private_shape_is_the_vnet_enabled_parameter(layout):
    """The option is one parameter, off by default, mapped from VNET_ENABLED."""
    infra = checks.Infra.load(checks.Layout(checks.REPO_ROOT))
    parameter = infra.main.params[checks.SHAPE_PARAMETER]
    assert (parameter["type"], parameter["default"]) == ("bool", False)
    assert checks.SHAPES["public"] == {checks.SHAPE_PARAMETER: False}
    mapped = json.loads(layout.parameters_json.read_text())["parameters"]
    assert mapped[checks.SHAPE_PARAMETER]["value"] == "${VNET_ENABLED=false}"
    assert mapped["zoneRedundant"]["value"] == "${ZONE_REDUNDANT=false}"


def test_no_template_names_a_cloud_host(layout):
    assert_clean(checks.check_cloud_neutral(layout))


def test_location_is_a_flex_consumption_region(layout):
    infra = checks.Infra.load(layout)
    allowed = next(
        d["argument"] for d in infra.main.params["location"]["decorators"] if d["type"] == "allowed"
    )
    assert {"eastus", "westeurope", "swedencentral"} <= set(allowed)
    assert all(re.fullmatch(r"[a-z0-9]+", region) for region in allowed), allowed
    assert len(set(allowed)) == len(allowed)


# ------------------------------------------------------------------------- consistency


def test_smoke_command_defaults_match_the_infra(layout):
    infra = checks.Infra.load(layout)
    settings = checks.function_app_settings(infra.bind(checks.PATTERN))
    assert settings["ORDERS_QUEUE"] == smoke.DEFAULT_ORDERS_QUEUE
    assert settings["ORDERS_TABLE"] == smoke.DEFAULT_ORDERS_TABLE
    outputs = infra.main.outputs
    for name in (
        smoke.ENV_NAMESPACE,
        smoke.ENV_TABLE_ENDPOINT,
        smoke.ENV_ORDERS_QUEUE,
        smoke.ENV_ORDERS_TABLE,
    ):
        assert name in outputs, f"main.bicep must output {name} for `azd env get-values`"


DOC = checks.REPO_ROOT / "docs" / "deploy.md"


def test_deploy_doc_is_consistent_with_the_templates(layout):
    text = DOC.read_text()
    infra = checks.Infra.load(layout)
    for name in infra.main.params:
        assert f"`{name}`" in text, f"docs/deploy.md does not describe parameter {name}"
    parameters = json.loads(layout.parameters_json.read_text())["parameters"]
    for entry in parameters.values():
        variable = re.fullmatch(r"\$\{([A-Z_]+)(=.*)?\}", entry["value"]).group(1)
        assert variable in text, f"docs/deploy.md does not name azd variable {variable}"
    for role in checks.ALLOWED_ROLES.values():
        assert role in text, f"docs/deploy.md's identity table misses {role}"
    for command in (
        "azd up",
        "azd down --purge",
        "az deployment sub create",
        "config-zip",
        "python infra/smoke.py",
    ):
        assert command in text, f"docs/deploy.md does not show `{command}`"
    for metric in (checks.SUPERVISOR_LAG_METRIC, checks.SUPERVISOR_TICK_METRIC):
        assert f"`{metric}`" in text, f"docs/deploy.md's alert list does not name {metric}"
    for setting in (
        "SUPERVISION_TABLE",
        "SUPERVISOR_CONCURRENCY",
        "RETENTION_DAYS",
        "PURGE_SCHEDULE",
        "ARCHIVE_CONTAINER",
        "StateStorage__blobServiceUri",
    ):
        assert f"`{setting}`" in text, f"docs/deploy.md does not list app setting {setting}"
    schedule = infra.main.params["supervisorSchedule"]["default"]
    assert f"`{schedule}`" in text
    per_day = f"{executions_per_day(schedule):,}"
    assert per_day in text, f"docs/deploy.md must say the timer runs {per_day} times a day"


def executions_per_day(schedule: str) -> int:
    """Occurrences of an NCRONTAB schedule (seconds first) in one UTC day."""
    start = datetime(2025, 1, 1, tzinfo=UTC)
    runs = croniter(schedule, start, second_at_beginning=True, ret_type=datetime)
    count = 0
    while runs.get_next() <= start + timedelta(days=1):
        count += 1
    return count


def test_executions_per_day():
    assert executions_per_day("*/15 * * * * *") == 5760
    assert executions_per_day("0 */5 * * * *") == 288


def test_authentication_is_declared_and_no_http_function_is_open(layout, facts):
    assert_clean(checks.check_authentication(layout, facts))
    assert facts["pattern"].http_auth_levels == {}, "the pattern app serves no HTTP"
    assert facts["operations"].http_auth_levels == {"http_app_func": "function"}
    assert {"dashboard_page", "dashboard_summary", "resubmit_order"} <= set(
        facts["operations"].access.accesses
    )
    infra = checks.Infra.load(layout)
    assert infra.main.params["authClientId"]["default"] == ""
    assert infra.main.params["authUnauthenticatedAction"]["default"] == "AllowAnonymous"


# ------------------------------------------------------------------------------ workbook

WORKBOOK_JSON = checks.REPO_ROOT / "infra" / "app" / "workbook.json"
ISSUE_METRICS = {
    # The order metrics issue 14 asks for, by the names the workbook and dashboard chart.
    "orders.started",
    "orders.finished",
    "orders.failed",
    "step.duration",
    "step.retries",
    "agent.circuit.state",
    "supervisor.lag",
}


def test_the_metric_names_are_read_from_the_code(facts):
    """The oracle of the workbook check reflects adapters.metrics and service.sweep_report (an
    empty
    or partial set would let the coverage check pass vacuously)."""
    facts = facts["pattern"]
    assert facts.metric_names >= ISSUE_METRICS
    assert set(facts.metrics) <= facts.metric_names, "a tick records a metric NAMES leaves out"


def test_the_workbook_is_deployed_and_charts_every_metric(layout, facts):
    assert_clean(checks.check_workbook(layout, facts))
    infra = checks.Infra.load(layout)
    ((bicep, _, resource),) = infra.resources(checks.WORKBOOK_TYPE)
    assert [caller for caller, _ in infra.callers(bicep)] == [infra.main]
    assert resource["api_version"] == "2023-06-01"
    charts = workbook.charts(json.loads(WORKBOOK_JSON.read_text()))
    assert set().union(*(c.kql.metrics for c in charts)) == facts["pattern"].metric_names
    assert "WORKBOOK_URL" in infra.main.outputs


def test_deploy_doc_describes_every_workbook_chart():
    text = DOC.read_text()
    for chart in workbook.charts(json.loads(WORKBOOK_JSON.read_text())):
        assert f"**{chart.title}**" in text, f"docs/deploy.md does not describe {chart.title!r}"
