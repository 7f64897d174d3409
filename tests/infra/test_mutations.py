"""The infra checks fail when one place changes and the others do not.

Each case edits one file of a copy of the checked files (tmp_path), runs every check of
tests/infra/checks.py on the copy, and expects the named check to report the expected problem.
A case whose edit does not apply fails too, so a renamed line cannot turn a case into a no-op.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.infra import checks, code_access

OWNER = "8e3af657-a8ff-443c-a75c-2fe8c4bcb635"
CONTRIBUTOR = "b24988ac-6180-49ef-a2ac-17ca41fa4eb2"
SERVICE_BUS_DATA_OWNER = "090c5cfd-751d-490a-894a-3ce6f1109419"
SENDER = "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39"
TABLE_CONTRIBUTOR = "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3"
RECEIVER = "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0"


@dataclass(frozen=True)
class Mutation:
    id: str
    file: str
    edit: Callable[[str], str]
    check: str
    expect: str


def replace(old: str, new: str, count: int = 1) -> Callable[[str], str]:
    def edit(text: str) -> str:
        assert old in text, f"mutation does not apply: {old!r} not found"
        return text.replace(old, new, count)

    return edit


def sub(pattern: str, repl: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        result, n = re.subn(pattern, repl, text, count=1)
        assert n == 1, f"mutation does not apply: {pattern!r} not found"
        return result

    return edit


def flag(queue: str, name: str, old: str, new: str) -> Callable[[str], str]:
    """Set the flag ``name`` of ``queue`` in the Service Bus module from ``old`` to ``new``."""
    return sub(
        rf"(name: '{queue}'[^\n]*\n(?:\s*receivedBy\w+: \w+\n)*?\s*{name}: ){old}", rf"\1{new}"
    )


def scope(resource: str, old: str, new: str) -> Callable[[str], str]:
    """Change the scope of role assignment ``resource`` from ``old`` to ``new``."""
    return sub(rf"(resource {resource} [^\n]*\n(?:[^\n]*\n)*?  scope: ){old}", rf"\1{new}")


def extra_role(
    before: str, symbol: str, principal: str, role: str, target: str
) -> Callable[[str], str]:
    """Add role assignment ``symbol`` (``principal``, ``role`` on ``target``) before ``before``,
    with ``statusQueue``, the order-status queue, for a target no app reads."""
    block = (
        "resource statusQueue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' existing = {\n"
        "  parent: namespace\n  name: 'order-status'\n}\n\n"
        f"resource {symbol} 'Microsoft.Authorization/roleAssignments@2022-04-01' = {{\n"
        f"  name: guid({target}.id, {principal}, roles.{role})\n  scope: {target}\n"
        "  properties: {\n    roleDefinitionId: subscriptionResourceId("
        f"'Microsoft.Authorization/roleDefinitions', roles.{role})\n"
        f"    principalId: {principal}\n    principalType: 'ServicePrincipal'\n  }}\n}}\n\n"
    )
    return replace(f"resource {before} ", block + f"resource {before} ")


MAIN = "infra/main.bicep"
SERVICEBUS = "infra/app/servicebus.bicep"
STORAGE = "infra/app/storage.bicep"
FUNCTION = "infra/app/function.bicep"
RBAC = "infra/app/rbac.bicep"
MONITORING = "infra/app/monitoring.bicep"
KEYVAULT = "infra/app/keyvault.bicep"
NETWORK = "infra/app/network.bicep"
ENDPOINT = "infra/app/private-endpoint.bicep"
ALERTS = "infra/app/alerts.bicep"
CONFIG = "devstack/servicebus/Config.json"
EXAMPLE = "local.settings.json.example"

MUTATIONS = [
    # A queue renamed in one place only: each of the four places is caught.
    Mutation(
        "queue renamed in the Service Bus module",
        SERVICEBUS,
        replace("name: 'payment-requests'", "name: 'payments'"),
        "queues_match_broker",
        "payment-requests is in devstack/servicebus/Config.json but not in infra",
    ),
    Mutation(
        "queue renamed in the broker config",
        CONFIG,
        replace('"Name": "payment-requests"', '"Name": "payments"'),
        "queues_match_broker",
        "payment-requests is in infra but not in devstack/servicebus/Config.json",
    ),
    Mutation(
        "queue renamed in the app settings",
        MAIN,
        replace("PAYMENT_REQUESTS_QUEUE: 'payment-requests'", "PAYMENT_REQUESTS_QUEUE: 'payments'"),
        "queue_settings",
        "PAYMENT_REQUESTS_QUEUE names queue 'payments', which infra does not declare",
    ),
    Mutation(
        "queue renamed in local.settings.json.example",
        EXAMPLE,
        replace('"PAYMENT_REQUESTS_QUEUE": "payment-requests"', '"PAYMENT_REQUESTS_QUEUE": "pay"'),
        "queue_settings",
        "'pay' in local.settings.json.example",
    ),
    Mutation(
        "queue added to the broker config only",
        CONFIG,
        replace('"Queues": [', '"Queues": [{"Name": "extra", "Properties": {}},'),
        "queues_match_broker",
        "queue extra is in devstack/servicebus/Config.json but not in infra",
    ),
    # Queue properties.
    Mutation(
        "lock duration differs",
        CONFIG,
        replace('"LockDuration": "PT1M"', '"LockDuration": "PT2M"'),
        "queues_match_broker",
        "lockDuration is 'PT1M' in infra, 'PT2M' in Config.json",
    ),
    Mutation(
        "max delivery count differs",
        SERVICEBUS,
        replace("maxDeliveryCount: 10", "maxDeliveryCount: 5"),
        "queues_match_broker",
        "maxDeliveryCount is 5 in infra, 10 in Config.json",
    ),
    Mutation(
        "dead-lettering on expiration differs",
        SERVICEBUS,
        replace(
            "deadLetteringOnMessageExpiration: true", "deadLetteringOnMessageExpiration: false"
        ),
        "queues_match_broker",
        "deadLetteringOnMessageExpiration is False in infra, True in Config.json",
    ),
    Mutation(
        "duplicate detection window differs",
        CONFIG,
        replace(
            '"DuplicateDetectionHistoryTimeWindow": "PT10M"',
            '"DuplicateDetectionHistoryTimeWindow": "PT5M"',
        ),
        "queues_match_broker",
        "duplicateDetectionHistoryTimeWindow",
    ),
    Mutation(
        "infra sets a property the broker config does not declare",
        SERVICEBUS,
        replace("requiresSession: false", "requiresSession: false\n      maxSizeInMegabytes: 1024"),
        "queues_match_broker",
        "infra sets maxSizeInMegabytes",
    ),
    # App settings: every setting the code reads, nothing else, no secrets.
    Mutation(
        "a setting the code reads is missing",
        MAIN,
        replace("  FAILURE_THRESHOLD: failureThreshold\n", ""),
        "app_settings",
        "app setting FAILURE_THRESHOLD is read by the code but not set in infra",
    ),
    Mutation(
        "the Service Bus client id is missing",
        FUNCTION,
        replace("  ServiceBusConnection__clientId: identityClientId\n", ""),
        "app_settings",
        "ServiceBusConnection__clientId is read by the code but not set",
    ),
    Mutation(
        "the operations app loads the pattern app's entry",
        MAIN,
        replace(
            "PYTHON_SCRIPT_FILE_NAME: 'operations_app.py'", "PYTHON_SCRIPT_FILE_NAME: 'app.py'"
        ),
        "app_settings",
        "operations app: PYTHON_SCRIPT_FILE_NAME is 'app.py': the Python worker would load app.py",
    ),
    Mutation(
        "the pattern app told to load the operations app",
        MAIN,
        replace(
            "      ServiceBusConnection__credential: 'managedidentity'\n",
            "      ServiceBusConnection__credential: 'managedidentity'\n"
            "      PYTHON_SCRIPT_FILE_NAME: 'operations_app.py'\n",
        ),
        "app_settings",
        "pattern app: PYTHON_SCRIPT_FILE_NAME is 'operations_app.py'",
    ),
    Mutation(
        "the operations app given the host's trigger credential setting it never reads",
        MAIN,
        replace(
            "      PYTHON_SCRIPT_FILE_NAME: 'operations_app.py'\n",
            "      PYTHON_SCRIPT_FILE_NAME: 'operations_app.py'\n"
            "      ServiceBusConnection__credential: 'managedidentity'\n",
        ),
        "app_settings",
        "operations app: app setting ServiceBusConnection__credential is set in infra but must not",
    ),
    Mutation(
        "a setting nothing reads",
        MAIN,
        replace("  ORDERS_TABLE: 'orders'\n", "  ORDERS_TABLE: 'orders'\n  UNUSED_KNOB: 'x'\n"),
        "app_settings",
        "app setting UNUSED_KNOB is set in infra but must not be",
    ),
    Mutation(
        "a connection string instead of the identity",
        MAIN,
        replace(
            "var appSettings = {\n",
            "var appSettings = {\n  ServiceBusConnection: 'Endpoint=sb://x/;SharedAccessKey=k'\n",
        ),
        "app_settings",
        "ServiceBusConnection is set in infra but must not be: a connection string",
    ),
    Mutation(
        "FUNCTIONS_WORKER_RUNTIME on Flex",
        FUNCTION,
        replace(
            "var hostSettings = {\n", "var hostSettings = {\n  FUNCTIONS_WORKER_RUNTIME: 'python'\n"
        ),
        "app_settings",
        "FUNCTIONS_WORKER_RUNTIME is set in infra but must not be: Flex Consumption rejects",
    ),
    Mutation(
        "the principal id where the client id belongs",
        FUNCTION,
        replace(
            "StateStorage__clientId: identityClientId",
            "StateStorage__clientId: identityId",
        ),
        "app_settings",
        "StateStorage__clientId is",
    ),
    Mutation(
        "host storage setting missing",
        FUNCTION,
        replace("  AzureWebJobsStorage__clientId: identityClientId\n", ""),
        "app_settings",
        "host setting AzureWebJobsStorage__clientId",
    ),
    # Storage names.
    Mutation(
        "table renamed in the storage module",
        STORAGE,
        replace("'activeorders'", "'activeorder'"),
        "storage_names",
        "table activeorders is used but the storage module does not declare it",
    ),
    Mutation(
        "supervision table missing from the storage module",
        STORAGE,
        replace("  'supervision'\n", ""),
        "storage_names",
        "table supervision is used but the storage module does not declare it",
    ),
    Mutation(
        "supervision table renamed in the app settings",
        MAIN,
        replace("SUPERVISION_TABLE: 'supervision'", "SUPERVISION_TABLE: 'leases'"),
        "storage_names",
        "table leases is used but the storage module does not declare it",
    ),
    Mutation(
        "supervision table renamed in local.settings.json.example",
        EXAMPLE,
        replace('"SUPERVISION_TABLE": "supervision"', '"SUPERVISION_TABLE": "sup"'),
        "storage_names",
        "SUPERVISION_TABLE is 'supervision' in infra but 'sup' in local.settings.json.example",
    ),
    Mutation(
        "SUPERVISION_TABLE not set",
        MAIN,
        replace("  SUPERVISION_TABLE: 'supervision'\n", ""),
        "app_settings",
        "app setting SUPERVISION_TABLE is read by the code but not set in infra",
    ),
    Mutation(
        "SUPERVISOR_CONCURRENCY not set",
        MAIN,
        replace("  SUPERVISOR_CONCURRENCY: supervisorConcurrency\n", ""),
        "app_settings",
        "app setting SUPERVISOR_CONCURRENCY is read by the code but not set in infra",
    ),
    # The Supervisor's blob lease is gone: no container, no setting for it.
    Mutation(
        "lease container declared again",
        STORAGE,
        replace(
            "resource tableService ",
            "resource leaseContainer 'Microsoft.Storage/storageAccounts/blobServices/containers"
            "@2023-05-01' = {\n  parent: blobService\n  name: 'supervisor-leases'\n}\n\n"
            "resource tableService ",
        ),
        "storage_names",
        "container supervisor-leases is declared but nothing uses it",
    ),
    Mutation(
        "lease container setting set again",
        MAIN,
        replace(
            "  SUPERVISION_TABLE: 'supervision'\n",
            "  SUPERVISION_TABLE: 'supervision'\n"
            "  SUPERVISOR_LEASE_CONTAINER: 'supervisor-leases'\n",
        ),
        "app_settings",
        "SUPERVISOR_LEASE_CONTAINER is set in infra but must not be: the Supervisor's blob lease",
    ),
    # The archive of purged orders.
    Mutation(
        "blob service URI not set",
        MAIN,
        replace("  StateStorage__blobServiceUri: storage.outputs.blobEndpoint\n", ""),
        "app_settings",
        "operations app: app setting StateStorage__blobServiceUri is read by the code but not set",
    ),
    Mutation(
        "retention setting not set",
        MAIN,
        replace("  RETENTION_DAYS: string(retentionDays)\n", ""),
        "app_settings",
        "operations app: app setting RETENTION_DAYS is read by the code but not set in infra",
    ),
    # The retention purge's settings are the operations app's: the pattern app reads none.
    Mutation(
        "the pattern app given the retention purge's settings",
        MAIN,
        replace(
            "    appSettings: union(appSettings, {\n      ServiceBusConnection__credential",
            "    appSettings: union(appSettings, retentionSettings, {\n"
            "      ServiceBusConnection__credential",
        ),
        "app_settings",
        "pattern app: app setting ARCHIVE_CONTAINER is set in infra but must not be: nothing in "
        "the code or the host reads it",
    ),
    Mutation(
        "the operations app not given the retention purge's settings",
        MAIN,
        replace("union(appSettings, retentionSettings, {", "union(appSettings, {"),
        "app_settings",
        "operations app: app setting PURGE_SCHEDULE is read by the code but not set in infra",
    ),
    Mutation(
        "archive container renamed in the app settings only",
        MAIN,
        replace("ARCHIVE_CONTAINER: 'order-archive'", "ARCHIVE_CONTAINER: 'archive'"),
        "storage_names",
        "container archive is used but the storage module does not declare it",
    ),
    Mutation(
        "archive role widened to the storage account",
        RBAC,
        replace("  scope: archiveContainer\n", "  scope: storage\n"),
        "archive",
        "grants Storage Blob Data Contributor beyond one container",
    ),
    Mutation(
        "archive role dropped",
        RBAC,
        sub(r"resource operationsArchiveBlobDataContributor [^\n]*\n(?:  [^\n]*\n)+}\n", ""),
        "archive",
        "no Storage Blob Data Contributor on the archive container",
    ),
    Mutation(
        "lifecycle rule on append blobs, which have no tiers",
        STORAGE,
        replace("'blockBlob'", "'appendBlob'"),
        "archive",
        "no enabled lifecycle rule moves block blobs under 'order-archive/' to cool storage",
    ),
    Mutation(
        "lifecycle rule on another prefix",
        STORAGE,
        replace("'${archiveContainerName}/'", "'archive/'"),
        "archive",
        "no enabled lifecycle rule moves block blobs under 'order-archive/'",
    ),
    # Roles.
    Mutation(
        "Owner granted",
        RBAC,
        replace(SENDER, OWNER),
        "roles",
        "(Owner)",
    ),
    Mutation(
        "Contributor granted",
        RBAC,
        replace(TABLE_CONTRIBUTOR, CONTRIBUTOR),
        "roles",
        "(Contributor)",
    ),
    Mutation(
        "Service Bus Data Owner instead of Receiver",
        RBAC,
        replace(RECEIVER, SERVICE_BUS_DATA_OWNER),
        "roles",
        "(Azure Service Bus Data Owner)",
    ),
    Mutation(
        "a broad role only mentioned in a comment",
        RBAC,
        replace("// Built-in role definition ids", f"// Owner would be {OWNER}. Built-in role ids"),
        "roles",
        f"mentions role id {OWNER} (Owner)",
    ),
    Mutation(
        "Monitoring Metrics Publisher no longer granted",
        RBAC,
        replace(
            "roleDefinitions', roles.monitoringMetricsPublisher)",
            "roleDefinitions', roles.storageTableDataReader)",
            count=-1,
        ),
        "required_roles",
        "Monitoring Metrics Publisher",
    ),
    Mutation(
        "Receiver granted on a queue nothing in the app reads",
        SERVICEBUS,
        flag("order-status", "receivedByPattern", "false", "true"),
        "receiver_queues",
        "pattern app: queue order-status is receivedByPattern but nothing in its code reads it",
    ),
    Mutation(
        "the pattern app given Receiver on the alerts queue only operators read",
        SERVICEBUS,
        flag("operator-alerts", "receivedByPattern", "false", "true"),
        "receiver_queues",
        "pattern app: queue operator-alerts is receivedByPattern but nothing in its code reads it",
    ),
    Mutation(
        "the operations app given Receiver on a queue it never reads",
        SERVICEBUS,
        flag("order-status", "receivedByOperations", "false", "true"),
        "receiver_queues",
        "operations app: queue order-status is receivedByOperations but nothing in its code reads",
    ),
    Mutation(
        "no Receiver on a queue a trigger reads",
        SERVICEBUS,
        flag("orders", "receivedByPattern", "true", "false"),
        "receiver_queues",
        "pattern app: queue orders is read by its code (a trigger or the operator API) but is not "
        "receivedByPattern",
    ),
    Mutation(
        "no Receiver for the operations app on a queue whose dead letters it reads",
        SERVICEBUS,
        flag("payment-requests", "receivedByOperations", "true", "false"),
        "receiver_queues",
        "operations app: queue payment-requests is read by its code (a trigger or the operator "
        "API) but is not receivedByOperations",
    ),
    Mutation(
        "worker threads for sync functions, though every function is async",
        FUNCTION,
        sub(r"(\n\s*)PYTHON_ENABLE_OPENTELEMETRY", r"\1PYTHON_THREADPOOL_THREAD_COUNT: '16'\g<0>"),
        "app_settings",
        "app setting PYTHON_THREADPOOL_THREAD_COUNT is set in infra but must not be",
    ),
    Mutation(
        "no Receiver on the alerts queue the operator API settles",
        SERVICEBUS,
        flag("operator-alerts", "receivedByOperations", "true", "false"),
        "receiver_queues",
        "operations app: queue operator-alerts is read by its code (a trigger or the operator "
        "API) but is not receivedByOperations",
    ),
    # Data roles against what the code does (tests/infra/code_access.py).
    # Each app's roles are derived from its own code: a role missing from either app's identity
    # fails data_roles for that app, a role its code never uses fails surplus_roles.
    *(
        Mutation(
            f"Sender role of the {app} app dropped",
            RBAC,
            sub(rf"resource {app}ServiceBusSender [^\n]*\n(?:  [^\n]*\n)+}}\n", ""),
            "data_roles",
            f"{app} app: {functions}: sends to {queue}",
        )
        for app, functions, queue in (
            (
                "pattern",
                "scheduler_commands, scheduler_intake, scheduler_replies, supervisor",
                "a queue named at run time",
            ),
            (
                "operations",
                "bulk_cancel, bulk_resubmit, cancel_order, "
                "purge_dead_letters, replay_dead_letters, "
                "restart_order, resubmit_order",
                "queue 'scheduler-commands' (SCHEDULER_COMMANDS_QUEUE)",
            ),
        )
    ),
    Mutation(
        "Sender of the pattern app narrowed to the orders queue: status replies go to queues "
        "named at run time",
        RBAC,
        sub(
            r"(resource patternServiceBusSender [^\n]*\n(?:[^\n]*\n)*?  scope: )namespace",
            r"\1submitQueue",
        ),
        "data_roles",
        "sends to a queue named at run time (`queue`) at service/apply.py:",
    ),
    Mutation(
        "Sender of the pattern app narrowed to the orders queue: the internal queues",
        RBAC,
        sub(
            r"(resource patternServiceBusSender [^\n]*\n(?:[^\n]*\n)*?  scope: )namespace",
            r"\1submitQueue",
        ),
        "data_roles",
        "sends to queue 'inventory-requests' (INVENTORY_REQUESTS_QUEUE)",
    ),
    Mutation(
        "Sender of the operations app moved to the orders queue: its commands go unsent",
        RBAC,
        sub(
            r"(resource operationsServiceBusSender [^\n]*\n(?:[^\n]*\n)*?  scope: )commandsQueue",
            r"\1submitQueue",
        ),
        "data_roles",
        "operations app: bulk_cancel, bulk_resubmit, cancel_order",
    ),
    *(
        Mutation(
            f"Table Data Contributor of the {app} app downgraded to Reader",
            RBAC,
            sub(
                rf"(resource {app}TableDataContributor [^\n]*\n(?:[^\n]*\n)*?[^\n]*)"
                r"roleDefinitions', roles\.storageTableDataContributor\)",
                r"\1roleDefinitions', roles.storageTableDataReader)",
            ),
            "data_roles",
            f"{app} app: {functions}: writes table 'orders' (ORDERS_TABLE)",
        )
        for app, functions in (
            (
                "pattern",
                "scheduler_commands, scheduler_intake, scheduler_replies, supervisor",
            ),
            (
                "operations",
                "acknowledge_alert, bulk_cancel, bulk_resubmit, "
                "cancel_order, list_orders, purge, "
                "purge_dead_letters, replay_dead_letters, "
                "resubmit_order, retention_purge",
            ),
        )
    ),
    Mutation(
        "Table Data Contributor narrowed to the orders table",
        RBAC,
        sub(
            r"(resource patternTableDataContributor [^\n]*\n(?:[^\n]*\n)*?  scope: )storage",
            r"\1ordersTable",
        ),
        "data_roles",
        "writes table 'supervision' (SUPERVISION_TABLE)",
    ),
    Mutation(
        "Receiver of the pattern app dropped",
        RBAC,
        sub(r"resource patternServiceBusReceiver [^\n]*\n(?:  [^\n]*\n)+}\]\n", ""),
        "data_roles",
        "pattern app: scheduler_intake: receives from queue 'orders' (ORDERS_QUEUE)",
    ),
    Mutation(
        "Receiver of the operations app dropped",
        RBAC,
        sub(r"resource operationsServiceBusReceiver [^\n]*\n(?:  [^\n]*\n)+}\]\n", ""),
        "data_roles",
        "operations app: acknowledge_alert, dashboard_summary,",
    ),
    # The retention purge (its timer, the operator API's purge and archive reads) is the
    # operations app's: the archive role is its identity's alone.
    Mutation(
        "both blob roles of the operations app dropped: the purge could not archive",
        RBAC,
        lambda text: sub(r"resource operationsBlobDataOwner [^\n]*\n(?:  [^\n]*\n)+}\n", "")(
            sub(r"resource operationsArchiveBlobDataContributor [^\n]*\n(?:  [^\n]*\n)+}\n", "")(
                text
            )
        ),
        "data_roles",
        "operations app: purge, retention_purge: writes container 'order-archive' "
        "(ARCHIVE_CONTAINER)",
    ),
    Mutation(
        "the pattern app granted the archive role again: nothing of its code archives",
        RBAC,
        extra_role(
            "patternMetricsPublisher",
            "patternArchiveBlobDataContributor",
            "patternPrincipalId",
            "storageBlobDataContributor",
            "archiveContainer",
        ),
        "surplus_roles",
        "pattern app: infra/app/rbac.bicep: patternArchiveBlobDataContributor grants Storage Blob "
        "Data Contributor to its identity, but nothing in its code needs it",
    ),
    *(
        Mutation(
            f"Key Vault Secrets User of the {app} app dropped",
            KEYVAULT,
            sub(rf"resource {app}ReadsSigningKeys [^\n]*\n(?:  [^\n]*\n)+}}\n", ""),
            "data_roles",
            f"{app} app: app setting MESSAGE_SIGNING_KEYS is a Key Vault reference to secret "
            "'message-signing-keys', but no role of the app identity allows reading it",
        )
        for app in ("pattern", "operations")
    ),
    # Surplus: a role an app's code never uses, or on more queues than it uses it on.
    Mutation(
        "the operations app granted Sender on the whole namespace: it could send to an agent",
        RBAC,
        sub(
            r"(resource operationsServiceBusSender [^\n]*\n(?:[^\n]*\n)*?  scope: )commandsQueue",
            r"\1namespace",
        ),
        "surplus_roles",
        "operations app: infra/app/rbac.bicep: operationsServiceBusSender grants Azure Service "
        "Bus Data Sender to its identity on every queue of the namespace, but its code uses it "
        "only on scheduler-commands: grant it on those queues alone",
    ),
    Mutation(
        "the operations app granted Sender on an agent's queue beside the commands queue",
        RBAC,
        lambda text: extra_role(
            "operationsMetricsPublisher",
            "operationsInventorySender",
            "operationsPrincipalId",
            "serviceBusDataSender",
            "inventoryQueue",
        )(
            replace(
                "resource submitQueue ",
                "resource inventoryQueue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' "
                "existing = {\n  parent: namespace\n  name: 'inventory-requests'\n}\n\n"
                "resource submitQueue ",
            )(text)
        ),
        "surplus_roles",
        "operations app: infra/app/rbac.bicep: operationsInventorySender grants Azure Service Bus "
        "Data Sender to its identity, but nothing in its code needs it",
    ),
    Mutation(
        "the pattern app granted Receiver on a queue nothing reads, through a role of its own",
        RBAC,
        extra_role(
            "patternMetricsPublisher",
            "patternStatusReceiver",
            "patternPrincipalId",
            "serviceBusDataReceiver",
            "statusQueue",
        ),
        "surplus_roles",
        "pattern app: infra/app/rbac.bicep: patternStatusReceiver grants Azure Service Bus Data "
        "Receiver to its identity, but nothing in its code needs it",
    ),
    Mutation(
        "the operations app granted Receiver on a queue nothing reads, through a role of its own",
        RBAC,
        extra_role(
            "operationsMetricsPublisher",
            "operationsStatusReceiver",
            "operationsPrincipalId",
            "serviceBusDataReceiver",
            "statusQueue",
        ),
        "surplus_roles",
        "operations app: infra/app/rbac.bicep: operationsStatusReceiver grants Azure Service Bus "
        "Data Receiver to its identity, but nothing in its code needs it",
    ),
    Mutation(
        "Key Vault references resolved with another identity",
        FUNCTION,
        replace("    keyVaultReferenceIdentity: identityId\n", ""),
        "data_roles",
        "keyVaultReferenceIdentity must be the app's user-assigned identity",
    ),
    # Telemetry (docs/deploy.md, Telemetry).
    Mutation(
        "host telemetry back to the Application Insights SDK",
        "host.json",
        replace('  "telemetryMode": "OpenTelemetry",\n', ""),
        "telemetry",
        "host.json telemetryMode is None, must be 'OpenTelemetry'",
    ),
    Mutation(
        "worker OpenTelemetry switch off",
        FUNCTION,
        replace("PYTHON_ENABLE_OPENTELEMETRY: 'true'", "PYTHON_ENABLE_OPENTELEMETRY: 'false'"),
        "telemetry",
        "PYTHON_ENABLE_OPENTELEMETRY is 'false', must be 'true'",
    ),
    Mutation(
        "sampling settings the host ignores in OpenTelemetry mode",
        "host.json",
        replace(
            '  "logging": {\n',
            '  "logging": {\n    "applicationInsights": {"samplingSettings": {}},\n',
        ),
        "telemetry",
        "host.json sets logging.applicationInsights, which the host ignores",
    ),
    Mutation(
        "telemetry authenticated as another principal",
        MAIN,
        replace(
            "    identityClientId: operationsIdentity.outputs.clientId\n",
            "    identityClientId: operationsIdentity.outputs.principalId\n",
        ),
        "telemetry",
        "operations app: APPLICATIONINSIGHTS_AUTHENTICATION_STRING names client id "
        "operationsIdentity.outputs.principalId",
    ),
    # Security flags.
    Mutation(
        "storage shared keys on",
        STORAGE,
        replace("allowSharedKeyAccess: false", "allowSharedKeyAccess: true"),
        "security",
        "allowSharedKeyAccess is True, must be False",
    ),
    Mutation(
        "storage TLS 1.0",
        STORAGE,
        replace("minimumTlsVersion: 'TLS1_2'", "minimumTlsVersion: 'TLS1_0'"),
        "security",
        "minimumTlsVersion is 'TLS1_0', must be 'TLS1_2'",
    ),
    Mutation(
        "storage over HTTP",
        STORAGE,
        replace("supportsHttpsTrafficOnly: true", "supportsHttpsTrafficOnly: false"),
        "security",
        "supportsHttpsTrafficOnly is False, must be True",
    ),
    Mutation(
        "Service Bus SAS keys on",
        SERVICEBUS,
        replace("disableLocalAuth: true", "disableLocalAuth: false"),
        "security",
        "disableLocalAuth is False, must be True",
    ),
    Mutation(
        "Service Bus Basic tier",
        SERVICEBUS,
        replace("name: 'Standard'\n  tier: 'Standard'", "name: 'Basic'\n  tier: 'Basic'"),
        "security",
        "sku 'Basic'",
    ),
    Mutation(
        "App Insights keys on",
        MONITORING,
        replace("DisableLocalAuth: true", "DisableLocalAuth: false"),
        "security",
        "DisableLocalAuth is False, must be True",
    ),
    Mutation(
        "a key read into a setting",
        FUNCTION,
        replace(
            "var hostSettings = {\n",
            "var hostSettings = {\n  K: storage.listKeys().keys[0].value\n",
        ),
        "security",
        "calls listKeys(...)",
    ),
    Mutation(
        "function app on Python 3.12",
        FUNCTION,
        replace("version: '3.11'", "version: '3.12'"),
        "security",
        "version is '3.12', must be '3.11'",
    ),
    # Alerts.
    Mutation(
        "alert on the wrong metric",
        ALERTS,
        replace("metricName: 'ActiveMessages'", "metricName: 'IncomingMessages'"),
        "alerts",
        "operator alert waiting",
    ),
    Mutation(
        "alerts queue renamed in the alert only",
        MAIN,
        replace(
            "operatorAlertsQueueName: appSettings.OPERATOR_ALERTS_QUEUE",
            "operatorAlertsQueueName: 'alerts'",
        ),
        "alerts",
        "ActiveMessages > 0 on EntityName 'operator-alerts'",
    ),
    Mutation(
        "dead-letter alert only on one queue",
        ALERTS,
        replace("                '*'\n", "                'orders'\n"),
        "alerts",
        "DeadletteredMessages > 0 on EntityName '*'",
    ),
    # Supervisor alerts (log search alerts on Application Insights).
    Mutation(
        "lag alert queries another metric",
        ALERTS,
        replace('name == "supervisor.lag"', 'name == "supervisor.lags"'),
        "supervisor_alerts",
        "no log search alert queries customMetrics for 'supervisor.lag'",
    ),
    Mutation(
        "lag alert reads another table",
        ALERTS,
        replace(
            "'customMetrics | where name == \"supervisor.lag\"'",
            "'customEvents | where name == \"supervisor.lag\"'",
        ),
        "supervisor_alerts",
        "no log search alert queries customMetrics for 'supervisor.lag'",
    ),
    Mutation(
        "lag alert averages instead of taking the maximum",
        ALERTS,
        replace(
            "timeAggregation: 'Maximum'\n          metricMeasureColumn",
            "timeAggregation: 'Average'\n          metricMeasureColumn",
        ),
        "supervisor_alerts",
        "timeAggregation is 'Average', must be 'Maximum'",
    ),
    Mutation(
        "lag threshold hard-coded in the alert",
        ALERTS,
        replace("threshold: supervisorLagAlertSeconds", "threshold: 600"),
        "supervisor_alerts",
        "threshold is 600 in infra/app/alerts.bicep, must be main.bicep's parameter "
        "supervisorLagAlertSeconds",
    ),
    Mutation(
        "lag threshold not passed by main.bicep",
        MAIN,
        replace("    supervisorLagAlertSeconds: supervisorLagAlertSeconds\n", ""),
        "supervisor_alerts",
        "in infra/app/alerts.bicep, must be main.bicep's parameter supervisorLagAlertSeconds",
    ),
    Mutation(
        "lag threshold below two Supervisor periods",
        MAIN,
        replace(
            "param supervisorLagAlertSeconds int = 120", "param supervisorLagAlertSeconds int = 20"
        ),
        "supervisor_alerts",
        "supervisorLagAlertSeconds defaults to 20 s, not above two Supervisor periods",
    ),
    Mutation(
        "lag threshold not in main.parameters.json",
        "infra/main.parameters.json",
        replace('"supervisorLagAlertSeconds"', '"supervisorLagAlertSecs"'),
        "supervisor_alerts",
        "main.parameters.json does not map supervisorLagAlertSeconds",
    ),
    Mutation(
        "lag alert notifies no one",
        ALERTS,
        replace(
            "    actions: {\n      actionGroups: [\n        actionGroup.id\n      ]\n    }\n", ""
        ),
        "supervisor_alerts",
        "(Supervisor lag): does not notify an action group that emails the operators",
    ),
    Mutation(
        "lag alert scoped to the Service Bus namespace",
        ALERTS,
        replace("    scopes: [\n      appInsights.id\n", "    scopes: [\n      namespace.id\n"),
        "supervisor_alerts",
        "(Supervisor lag): scopes must be the Application Insights component's id",
    ),
    Mutation(
        "lag alert evaluated every 15 minutes",
        ALERTS,
        replace(
            "evaluationFrequency: 'PT5M'\n    windowSize: 'PT10M'",
            "evaluationFrequency: 'PT15M'\n    windowSize: 'PT15M'",
        ),
        "supervisor_alerts",
        "(Supervisor lag): evaluationFrequency is 'PT15M', must be 'PT5M'",
    ),
    Mutation(
        "lag alert disabled",
        ALERTS,
        sub(
            r"(resource supervisorLag [^\n]*\n(?:[^\n]*\n)*?\s*)enabled: true", r"\1enabled: false"
        ),
        "supervisor_alerts",
        "(Supervisor lag): not enabled",
    ),
    Mutation(
        "not-running alert queries another metric",
        ALERTS,
        replace('name == "supervisor.tick.duration"', 'name == "service.sweep"'),
        "supervisor_alerts",
        "no log search alert queries customMetrics for 'supervisor.tick.duration'",
    ),
    Mutation(
        "not-running alert fires on ticks instead of their absence",
        ALERTS,
        replace("operator: 'LessThan'", "operator: 'GreaterThan'"),
        "supervisor_alerts",
        "(Supervisor not running): operator is 'GreaterThan', must be 'LessThan'",
    ),
    Mutation(
        "not-running alert window shortened",
        ALERTS,
        replace("windowSize: 'PT15M'", "windowSize: 'PT5M'"),
        "supervisor_alerts",
        "(Supervisor not running): windowSize is 'PT5M', must be 'PT15M'",
    ),
    # Files, parameters, azd.
    Mutation(
        "a syntax error",
        MAIN,
        replace("output AZURE_LOCATION string = location", "output AZURE_LOCATION string = {"),
        "parses",
        "infra/main.bicep does not parse",
    ),
    Mutation(
        "a module file missing",
        MAIN,
        replace("'app/alerts.bicep'", "'app/alert.bicep'"),
        "parses",
        "missing alert.bicep",
    ),
    Mutation(
        "a preview API version",
        SERVICEBUS,
        replace("namespaces@2024-01-01' = {", "namespaces@2022-10-01-preview' = {"),
        "api_versions",
        "uses preview API 2022-10-01-preview",
    ),
    Mutation(
        "a required parameter missing from main.parameters.json",
        "infra/main.parameters.json",
        replace('"alertEmail"', '"alertMail"'),
        "parameters",
        "alertEmail has no default and is not in main.parameters.json",
    ),
    Mutation(
        "azure.yaml service hosted elsewhere",
        "azure.yaml",
        replace("host: function", "host: containerapp"),
        "outputs",
        "services.pattern.host is 'containerapp'",
    ),
    Mutation(
        "azd service tag differs from azure.yaml",
        MAIN,
        replace("var operationsService = 'operations'", "var operationsService = 'ops'"),
        "outputs",
        "operations app: function app tag azd-service-name is 'ops', azure.yaml says 'operations'",
    ),
    Mutation(
        "one app missing from azure.yaml",
        "azure.yaml",
        sub(r"  operations:\n(?:    [^\n]*\n)+", ""),
        "outputs",
        "azure.yaml must declare the services ['operations', 'pattern'], found ['pattern']",
    ),
]

# App Service Authentication: declared, off until an app registration is given, never open.
PARAMETERS = "infra/main.parameters.json"
MUTATIONS += [
    Mutation(
        "authentication settings removed",
        FUNCTION,
        replace("name: 'authsettingsV2'", "name: 'web'"),
        "authentication",
        "expected one Microsoft.Web/sites/config 'authsettingsV2'",
    ),
    Mutation(
        "authentication deployed without a client id",
        FUNCTION,
        replace("= if (authEnabled) {", "= {"),
        "authentication",
        "must be deployed only when authClientId is given",
    ),
    Mutation(
        "authentication on by default with a fixed registration",
        MAIN,
        replace("param authClientId string = ''", "param authClientId string = 'ops-app'"),
        "authentication",
        "main.bicep parameter authClientId must default to ''",
    ),
    Mutation(
        "authentication platform switched off",
        FUNCTION,
        replace("platform: {\n      enabled: true", "platform: {\n      enabled: false"),
        "authentication",
        "platform.enabled is False, must be True",
    ),
    Mutation(
        "authentication over plain HTTP",
        FUNCTION,
        replace("requireHttps: true", "requireHttps: false"),
        "authentication",
        "httpSettings.requireHttps is False",
    ),
    Mutation(
        "client id hard-coded in the module",
        FUNCTION,
        replace("clientId: authClientId", "clientId: 'ops-app'"),
        "authentication",
        "registration.clientId must come from a main.bicep parameter",
    ),
    Mutation(
        "client id no longer settable by azd",
        PARAMETERS,
        sub(r'\s*"authClientId": \{\s*"value": "\$\{AUTH_CLIENT_ID\}"\s*\},', ""),
        "authentication",
        "main.parameters.json does not map authClientId",
    ),
    Mutation(
        "an unknown way to treat callers not signed in",
        MAIN,
        sub(r"'Return401'(\n\]\)\n@description\('With authClientId)", r"'Allow'\1"),
        "authentication",
        "globalValidation.unauthenticatedClientAction may be",
    ),
]

# The operators' workbook: deployed, on the app's component, from its JSON file, charting exactly
# the metrics the code defines, with no role of its own.
WORKBOOK = "infra/app/workbook.bicep"
WORKBOOK_JSON = "infra/app/workbook.json"


def both(*edits: Callable[[str], str]) -> Callable[[str], str]:
    def edit(text: str) -> str:
        for one in edits:
            text = one(text)
        return text

    return edit


MUTATIONS += [
    Mutation(
        "workbook module dropped from main.bicep",
        MAIN,
        both(
            sub(r"(?s)module workbook 'app/workbook\.bicep' = \{.*?\n\}\n", ""),
            sub(r"output WORKBOOK_URL [^\n]*\n", ""),
        ),
        "workbook",
        "infra/app/workbook.bicep is not deployed by infra/main.bicep",
    ),
    Mutation(
        "workbook deployed only on a condition",
        MAIN,
        replace(
            "module workbook 'app/workbook.bicep' = {",
            "module workbook 'app/workbook.bicep' = if (!empty(principalId)) {",
        ),
        "workbook",
        "infra/app/workbook.bicep is not always deployed by infra/main.bicep",
    ),
    Mutation(
        "a metric misspelled in a chart",
        WORKBOOK_JSON,
        replace('\\"orders.finished\\"', '\\"orders.finish\\"'),
        "workbook",
        "queries metric 'orders.finish', which the code does not define",
    ),
    Mutation(
        "a chart reads an attribute its metric is not recorded with",
        WORKBOOK_JSON,
        replace("customDimensions.reason", "customDimensions.cause"),
        "workbook",
        "reads customDimensions.cause, but 'orders.failed' is recorded with",
    ),
    Mutation(
        "a metric misspelled in a chart leaves it uncharted",
        WORKBOOK_JSON,
        replace('\\"orders.finished\\"', '\\"orders.finish\\"'),
        "workbook",
        "metric 'orders.finished' is defined by the code but no chart queries it",
    ),
    Mutation(
        "a chart of a metric's name prefix",
        WORKBOOK_JSON,
        replace(
            'where name in (\\"supervisor.rows_read\\", \\"supervisor.recovered\\", '
            '\\"supervisor.buckets_unfinished\\")',
            'where name startswith \\"supervisor.\\"',
        ),
        "workbook",
        "compares name with startswith",
    ),
    Mutation(
        "a chart reads a table Application Insights does not have",
        WORKBOOK_JSON,
        replace(
            '"query": "requests\\n| make-series Invocations',
            '"query": "request\\n| make-series Invocations',
        ),
        "workbook",
        "reads 'request', which is not an Application Insights table",
    ),
    Mutation(
        "a chart bound to a time range that is not declared",
        WORKBOOK_JSON,
        replace('"timeContextFromParameter": "TimeRange"', '"timeContextFromParameter": "Range"'),
        "workbook",
        "timeContextFromParameter is 'Range', must name a time range parameter",
    ),
    Mutation(
        "the workbook JSON no longer parses",
        WORKBOOK_JSON,
        lambda text: text.rstrip()[:-1],
        "workbook",
        "infra/app/workbook.json does not parse as JSON",
    ),
    Mutation(
        "workbook content from a file that is not there",
        WORKBOOK,
        replace("loadTextContent('workbook.json')", "loadTextContent('dashboard.json')"),
        "workbook",
        "infra/app/dashboard.json, the workbook's content, cannot be read",
    ),
    Mutation(
        "workbook content inline instead of the JSON file",
        WORKBOOK,
        sub(r"(?s)serializedData: string\(.*?\}\)\)\n", "serializedData: '{}'\n"),
        "workbook",
        "serializedData must be string(union(json(loadTextContent('<file>.json'))",
    ),
    Mutation(
        "workbook content without the fallback to the component",
        WORKBOOK,
        sub(
            r"(?s)serializedData: string\(.*?\}\)\)\n",
            "serializedData: loadTextContent('workbook.json')\n",
        ),
        "workbook",
        "the fallback makes it query the component when it is opened with no resource",
    ),
    Mutation(
        "the workbook JSON pasted back with the portal's fallback ids",
        WORKBOOK_JSON,
        replace(
            '"version": "Notebook/1.0",',
            '"version": "Notebook/1.0",\n  "fallbackResourceIds": ["/subscriptions/x"],',
        ),
        "workbook",
        "holds fallbackResourceIds (a copy from the portal?)",
    ),
    Mutation(
        "workbook not on the Application Insights component",
        WORKBOOK,
        replace("sourceId: appInsights.id", "sourceId: 'Azure Monitor'"),
        "workbook",
        "sourceId must be the id of the Application Insights component",
    ),
    Mutation(
        "workbook on another component than the app's",
        MAIN,
        replace(
            "    appInsightsName: monitoring.outputs.appInsightsName\n    location: location\n"
            "    tags: tags\n    displayName:",
            "    appInsightsName: 'appi-elsewhere'\n    location: location\n"
            "    tags: tags\n    displayName:",
        ),
        "workbook",
        "reads the component named by appi-elsewhere, but the function app",
    ),
    Mutation(
        "workbook falls back to another resource",
        WORKBOOK,
        replace(
            "fallbackResourceIds: [\n        appInsights.id", "fallbackResourceIds: [\n        'x'"
        ),
        "workbook",
        "fallbackResourceIds must be the sourceId component's id",
    ),
    Mutation(
        "workbook named by a fixed string",
        WORKBOOK,
        replace("name: guid(appInsights.id, 'orders-workbook')", "name: 'orders-workbook'"),
        "workbook",
        "name must be guid(...) of stable values",
    ),
    Mutation(
        "workbook named by a new GUID on every deployment",
        WORKBOOK,
        both(
            replace("name: guid(appInsights.id, 'orders-workbook')", "name: guid(seed)"),
            replace(
                "param displayName string\n",
                "param displayName string\nparam seed string = newGuid()\n",
            ),
        ),
        "workbook",
        "name depends on newGuid(): every deployment would add another workbook",
    ),
    Mutation(
        "workbook kind changed",
        WORKBOOK,
        replace("kind: 'shared'", "kind: 'user'"),
        "workbook",
        "kind is 'user', must be 'shared'",
    ),
    Mutation(
        "workbook category changed",
        WORKBOOK,
        replace("category: 'workbook'", "category: 'tsg'"),
        "workbook",
        "category is 'tsg', must be 'workbook'",
    ),
    Mutation(
        "a role granted on the workbook",
        WORKBOOK,
        replace(
            "output id string = workbook.id",
            "resource reader 'Microsoft.Authorization/roleAssignments@2022-04-01' = {\n"
            "  name: guid(workbook.id, 'readers')\n"
            "  scope: workbook\n"
            "  properties: {\n"
            "    roleDefinitionId: subscriptionResourceId("
            "'Microsoft.Authorization/roleDefinitions', '3913510d-42f4-4e42-8a64-420c390055eb')\n"
            "    principalId: '00000000-0000-0000-0000-000000000000'\n"
            "  }\n"
            "}\n\n"
            "output id string = workbook.id",
        ),
        "workbook",
        "reader grants a role in the workbook module; the workbook needs none",
    ),
]

# The private network option: a resource left public, or a private path missing, in the private
# shape; a private setting leaking into the public shape (where the apps have no private path).
PRIVATE = "private shape (vnetEnabled=true): "
PUBLIC = "public shape (vnetEnabled=false): "
MUTATIONS += [
    Mutation(
        "storage account left public in the private shape",
        STORAGE,
        replace(
            "publicNetworkAccess: vnetEnabled ? 'Disabled' : 'Enabled'",
            "publicNetworkAccess: 'Enabled'",
        ),
        "network",
        PRIVATE + "storage account account: publicNetworkAccess is 'Enabled' in the private shape",
    ),
    Mutation(
        "storage account's default network rule left Allow in the private shape",
        STORAGE,
        replace("defaultAction: vnetEnabled ? 'Deny' : 'Allow'", "defaultAction: 'Allow'"),
        "network",
        PRIVATE + "storage account account: networkAcls.defaultAction is 'Allow' in the private",
    ),
    Mutation(
        "Key Vault left public in the private shape",
        KEYVAULT,
        replace(
            "publicNetworkAccess: vnetEnabled ? 'Disabled' : 'Enabled'",
            "publicNetworkAccess: 'Enabled'",
        ),
        "network",
        PRIVATE + "Key Vault vault: publicNetworkAccess is 'Enabled' in the private shape",
    ),
    Mutation(
        "Key Vault's default network rule left Allow in the private shape",
        KEYVAULT,
        replace("defaultAction: vnetEnabled ? 'Deny' : 'Allow'", "defaultAction: 'Allow'"),
        "network",
        PRIVATE + "Key Vault vault: networkAcls.defaultAction is 'Allow' in the private shape",
    ),
    Mutation(
        "Service Bus left public in the private shape",
        SERVICEBUS,
        replace(
            "publicNetworkAccess: vnetEnabled ? 'Disabled' : 'Enabled'",
            "publicNetworkAccess: 'Enabled'",
        ),
        "network",
        PRIVATE
        + "Service Bus namespace namespace: publicNetworkAccess is 'Enabled' in the private",
    ),
    Mutation(
        "Service Bus stays Standard in the private shape",
        SERVICEBUS,
        replace("sku: vnetEnabled ? premiumSku : standardSku", "sku: standardSku"),
        "network",
        PRIVATE
        + "Service Bus namespace namespace: sku is 'Standard' in the private shape; private "
        "endpoints need Premium",
    ),
    Mutation(
        "Service Bus Premium in the public shape too",
        SERVICEBUS,
        replace("sku: vnetEnabled ? premiumSku : standardSku", "sku: premiumSku"),
        "network",
        PUBLIC + "Service Bus namespace namespace: sku is 'Premium' in the public shape",
    ),
    Mutation(
        "storage account closed in the public shape too (the apps could not reach it)",
        STORAGE,
        replace(
            "publicNetworkAccess: vnetEnabled ? 'Disabled' : 'Enabled'",
            "publicNetworkAccess: 'Disabled'",
        ),
        "network",
        PUBLIC + "storage account account: publicNetworkAccess is 'Disabled' in the public shape, "
        "must be 'Enabled': the apps have no private path to it",
    ),
    Mutation(
        "no private endpoint for the table service",
        MAIN,
        replace("groupId: 'table'", "groupId: 'queue'"),
        "network",
        PRIVATE + "no private endpoint of group 'table' on the storage account (pattern app "
        "setting AzureWebJobsStorage__tableServiceUri)",
    ),
    Mutation(
        "a private endpoint deployed in the public shape",
        MAIN,
        replace(
            "module vaultEndpoint 'app/private-endpoint.bicep' = if (vnetEnabled) {",
            "module vaultEndpoint 'app/private-endpoint.bicep' = {",
        ),
        "network",
        PUBLIC + "infra/app/private-endpoint.bicep: endpoint (Microsoft.Network/privateEndpoints) "
        "is deployed in the public shape",
    ),
    Mutation(
        "the operations app not in the network",
        MAIN,
        replace("    subnetId: vnetEnabled ? network.outputs.operationsSubnetId : ''\n", ""),
        "network",
        PRIVATE + "operations app (infra/app/function.bicep: functionApp): virtualNetworkSubnetId "
        "is not a subnet of the virtual network vnet",
    ),
    Mutation(
        "both apps in one subnet",
        MAIN,
        replace("network.outputs.operationsSubnetId", "network.outputs.patternSubnetId"),
        "network",
        "shares subnet pattern-app with the pattern app",
    ),
    Mutation(
        "an app's subnet not delegated to Microsoft.App/environments",
        NETWORK,
        replace("          delegations: flexConsumptionDelegation\n", ""),
        "network",
        PRIVATE + "pattern app (infra/app/function.bicep: functionApp): its subnet pattern-app is "
        "not delegated to Microsoft.App/environments",
    ),
    Mutation(
        "a private endpoint in an app's delegated subnet",
        MAIN,
        replace(
            "subnetId: vnetEnabled ? network.outputs.privateEndpointSubnetId : ''",
            "subnetId: vnetEnabled ? network.outputs.patternSubnetId : ''",
        ),
        "network",
        PRIVATE
        + "main.bicep module blobEndpoint (infra/app/private-endpoint.bicep: endpoint): its "
        "subnet is delegated",
    ),
    Mutation(
        "a private endpoint without its DNS zone",
        ENDPOINT,
        replace("privateDnsZoneId: zone.id", "privateDnsZoneId: virtualNetworkId"),
        "network",
        "needs a private DNS zone group whose zone is linked to the virtual network vnet",
    ),
    Mutation(
        "the DNS zone not linked to the network",
        ENDPOINT,
        replace("  parent: zone\n", "  parent: endpoint\n"),
        "network",
        "needs a private DNS zone group whose zone is linked to the virtual network vnet",
    ),
    Mutation(
        "a public-cloud host name in a template",
        MAIN,
        replace(
            "'privatelink.blob.${environment().suffixes.storage}'",
            "'privatelink.blob.core.windows.net'",
        ),
        "cloud_neutral",
        "names core.windows.net: take it from the cloud",
    ),
    Mutation(
        "host storage named by its account name",
        FUNCTION,
        replace(
            "AzureWebJobsStorage__blobServiceUri: storage.properties.primaryEndpoints.blob",
            "AzureWebJobsStorage__accountName: storage.name",
        ),
        "app_settings",
        "app setting AzureWebJobsStorage__accountName is set in infra but must not be: the host "
        "builds the public cloud's host names from it",
    ),
]

# Consistent edits (every place changed together) must pass: the checks catch drift, not change.
CONSISTENT_EDITS: dict[str, list[tuple[str, Callable[[str], str]]]] = {
    "queue renamed everywhere": [
        (SERVICEBUS, replace("name: 'payment-requests'", "name: 'payments'")),
        (CONFIG, replace('"Name": "payment-requests"', '"Name": "payments"')),
        (MAIN, replace("QUEUE: 'payment-requests'", "QUEUE: 'payments'")),
        (EXAMPLE, replace('QUEUE": "payment-requests"', 'QUEUE": "payments"')),
    ],
    "lock duration changed everywhere": [
        (SERVICEBUS, replace("lockDuration: 'PT1M'", "lockDuration: 'PT2M'", count=-1)),
        (CONFIG, replace('"LockDuration": "PT1M"', '"LockDuration": "PT2M"', count=-1)),
    ],
    "deployment container renamed (one variable)": [
        (MAIN, replace("patternPackageContainer = 'app-package'", "patternPackageContainer = 'x'")),
    ],
    "supervision table renamed everywhere": [
        (STORAGE, replace("  'supervision'\n", "  'leases'\n")),
        (MAIN, replace("SUPERVISION_TABLE: 'supervision'", "SUPERVISION_TABLE: 'leases'")),
        (EXAMPLE, replace('"SUPERVISION_TABLE": "supervision"', '"SUPERVISION_TABLE": "leases"')),
    ],
    "slower Supervisor schedule with a higher lag threshold": [
        (MAIN, replace("string = '*/15 * * * * *'", "string = '0 * * * * *'")),
        (
            MAIN,
            replace("supervisorLagAlertSeconds int = 120", "supervisorLagAlertSeconds int = 300"),
        ),
    ],
}


def apply(layout: checks.Layout, file: str, edit: Callable[[str], str]) -> None:
    path: Path = layout.root / file
    path.write_text(edit(path.read_text()))


def test_the_unmodified_copy_passes_every_check(repo_copy, facts):
    results = checks.run_all(repo_copy, facts)
    assert not results, checks.format_problems(results)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.id for m in MUTATIONS])
def test_a_drift_fails_the_check(repo_copy, facts, mutation):
    apply(repo_copy, mutation.file, mutation.edit)
    results = checks.run_all(repo_copy, facts)
    problems = results.get(mutation.check, [])
    assert any(mutation.expect in problem for problem in problems), (
        f"check {mutation.check!r} did not report {mutation.expect!r}; it reported:\n"
        + (checks.format_problems(results) or "nothing at all")
    )


@pytest.mark.parametrize(
    ("metric", "recorded", "expect"),
    [
        (
            checks.SUPERVISOR_LAG_METRIC,
            None,
            "a Supervisor tick records no metric 'supervisor.lag'",
        ),
        (checks.SUPERVISOR_LAG_METRIC, "Histogram", "'supervisor.lag' is a Histogram in the code"),
        (checks.SUPERVISOR_TICK_METRIC, None, "records no metric 'supervisor.tick.duration'"),
    ],
)
def test_a_metric_renamed_in_the_code_fails_the_alert_check(
    layout, facts, metric, recorded, expect
):
    """The code side of the Supervisor alerts: the facts, not the files, drift."""
    metrics = dict(facts["pattern"].metrics)
    metrics.pop(metric)
    if recorded is not None:
        metrics[metric] = recorded
    drifted = {**facts, "pattern": dataclasses.replace(facts["pattern"], metrics=metrics)}
    problems = checks.check_supervisor_alerts(layout, drifted)
    assert any(expect in problem for problem in problems), problems


@pytest.mark.parametrize("level", ["anonymous", ""])
def test_an_http_function_without_a_key_fails_the_authentication_check(layout, facts, level):
    """The code side: the operations app's HTTP function served without a key."""
    operations = facts["operations"]
    levels = {**operations.http_auth_levels, "http_app_func": level}
    drifted = {**facts, "operations": dataclasses.replace(operations, http_auth_levels=levels)}
    problems = checks.check_authentication(layout, drifted)
    expected = "operations app: HTTP function http_app_func has authLevel"
    assert any(expected in p for p in problems), problems


