"""Settings: required names, connection modes (connection string or managed identity), tuning."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from adapters.retention_settings import Retention, RetentionSettings, retention_of
from adapters.setting_values import SettingsError
from adapters.settings import MAX_RUN_BUDGET, Connection, ServiceLimits, Settings
from devstack.stack.processes import REPO_ROOT
from domain.signing import local_keyring, parse_keyring
from domain.workflows import ORDER_WORKFLOW, WORKFLOWS
from service.composition import PatternRoot
from tests.support.app import EXAMPLE_SETTINGS
from tests.support.keys import new_key_text


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
            MESSAGE_SIGNING_KEYS=new_key_text("k1"),
            StateStorage__clientId="1111",
        )
    )
    assert settings.servicebus.connection_string is None
    assert settings.servicebus.endpoint == "sb-x.servicebus.windows.net"
    assert settings.storage.endpoint == "https://st.table.core.windows.net"
    from azure.identity.aio import ManagedIdentityCredential

    from adapters.credentials import credential

    assert isinstance(credential(settings.storage), ManagedIdentityCredential)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"ORDERS_QUEUE": None}, "ORDERS_QUEUE is not set"),
        ({"ServiceBusConnection": None}, "ServiceBusConnection__fullyQualifiedNamespace"),
        ({"StateStorage": None}, "StateStorage__tableServiceUri"),
        ({"PAYMENT_SERVICE_URL": "ftp://x"}, "PAYMENT_SERVICE_URL must be an http(s) URL"),
        ({"FAILURE_THRESHOLD": "zero"}, "FAILURE_THRESHOLD must be a whole number from 1 to"),
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
        ({"COMPENSATION_BUDGET_SECONDS": "0"}, "COMPENSATION_BUDGET_SECONDS must be positive"),
        ({"COMPENSATION_BUDGET_SECONDS": "6h"}, "must be a number of seconds from 0.001 to"),
        (
            {"COMPENSATION_BUDGET_SECONDS": "600", "COMPENSATION_WARN_AFTER_SECONDS": "600"},
            "COMPENSATION_WARN_AFTER_SECONDS (600) must be less than "
            "COMPENSATION_BUDGET_SECONDS (600)",
        ),
        ({"COMPENSATION_WARN_AFTER_SECONDS": "21600"}, "must come before compensation gives up"),
    ],
)
def test_bad_settings_say_what_to_fix(changes, message):
    with pytest.raises((SettingsError, ValueError)) as caught:
        RetentionSettings.from_env(env(**changes))
    assert message in str(caught.value)


def test_retention_settings_and_their_defaults():
    storage = Connection("StateStorage", connection_string="UseDevelopmentStorage=true")
    assert RetentionSettings.from_env(env()).retention == Retention(
        storage=storage, days=30, schedule="0 30 2 * * *", container="order-archive"
    )
    tuned = RetentionSettings.from_env(
        env(RETENTION_DAYS="0", PURGE_SCHEDULE=" 0  0 4 * * 1-5 ", ARCHIVE_CONTAINER="arch-1")
    )
    assert tuned.retention == Retention(
        storage=storage, days=0, schedule="0 0 4 * * 1-5", container="arch-1"
    )
    assert RetentionSettings.from_env(env(RETENTION_DAYS="3650")).retention.days == 3650


def test_the_pattern_app_reads_none_of_the_retention_purges_settings():
    """The purge runs in the operations app: the pattern app's settings leave its settings
    unread (a wrong one is the operations app's to refuse), and ask for no blob service."""
    purge = {"RETENTION_DAYS": "-1", "PURGE_SCHEDULE": "never", "ARCHIVE_CONTAINER": "A_B"}
    with pytest.raises(SettingsError, match="3 app settings are wrong"):
        RetentionSettings.from_env(env(**purge))
    settings = Settings.from_env(env(**purge))
    assert type(settings) is Settings
    with pytest.raises(SettingsError, match="RETENTION_DAYS, PURGE_SCHEDULE, ARCHIVE_CONTAINER"):
        retention_of(settings)
    identity = {
        "StateStorage": None,
        "StateStorage__tableServiceUri": "https://st.table.core.windows.net",
        "StateStorage__clientId": "1111",
    }
    checked = Settings.check_on_load(env(**identity))
    assert (
        checked is not None
        and checked.storage.endpoint == identity["StateStorage__tableServiceUri"]
    )


def test_the_operations_app_checks_the_purges_settings_with_every_apps_at_load():
    """One SettingsError names a wrong setting of either kind: the operations app's load checks
    the retention purge's settings together with the common ones."""
    with pytest.raises(SettingsError) as caught:
        RetentionSettings.check_on_load(env(STEP_TIMEOUT_SECONDS="soon", RETENTION_DAYS="-1"))
    message = str(caught.value)
    assert message.startswith("2 app settings are wrong:")
    assert "STEP_TIMEOUT_SECONDS" in message and "RETENTION_DAYS" in message
    checked = RetentionSettings.check_on_load(env(RETENTION_DAYS="9"))
    assert checked is not None and retention_of(checked).days == 9
    assert RetentionSettings.check_on_load({}) is None  # only indexing the functions


def test_compensation_budget_and_warning_and_their_defaults():
    settings = Settings.from_env(env())
    assert settings.compensation_budget == timedelta(hours=6)
    assert settings.compensation_warn_after == timedelta(minutes=10)
    tuned = Settings.from_env(
        env(COMPENSATION_BUDGET_SECONDS="7200", COMPENSATION_WARN_AFTER_SECONDS="300")
    )
    assert (tuned.compensation_budget, tuned.compensation_warn_after) == (
        timedelta(hours=2),
        timedelta(minutes=5),
    )


def test_managed_identity_storage_needs_the_blob_service_too_for_the_purge():
    identity = {
        "StateStorage": None,
        "StateStorage__tableServiceUri": "https://st.table.core.windows.net",
        "StateStorage__clientId": "1111",
    }
    with pytest.raises(SettingsError, match=r"StateStorage__blobServiceUri is not set: .* purge"):
        RetentionSettings.from_env(env(**identity))
    blob = "https://st.blob.core.windows.net"
    settings = RetentionSettings.from_env(env(**identity, StateStorage__blobServiceUri=blob))
    assert settings.storage == Connection(
        "StateStorage", endpoint="https://st.table.core.windows.net", client_id="1111"
    )
    assert settings.retention.storage == Connection("StateStorage", endpoint=blob, client_id="1111")


def test_tuning_applies_to_every_workflow():
    settings = Settings.from_env(
        env(STEP_TIMEOUT_SECONDS="7", FAILURE_THRESHOLD="5", RETRY_BASE_DELAY_SECONDS="2")
    )
    for flow in settings.workflows().values():
        assert {step.complete_by_budget for step in flow.steps} == {timedelta(seconds=7)}
        assert flow.failure_threshold == 5
        assert flow.retry.base_delay == timedelta(seconds=2)
    assert settings.workflows()["order@2"].version == 2
    assert Settings.from_env(env()).workflows()["order@1"] == ORDER_WORKFLOW


def test_new_orders_take_the_configured_version_and_a_typo_fails_the_start():
    assert Settings.from_env(env()).current_version("order") == 1
    assert Settings.from_env(env(WORKFLOW_VERSIONS="order=2")).current_version("order") == 2
    for bad in ("order=3", "order", "nope=1", "order=two"):
        with pytest.raises(SettingsError, match=r"WORKFLOW_VERSIONS: .* is not NAME=VERSION"):
            Settings.from_env(env(WORKFLOW_VERSIONS=bad))


IDENTITY = {
    "ServiceBusConnection": None,
    "ServiceBusConnection__fullyQualifiedNamespace": "sb-x.servicebus.windows.net",
}


def test_signing_keys_are_required_with_a_managed_identity():
    with pytest.raises(SettingsError, match=r"MESSAGE_SIGNING_KEYS is not set.*Key Vault"):
        Settings.from_env(env(**IDENTITY))


def test_signing_keys_are_required_with_a_real_namespace_connection_string():
    real = "Endpoint=sb://x.servicebus.windows.net/;SharedAccessKeyName=a;SharedAccessKey=b"
    with pytest.raises(SettingsError, match="MESSAGE_SIGNING_KEYS is not set"):
        Settings.from_env(env(ServiceBusConnection=real))


def test_a_development_broker_derives_its_key_from_the_sas_key():
    """Every process given one local stack's connection string agrees on its key."""
    conn = (
        "Endpoint=sb://localhost:5672;SharedAccessKeyName=Root;"
        "SharedAccessKey=c2VjcmV0LWtleQ==;UseDevelopmentEmulator=true"
    )
    settings = Settings.from_env(env(ServiceBusConnection=conn))
    assert settings.keyring == local_keyring("c2VjcmV0LWtleQ==")
    other = Settings.from_env(env(ServiceBusConnection=conn.replace("c2Vj", "b3Ro")))
    assert other.keyring != settings.keyring


def test_configured_keys_win_newest_first():
    keys = f"{new_key_text('new')},{new_key_text('old')}"
    settings = Settings.from_env(env(MESSAGE_SIGNING_KEYS=keys))
    assert settings.keyring == parse_keyring(keys)
    assert [k.key_id for k in settings.keyring.keys] == ["new", "old"]
    assert settings.keyring.signing_key.key_id == "new"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("k1", "must be <key id>:<base64 secret>"),
        ("k1:not base64!", "not valid base64"),
        ("k1:c2hvcnQ=", "the secret is 5 bytes"),
        ("bad id:" + "A" * 44, "must be <key id>:<base64 secret>"),
    ],
)
def test_malformed_signing_keys_are_named_without_showing_the_secret(value, problem):
    with pytest.raises(SettingsError, match="MESSAGE_SIGNING_KEYS") as raised:
        Settings.from_env(env(MESSAGE_SIGNING_KEYS=value))
    assert problem in str(raised.value)
    assert "not base64!" not in str(raised.value)


