"""Settings: required names, connection modes (connection string or managed identity), tuning."""

from __future__ import annotations

from datetime import timedelta

import pytest

from core.settings import Settings, SettingsError
from core.workflows import ORDER_WORKFLOW
from tests.support.app import EXAMPLE_SETTINGS


def env(**changes: str | None) -> dict[str, str]:
    values = dict(EXAMPLE_SETTINGS)
    for key, value in changes.items():
        if value is None:
            values.pop(key, None)
        else:
            values[key] = value
    return values


def test_example_settings_load_with_connection_strings():
    settings = Settings.from_env(env())
    assert settings.queue("orders") == "orders"
    assert settings.servicebus.connection_string and settings.servicebus.endpoint is None
    assert settings.storage.connection_string == "UseDevelopmentStorage=true"
    assert settings.pending_stale_after == timedelta(seconds=120)


def test_managed_identity_endpoints_instead_of_connection_strings():
    settings = Settings.from_env(
        env(
            ServiceBusConnection=None,
            StateStorage=None,
            ServiceBusConnection__fullyQualifiedNamespace="sb-x.servicebus.windows.net",
            ServiceBusConnection__clientId="1111",
            StateStorage__tableServiceUri="https://st.table.core.windows.net",
            StateStorage__blobServiceUri="https://st.blob.core.windows.net",
            StateStorage__clientId="1111",
        )
    )
    assert settings.servicebus.connection_string is None
    assert settings.servicebus.endpoint == "sb-x.servicebus.windows.net"
    assert settings.storage.endpoint == "https://st.table.core.windows.net"
    from azure.identity import ManagedIdentityCredential

    assert isinstance(settings.storage.credential(), ManagedIdentityCredential)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"ORDERS_QUEUE": None}, "ORDERS_QUEUE is not set"),
        ({"ServiceBusConnection": None}, "ServiceBusConnection__fullyQualifiedNamespace"),
        ({"StateStorage": None}, "StateStorage__tableServiceUri"),
        ({"PAYMENT_SERVICE_URL": "ftp://x"}, "PAYMENT_SERVICE_URL must be an http(s) URL"),
        ({"FAILURE_THRESHOLD": "zero"}, "FAILURE_THRESHOLD must be a positive integer"),
        ({"STEP_TIMEOUT_SECONDS": "-1"}, "STEP_TIMEOUT_SECONDS must be positive"),
        ({"ORDERS_QUEUE": "bad/queue"}, "ORDERS_QUEUE"),
        ({"RETENTION_DAYS": "-1"}, "RETENTION_DAYS must be a whole number of days from 0"),
        ({"RETENTION_DAYS": "3651"}, "to 3650, got '3651'"),
        ({"RETENTION_DAYS": "1.5"}, "RETENTION_DAYS must be a whole number"),
        ({"PURGE_SCHEDULE": "0 30 2 * *"}, "PURGE_SCHEDULE must be an NCRONTAB schedule of six"),
        ({"PURGE_SCHEDULE": "0 30 2 * * * ; rm"}, "PURGE_SCHEDULE must be an NCRONTAB"),
        ({"ARCHIVE_CONTAINER": "Order_Archive"}, "ARCHIVE_CONTAINER must be a blob container"),
        ({"ARCHIVE_CONTAINER": "ab"}, "ARCHIVE_CONTAINER must be a blob container"),
        ({"ARCHIVE_CONTAINER": "a--b"}, "single hyphens"),
    ],
)
def test_bad_settings_say_what_to_fix(changes, message):
    with pytest.raises((SettingsError, ValueError)) as caught:
        Settings.from_env(env(**changes))
    assert message in str(caught.value)


def test_retention_settings_and_their_defaults():
    settings = Settings.from_env(env())
    assert (settings.retention_days, settings.purge_schedule) == (30, "0 30 2 * * *")
    assert settings.archive_container == "order-archive"
    tuned = Settings.from_env(
        env(RETENTION_DAYS="0", PURGE_SCHEDULE=" 0  0 4 * * 1-5 ", ARCHIVE_CONTAINER="arch-1")
    )
    assert (tuned.retention_days, tuned.purge_schedule) == (0, "0 0 4 * * 1-5")
    assert tuned.archive_container == "arch-1"
    assert Settings.from_env(env(RETENTION_DAYS="3650")).retention_days == 3650


def test_managed_identity_storage_needs_the_blob_service_too():
    identity = {
        "StateStorage": None,
        "StateStorage__tableServiceUri": "https://st.table.core.windows.net",
        "StateStorage__clientId": "1111",
    }
    with pytest.raises(SettingsError, match="StateStorage__blobServiceUri is not set"):
        Settings.from_env(env(**identity))
    blob = "https://st.blob.core.windows.net"
    settings = Settings.from_env(env(**identity, StateStorage__blobServiceUri=blob))
    assert (settings.storage.endpoint, settings.storage.blob_endpoint) == (
        "https://st.table.core.windows.net",
        blob,
    )


def test_tuning_applies_to_every_workflow():
    settings = Settings.from_env(
        env(STEP_TIMEOUT_SECONDS="7", FAILURE_THRESHOLD="5", RETRY_BASE_DELAY_SECONDS="2")
    )
    flow = settings.workflows()["order"]
    assert {step.complete_by_budget for step in flow.steps} == {timedelta(seconds=7)}
    assert flow.failure_threshold == 5
    assert flow.retry.base_delay == timedelta(seconds=2)
    assert Settings.from_env(env()).workflows()["order"] == ORDER_WORKFLOW.__class__(
        name="order", steps=ORDER_WORKFLOW.steps, retry=ORDER_WORKFLOW.retry, failure_threshold=3
    )