def test_an_http_function_in_the_pattern_app_fails_the_authentication_check(layout, facts):
    """The pattern app serves no HTTP, keyed or not: its instances scale with the queues."""
    pattern = dataclasses.replace(facts["pattern"], http_auth_levels={"ping": "function"})
    problems = checks.check_authentication(layout, {**facts, "pattern": pattern})
    assert any("pattern app: function ping is HTTP-triggered" in p for p in problems), problems


@pytest.mark.parametrize(
    ("added", "removed", "expect"),
    [
        (
            {"orders.compensated"},
            set(),
            "metric 'orders.compensated' is defined by the code but no chart queries it",
        ),
        (set(), {"step.retries"}, "queries metric 'step.retries', which the code does not define"),
        (set(), {"supervisor.lag"}, "queries metric 'supervisor.lag', which the code does not"),
    ],
)
def test_a_metric_added_or_dropped_in_the_code_fails_the_workbook_check(
    layout, facts, added, removed, expect
):
    """The code side of the workbook: a new metric needs a chart, a chart needs its metric."""
    names = (facts["pattern"].metric_names | added) - removed
    drifted = {**facts, "pattern": dataclasses.replace(facts["pattern"], metric_names=names)}
    problems = checks.check_workbook(layout, drifted)
    assert any(expect in problem for problem in problems), problems