def test_two_keys_with_one_id_are_refused():
    with pytest.raises(SettingsError, match="distinct"):
        Settings.from_env(env(MESSAGE_SIGNING_KEYS=f"{new_key_text('a')},{new_key_text('a')}"))


def test_every_wrong_setting_is_named_at_once():
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(
            env(
                STEP_TIMEOUT_SECONDS="soon",
                INVENTORY_SERVICE_URL="inventory.local",
                WORKFLOW_VERSIONS="order=9",
                SUPERVISOR_SCHEDULE="0 0 * * * 1",
            )
        )
    message = str(caught.value)
    assert message.startswith("4 app settings are wrong:")
    for name in ("STEP_TIMEOUT_SECONDS", "INVENTORY_SERVICE_URL", "WORKFLOW_VERSIONS"):
        assert name in message
    assert "SUPERVISOR_SCHEDULE" in message or "fixed interval" in message


def test_the_app_checks_its_settings_when_a_host_configures_it():
    Settings.check_on_load({})  # only indexing the functions: nothing to check
    with pytest.raises(SettingsError, match="STEP_TIMEOUT_SECONDS"):
        Settings.check_on_load(env(STEP_TIMEOUT_SECONDS="soon"))


def test_a_duration_under_a_millisecond_is_refused_not_taken_for_unset():
    """0.0000001 s became timedelta(0), which ``or default`` took for unset: a compensation
    budget of a tenth of a microsecond silently meant 6 hours (issue 39, item 4)."""
    for name in (
        "COMPENSATION_BUDGET_SECONDS",
        "COMPENSATION_WARN_AFTER_SECONDS",
        "PENDING_STALE_AFTER_SECONDS",
        "RETRY_BASE_DELAY_SECONDS",
        "RETRY_MAX_DELAY_SECONDS",
        "REMOTE_TIMEOUT_SECONDS",
        "STEP_TIMEOUT_SECONDS",
        "STEP_QUEUE_SECONDS",
        "CLOCK_SKEW_TOLERANCE_SECONDS",
    ):
        with pytest.raises(SettingsError, match=rf"^{name} must be a whole number of millisec"):
            Settings.from_env(env(**{name: "0.0000001"}))


def test_a_step_budget_the_workflows_cannot_take_stops_the_load():
    """STEP_TIMEOUT_SECONDS=0.0000001 passed the check on load; the workflows, built on the
    first message, then failed every invocation naming no setting (issue 39, item 5)."""
    with pytest.raises(SettingsError, match=r"^STEP_TIMEOUT_SECONDS .* less than a millisecond"):
        Settings.check_on_load(env(STEP_TIMEOUT_SECONDS="0.0000001"))


def test_zero_is_zero_where_a_setting_allows_it_and_blank_is_unset():
    settings = RetentionSettings.from_env(
        env(STEP_QUEUE_SECONDS="0", CLOCK_SKEW_TOLERANCE_SECONDS="0.000", RETENTION_DAYS="0")
    )
    assert settings.step_queue == settings.clock_skew == timedelta(0)
    assert settings.retention.days == 0
    steps = [step for flow in settings.workflows().values() for step in flow.steps]
    assert {step.queue_budget for step in steps} == {timedelta(0)}
    blank = Settings.from_env(env(STEP_QUEUE_SECONDS=" ", PENDING_STALE_AFTER_SECONDS=""))
    assert (blank.step_queue, blank.pending_stale_after) == (None, timedelta(minutes=2))


def test_durations_are_kept_to_the_millisecond():
    settings = Settings.from_env(
        env(STEP_TIMEOUT_SECONDS="0.001", RETRY_BASE_DELAY_SECONDS="2.5", STEP_QUEUE_SECONDS="1e3")
    )
    assert settings.step_timeout == timedelta(milliseconds=1)
    assert settings.retry_base_delay == timedelta(seconds=2.5)
    assert settings.step_queue == timedelta(seconds=1000)
    with pytest.raises(SettingsError, match=r"got '2.5005', finer than a millisecond"):
        Settings.from_env(env(RETRY_BASE_DELAY_SECONDS="2.5005"))