def test_a_metric_renamed_in_the_code_and_the_workbook_passes(repo_copy, facts):
    old, new = "step.retries", "step.redispatched"
    apply(repo_copy, WORKBOOK_JSON, replace(f'\\"{old}\\"', f'\\"{new}\\"', count=-1))
    renamed = (facts["pattern"].metric_names - {old}) | {new}
    drifted = {**facts, "pattern": dataclasses.replace(facts["pattern"], metric_names=renamed)}
    problems = checks.check_workbook(repo_copy, drifted)
    assert not problems, problems


@pytest.mark.parametrize("edits", CONSISTENT_EDITS.values(), ids=CONSISTENT_EDITS.keys())
def test_a_consistent_change_passes(repo_copy, facts, edits):
    for file, edit in edits:
        apply(repo_copy, file, edit)
    results = checks.run_all(repo_copy, facts)
    assert not results, checks.format_problems(results)


# ------------------------------------------------------------------- the code drifts instead


@dataclass(frozen=True)
class CodeMutation:
    id: str
    file: str
    edit: Callable[[str], str]
    check: str
    expect: str
    app: checks.App = checks.PATTERN
    """The app whose code the edit changes."""


def first_line_of(function: str, code: str) -> Callable[[str], str]:
    """Insert ``code`` (one statement per line, no indentation) as the first statements of
    ``def function(...)`` or ``async def function(...)``."""
    pattern = rf"(\n(?P<indent>[ ]*)(?:async )?def {function}\((?:[^()]|\([^()]*\))*\)[^:\n]*:\n)"

    def edit(text: str) -> str:
        match = re.search(pattern, text)
        assert match, f"mutation does not apply: def {function} not found"
        body = match["indent"] + "    "
        inserted = "".join(f"{body}{line}\n" for line in code.splitlines())
        return text[: match.end()] + inserted + text[match.end() :]

    return edit