def test_what_is_derived_from_the_settings_is_built_when_they_are_made():
    def made(**fields) -> Settings:
        return Settings(
            queues={}, service_urls={}, servicebus=Connection("sb"), storage=Connection("st"),
            **fields,
        )  # fmt: skip

    with pytest.raises(ValueError, match="complete_by_budget must be positive"):
        made(step_timeout=timedelta(0))
    with pytest.raises(SettingsError, match="SUPERVISOR_SCHEDULE must fire at a fixed interval"):
        made(supervisor_schedule="0 0 * * * 1")
    settings = made(supervisor_schedule="0 */5 * * * *", failure_threshold=2)
    assert settings.supervisor_period == timedelta(minutes=5)
    assert settings.workflows() is settings.workflows()
    assert {flow.failure_threshold for flow in settings.workflows().values()} == {2}


@pytest.mark.anyio
async def test_the_runtime_takes_the_settings_the_load_checked():
    """What the check on load built (workflows, keyring, period) is what the handlers use: the
    composition root builds the Runtime on them."""
    checked = Settings.check_on_load(env())
    assert checked is not None
    root = PatternRoot(checked)
    built = root.runtime()
    assert built.settings is checked and built.workflows is checked.workflows()
    await root.close()


def test_the_run_budget_stays_inside_the_lock_renewal_of_host_json():
    host = json.loads((REPO_ROOT / "host.json").read_text())["extensions"]["serviceBus"]
    hours, minutes, seconds = map(int, host["maxAutoLockRenewalDuration"].split(":"))
    renewal = timedelta(hours=hours, minutes=minutes, seconds=seconds)
    assert MAX_RUN_BUDGET + timedelta(seconds=30) == renewal
    for flow in WORKFLOWS.values():
        assert all(step.complete_by_budget <= MAX_RUN_BUDGET for step in flow.steps), flow.ref
    assert Settings.from_env(env(STEP_TIMEOUT_SECONDS="270")).step_timeout == MAX_RUN_BUDGET
    with pytest.raises(SettingsError, match="STEP_TIMEOUT_SECONDS must be at most 270"):
        Settings.from_env(env(STEP_TIMEOUT_SECONDS="600"))


def test_remote_call_limits_and_their_defaults():
    assert Settings.from_env(env()).remote_limits == ServiceLimits(10.0, 32)
    tuned = Settings.from_env(env(REMOTE_TIMEOUT_SECONDS="2.5", REMOTE_MAX_CONNECTIONS="4"))
    assert tuned.remote_limits == ServiceLimits(timeout_s=2.5, max_connections=4)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"REMOTE_TIMEOUT_SECONDS": "0"}, "REMOTE_TIMEOUT_SECONDS must be positive"),
        ({"REMOTE_TIMEOUT_SECONDS": "soon"}, "REMOTE_TIMEOUT_SECONDS must be a number"),
        ({"REMOTE_MAX_CONNECTIONS": "0"}, "REMOTE_MAX_CONNECTIONS must be a whole number from 1"),
    ],
)
def test_bad_remote_call_limits_say_what_to_fix(changes, message):
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env(**changes))