CODE_MUTATIONS = [
    CodeMutation(
        "an agent reads a secret of its own from Key Vault",
        "service/agent.py",
        first_line_of(
            "handle_request",
            "from azure.keyvault.secrets.aio import SecretClient\n"
            'vault = SecretClient("https://v.vault.azure.net", credential=None)\n'
            'await vault.get_secret("pay-key")',
        ),
        "data_roles",
        "payment_agent, shipping_agent: reads secret 'pay-key' at service/agent.py",
    ),
    CodeMutation(
        "the operator API peeks a queue the app has no Receiver on",
        "service/operations/alerts.py",
        first_line_of("list_alerts", 'ctx.queues.peek("order-status", from_sequence=1, limit=1)'),
        "data_roles",
        "operations app: dashboard_summary, list_alerts: receives from queue "
        "'order-status' at adapters/queues.py",
        checks.OPERATIONS,
    ),
    CodeMutation(
        "the purge writes to a container the storage module does not declare",
        "retention/functions.py",
        first_line_of(
            "retention_purge",
            "from adapters.archive import blob_service\n"
            "service = blob_service(retention_of(root.runtime().settings).storage)\n"
            'service.get_container_client("exports").upload_blob("x", b"")',
        ),
        "storage_names",
        "container exports is used but the storage module does not declare it",
        checks.OPERATIONS,
    ),
    CodeMutation(
        "the purge writes through the Table client to a table the storage module lacks",
        "retention/functions.py",
        first_line_of(
            "retention_purge",
            "from adapters import clients\n"
            "service = clients.table_service(root.runtime().settings.storage)\n"
            'await service.get_table_client("exports").upsert_entity({})',
        ),
        "storage_names",
        "table exports is used but the storage module does not declare it",
        checks.OPERATIONS,
    ),
    CodeMutation(
        "a table call the role check does not know",
        "supervisor/functions.py",
        first_line_of("supervisor", "root.runtime().store._orders.set_table_access_policy({})"),
        "data_roles",
        "Table.set_table_access_policy: the role check cannot classify this client call",
    ),
    CodeMutation(
        "a client call on a value the analysis cannot follow",
        "supervisor/functions.py",
        first_line_of("supervisor", 'vars(root)["anything"].upsert_entity({})'),
        "data_roles",
        "an Azure operation on a client the role check lost track of",
    ),
]


@pytest.fixture(scope="module")
def functions() -> dict[str, list[dict]]:
    return {app.name: checks.indexed_functions(entry=app.entry) for app in checks.APPS}


@pytest.fixture(scope="module")
def app_code() -> set[str]:
    """The files and packages of what either app's entry point imports, top level."""
    programs = [code_access.Program(checks.REPO_ROOT, app.entry) for app in checks.APPS]
    return {Path(module.rel).parts[0] for p in programs for module in p.modules.values()}


@pytest.fixture
def code_copy(tmp_path: Path, app_code: set[str]) -> Path:
    """The app's code, copied under tmp_path (the infra checks read the real templates)."""
    for relative in sorted(app_code):
        source = checks.REPO_ROOT / relative
        target = tmp_path / relative
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    return tmp_path


@pytest.mark.parametrize("mutation", CODE_MUTATIONS, ids=[m.id for m in CODE_MUTATIONS])
def test_a_new_call_without_a_role_fails_the_check(layout, facts, functions, code_copy, mutation):
    """A call added to the code (the templates unchanged) is found by reading the code, and
    the check that covers it fails. Each file edited keeps the lines of every function entry,
    so the indexed entries of the real code still point at them."""
    path = code_copy / mutation.file
    path.write_text(mutation.edit(path.read_text()))
    app = mutation.app
    access = checks.code_access_of(code_copy, functions[app.name], app)
    drifted = {**facts, app.name: dataclasses.replace(facts[app.name], access=access)}
    results = checks.run_all(layout, drifted)
    problems = results.get(mutation.check, [])
    assert any(mutation.expect in problem for problem in problems), (
        f"check {mutation.check!r} did not report {mutation.expect!r}; it reported:\n"
        + (checks.format_problems(results) or "nothing at all")
    )


def test_the_unmodified_code_copy_passes(layout, facts, functions, code_copy):
    copied = {}
    for app in checks.APPS:
        access = checks.code_access_of(code_copy, functions[app.name], app)
        assert access.accesses == facts[app.name].access.accesses
        copied[app.name] = dataclasses.replace(facts[app.name], access=access)
    results = checks.run_all(layout, copied)
    assert not results, checks.format_problems(results)
