"""App settings: every name the code reads, where it comes from, and how clients are built.

In Azure the settings come from the Function App's configuration (infra/ declares each one) and
clients authenticate with the app's managed identity; locally they come from
local.settings.json or the environment and clients use connection strings. This module is the
one place that decides which.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from domain import ids, signing
from domain.agents import AGENTS
from domain.events import DEFAULT_COMPENSATION_BUDGET, DEFAULT_COMPENSATION_WARN_AFTER, DEFAULT_SKEW
from domain.workflows import WORKFLOWS, RetryPolicy, Workflow, workflow_ref

SERVICEBUS_CONNECTION = "ServiceBusConnection"
STATE_STORAGE_CONNECTION = "StateStorage"
CONNECTION_NAMES = (SERVICEBUS_CONNECTION, STATE_STORAGE_CONNECTION)
MAX_RUN_BUDGET = timedelta(seconds=270)
"""The longest a step's call may run: the agent holds its message's lock meanwhile, and host.json
renews a lock for at most 5 minutes (``maxAutoLockRenewalDuration``); 30 s are left to reply."""

QUEUE_SETTINGS = {
    "orders": "ORDERS_QUEUE",
    "commands": "SCHEDULER_COMMANDS_QUEUE",
    "responses": "AGENT_RESPONSES_QUEUE",
    "alerts": "OPERATOR_ALERTS_QUEUE",
    **{agent.name: agent.queue_setting for agent in AGENTS},
}
SERVICE_URL_SETTINGS = {agent.name: agent.url_setting for agent in AGENTS}
REMOTE_TIMEOUT_SETTING = "REMOTE_TIMEOUT_SECONDS"
REMOTE_MAX_CONNECTIONS_SETTING = "REMOTE_MAX_CONNECTIONS"
DEFAULT_REMOTE_TIMEOUT_S = 10.0
"""One call's bound when no setting names one: the remote client's attempt timeout."""
DEFAULT_REMOTE_MAX_CONNECTIONS = 32

COMPENSATION_BUDGET_SETTING = "COMPENSATION_BUDGET_SECONDS"
COMPENSATION_WARN_SETTING = "COMPENSATION_WARN_AFTER_SECONDS"
CLOCK_SKEW_SETTING = "CLOCK_SKEW_TOLERANCE_SECONDS"
MAX_CLOCK_SKEW = timedelta(minutes=5)
RETENTION_DAYS_SETTING = "RETENTION_DAYS"
PURGE_SCHEDULE_SETTING = "PURGE_SCHEDULE"
ARCHIVE_CONTAINER_SETTING = "ARCHIVE_CONTAINER"
DEFAULT_RETENTION_DAYS = 30
MAX_RETENTION_DAYS = 3650
DEFAULT_PURGE_SCHEDULE = "0 30 2 * * *"
"""Every day at 02:30 UTC."""
DEFAULT_ARCHIVE_CONTAINER = "order-archive"


class SettingsError(ValueError):
    """A setting is missing or malformed; the message names it and says what is expected."""


@dataclass(frozen=True)
class Connection:
    """A connection string (local) or an endpoint reached with a managed identity (Azure).

    For the state storage account, ``endpoint`` is the table service and ``blob_endpoint`` the
    blob service (the purge's archive); a connection string names both.
    """

    name: str
    connection_string: str | None = None
    endpoint: str | None = None
    client_id: str | None = None
    blob_endpoint: str | None = None


@dataclass(frozen=True)
class ServiceLimits:
    """How a worker calls each remote service (adapters.remote_http): each call ends within
    ``timeout_s`` (the remote client cuts it further to the time left before complete-by), and
    at most ``max_connections`` calls to one service are under way at once."""

    timeout_s: float = DEFAULT_REMOTE_TIMEOUT_S
    max_connections: int = DEFAULT_REMOTE_MAX_CONNECTIONS


@dataclass(frozen=True)
class Settings:
    queues: Mapping[str, str]
    service_urls: Mapping[str, str]
    servicebus: Connection
    storage: Connection
    orders_table: str = "orders"
    active_table: str = "activeorders"
    supervision_table: str = "supervision"
    supervisor_schedule: str = "*/15 * * * * *"
    supervisor_concurrency: int = 4
    pending_stale_after: timedelta = timedelta(minutes=2)
    step_timeout: timedelta | None = None
    step_queue: timedelta | None = None
    failure_threshold: int | None = None
    retry_base_delay: timedelta | None = None
    retry_max_delay: timedelta | None = None
    compensation_budget: timedelta = DEFAULT_COMPENSATION_BUDGET
    """How long, from when compensation starts, an undo that fails transiently or times out
    is retried before the order ends in Error with effects left in place (docs/
    remote-service-contract.md: services keep keys and tombstones longer than this)."""
    compensation_warn_after: timedelta = DEFAULT_COMPENSATION_WARN_AFTER
    """An order compensating longer than this raises one warning (not a terminal alert)."""
    clock_skew: timedelta = DEFAULT_SKEW
    """How far two hosts' clocks may disagree: the Supervisor acts on a time another host
    stamped only once its own clock is past it by more than this (domain.events.Context)."""
    workflow_versions: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """The version new orders take, per workflow name (``WORKFLOW_VERSIONS=order=2``)."""
    retention_days: int = DEFAULT_RETENTION_DAYS
    """Days a finished order (Processed, or Error once resolved) is kept; 0: never purged by
    the timer (operators may still purge on demand)."""
    purge_schedule: str = DEFAULT_PURGE_SCHEDULE
    archive_container: str = DEFAULT_ARCHIVE_CONTAINER
    signing_keys: signing.Keyring | None = None
    """Keys the app signs its internal messages with (the first) and accepts (any); see
    :mod:`domain.signing`. None only in Settings built by hand for code that sends nothing."""
    remote_limits: ServiceLimits = ServiceLimits()
    """Each remote service's calls: their timeout and connections (``REMOTE_TIMEOUT_SECONDS``,
    ``REMOTE_MAX_CONNECTIONS``)."""

    @property
    def keyring(self) -> signing.Keyring:
        if self.signing_keys is None:
            raise SettingsError(f"{signing.SIGNING_KEYS_SETTING} is not configured")
        return self.signing_keys

    def queue(self, role: str) -> str:
        return self.queues[role]

    @property
    def supervisor_period(self) -> timedelta:
        return schedule_period(self.supervisor_schedule)

    @property
    def supervisor_lease(self) -> timedelta:
        """Per-bucket Supervisor leases: renewed every tick, so one and a half periods."""
        return self.supervisor_period * 1.5

    @property
    def supervisor_claim(self) -> timedelta:
        """How long a tick claims its buckets for before it has swept them: its budget plus
        half the slack to the next tick, so a tick that dies frees them for the next one."""
        return (self.supervisor_budget + self.supervisor_period) / 2

    @property
    def supervisor_budget(self) -> timedelta:
        """How long one tick may work, so that it ends before the next tick and its leases."""
        return self.supervisor_period * 0.75

    def workflows(self) -> Mapping[str, Workflow]:
        """Every version this deployment carries, by reference (``order@1``), with its budgets
        and retry policy applied."""
        return {ref: self._tuned(flow) for ref, flow in WORKFLOWS.items()}

    def current_version(self, name: str) -> int:
        """The version new orders of workflow ``name`` take (``WORKFLOW_VERSIONS``; else 1)."""
        return self.workflow_versions.get(name, 1)

    def _tuned(self, flow: Workflow) -> Workflow:
        budgets = {"complete_by_budget": self.step_timeout, "queue_budget": self.step_queue}
        set_budgets = {name: budget for name, budget in budgets.items() if budget is not None}
        steps = tuple(dataclasses.replace(step, **set_budgets) for step in flow.steps)
        retry = flow.retry
        if self.retry_base_delay is not None or self.retry_max_delay is not None:
            base = self.retry_base_delay or retry.base_delay
            retry = RetryPolicy(
                base_delay=base,
                factor=retry.factor,
                cap=max(self.retry_max_delay or retry.cap, base),
                jitter=retry.jitter,
            )
        threshold = self.failure_threshold or flow.failure_threshold
        if (steps, retry, threshold) == (flow.steps, flow.retry, flow.failure_threshold):
            return flow
        return dataclasses.replace(flow, steps=steps, retry=retry, failure_threshold=threshold)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings in ``env`` (default: the process environment), every one checked; a
        SettingsError names every wrong or missing setting at once, not only the first."""
        env = os.environ if env is None else env
        read = _Reader(env)
        check = _Problems()
        queues = {role: check(read.entity, name) for role, name in QUEUE_SETTINGS.items()}
        urls = {agent: check(read.http_url, name) for agent, name in SERVICE_URL_SETTINGS.items()}
        servicebus = check(read.servicebus, SERVICEBUS_CONNECTION)
        fields = {
            "queues": queues,
            "service_urls": urls,
            "remote_limits": check(read.remote_limits),
            "servicebus": servicebus,
            "signing_keys": servicebus and check(read.signing_keys, servicebus),
            "storage": check(read.storage, STATE_STORAGE_CONNECTION),
            "orders_table": check(read.table, "ORDERS_TABLE", "orders"),
            "active_table": check(read.table, "ACTIVE_ORDERS_TABLE", "activeorders"),
            "supervision_table": check(read.table, "SUPERVISION_TABLE", "supervision"),
            "supervisor_schedule": check(read.fixed_interval, "SUPERVISOR_SCHEDULE"),
            "supervisor_concurrency": check(read.int_or_none, "SUPERVISOR_CONCURRENCY") or 4,
            "pending_stale_after": check(
                read.seconds, "PENDING_STALE_AFTER_SECONDS", timedelta(minutes=2)
            ),
            "step_timeout": check(read.run_budget, "STEP_TIMEOUT_SECONDS"),
            "step_queue": check(read.seconds_or_none, "STEP_QUEUE_SECONDS", allow_zero=True),
            "failure_threshold": check(read.int_or_none, "FAILURE_THRESHOLD"),
            "retry_base_delay": check(read.seconds_or_none, "RETRY_BASE_DELAY_SECONDS"),
            "retry_max_delay": check(read.seconds_or_none, "RETRY_MAX_DELAY_SECONDS"),
            "compensation_budget": check(
                read.seconds, COMPENSATION_BUDGET_SETTING, DEFAULT_COMPENSATION_BUDGET
            ),
            "compensation_warn_after": check(
                read.seconds, COMPENSATION_WARN_SETTING, DEFAULT_COMPENSATION_WARN_AFTER
            ),
            "clock_skew": check(read.skew, CLOCK_SKEW_SETTING),
            "workflow_versions": check(read.workflow_versions, "WORKFLOW_VERSIONS"),
            "retention_days": check(read.days, RETENTION_DAYS_SETTING, DEFAULT_RETENTION_DAYS),
            "purge_schedule": check(purge_schedule, env),
            "archive_container": check(read.container, ARCHIVE_CONTAINER_SETTING),
        }
        check(_warned_within, fields["compensation_warn_after"], fields["compensation_budget"])
        check.raise_if_any()
        return cls(**fields)

    @classmethod
    def check_on_load(cls, env: Mapping[str, str] | None = None) -> None:
        """Called when the app is loaded: where ``env`` configures the app (it names one of its
        connections: a Functions host, in Azure or locally), wrong settings stop the load with
        every problem named, instead of failing every message later. Elsewhere (a tool that
        only indexes the functions) there is nothing to check."""
        env = os.environ if env is None else env
        if any(name.startswith(CONNECTION_NAMES) for name in env):
            cls.from_env(env)


_CRON_FIELD = re.compile(r"[0-9A-Za-z*/,\-]+", re.ASCII)
_CONTAINER = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}", re.ASCII)


def purge_schedule(env: Mapping[str, str]) -> str:
    """The purge timer's NCRONTAB schedule (six fields, seconds first, UTC).

    The timer function reads this while the app is indexed (the schedule is part of its
    binding), so a bad value stops the host with this message.
    """
    schedule = " ".join((env.get(PURGE_SCHEDULE_SETTING, "") or "").split())
    if not schedule:
        return DEFAULT_PURGE_SCHEDULE
    fields = schedule.split(" ")
    if len(fields) != 6 or not all(_CRON_FIELD.fullmatch(field) for field in fields):
        raise SettingsError(
            f"{PURGE_SCHEDULE_SETTING} must be an NCRONTAB schedule of six fields, seconds "
            f"first, e.g. {DEFAULT_PURGE_SCHEDULE!r} (every day at 02:30 UTC); got {schedule!r}"
        )
    return schedule


def validate_container_name(name: str, setting: str) -> str:
    """A Blob container name: 3-63 lowercase letters, digits and single hyphens."""
    if not _CONTAINER.fullmatch(name):
        raise SettingsError(
            f"{setting} must be a blob container name (3-63 lowercase letters, digits and "
            f"single hyphens, starting and ending with a letter or digit); got {name!r}"
        )
    return name


_UNITS = ((1, 60), (60, 60), (3600, 24))
"""(seconds, cycle) of the seconds, minutes and hours fields."""


def schedule_period(schedule: str) -> timedelta:
    """The fixed interval of a six-field NCRONTAB schedule such as ``*/15 * * * * *``.

    The Supervisor's recovery bound and its leases are stated in periods, so only schedules
    that fire at a fixed interval are accepted: a step (``*/N``, N dividing the unit) or ``*``
    in the seconds, minutes or hours field, whole numbers in the fields before it, ``*`` after.
    """
    fields = schedule.split()
    problem = (
        f"SUPERVISOR_SCHEDULE must fire at a fixed interval, e.g. '*/15 * * * * *' (every 15 s) "
        f"or '0 */5 * * * *' (every 5 min); got {schedule!r}"
    )
    if len(fields) != 6 or fields[3:] != ["*", "*", "*"]:
        raise SettingsError(problem)
    for position, (seconds, cycle) in enumerate(_UNITS):
        field = fields[position]
        if field.isdigit():
            continue
        match = re.fullmatch(r"(?:\*|0)/(\d+)|\*", field)
        step = int(match.group(1)) if match and match.group(1) else 1
        later_fixed = fields[position + 1 : 3] != ["*"] * (2 - position)
        if match is None or step < 1 or cycle % step or later_fixed:
            raise SettingsError(problem)
        return timedelta(seconds=seconds * step)
    return timedelta(days=1)


def development_sas_key(connection_string: str | None) -> str | None:
    """The SharedAccessKey of a development broker's connection string, else None."""
    if not connection_string:
        return None
    parts = dict(
        (k.strip().casefold(), v.strip())
        for k, _, v in (p.partition("=") for p in connection_string.split(";") if "=" in p)
    )
    if parts.get("usedevelopmentemulator", "").casefold() != "true":
        return None
    return parts.get("sharedaccesskey") or None


class _Problems:
    """Runs each check, keeping every problem instead of stopping at the first."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def __call__(self, read: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return read(*args, **kwargs)
        except ValueError as problem:  # SettingsError, the id validators' and the keyring's
            self.found.append(str(problem))
            return None

    def raise_if_any(self) -> None:
        if len(self.found) == 1:
            raise SettingsError(self.found[0])
        if self.found:
            listed = "\n".join(f"- {problem}" for problem in self.found)
            raise SettingsError(f"{len(self.found)} app settings are wrong:\n{listed}")


def _warned_within(warn_after: timedelta | None, budget: timedelta | None) -> None:
    if warn_after is not None and budget is not None and warn_after >= budget:
        raise SettingsError(
            f"{COMPENSATION_WARN_SETTING} ({warn_after.total_seconds():g}) must be less than "
            f"{COMPENSATION_BUDGET_SETTING} ({budget.total_seconds():g}): the warning says an "
            "order is still compensating, so it must come before compensation gives up"
        )


class _Reader:
    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def required(self, name: str) -> str:
        value = self.env.get(name, "").strip()
        if not value:
            raise SettingsError(
                f"app setting {name} is not set; set it in local.settings.json (Values) or the "
                "environment locally, or in the Function App configuration in Azure"
            )
        return value

    def optional(self, name: str, default: str) -> str:
        return self.env.get(name, "").strip() or default

    def entity(self, name: str) -> str:
        return ids.validate_entity_name(self.required(name), name)

    def table(self, name: str, default: str) -> str:
        return ids.validate_table_name(self.optional(name, default))

    def container(self, name: str) -> str:
        return validate_container_name(self.optional(name, DEFAULT_ARCHIVE_CONTAINER), name)

    def http_url(self, name: str) -> str:
        url = self.required(name)
        if not url.startswith(("http://", "https://")):
            raise SettingsError(f"{name} must be an http(s) URL, got {url!r}")
        return url

    def fixed_interval(self, name: str) -> str:
        schedule = self.optional(name, "*/15 * * * * *")
        schedule_period(schedule)  # refuse a schedule without a fixed period now
        return schedule

    def seconds(self, name: str, default: timedelta) -> timedelta:
        return self.seconds_or_none(name) or default

    def run_budget(self, name: str) -> timedelta | None:
        budget = self.seconds_or_none(name)
        if budget is not None and budget > MAX_RUN_BUDGET:
            raise SettingsError(
                f"{name} must be at most {MAX_RUN_BUDGET.total_seconds():.0f}: the agent holds "
                "its message's lock while the call runs, and host.json renews a lock for 5 "
                f"minutes at most; got {budget.total_seconds():g}. Give a long backlog room "
                "with STEP_QUEUE_SECONDS instead."
            )
        return budget

    def skew(self, name: str) -> timedelta:
        value = self.seconds_or_none(name, allow_zero=True)
        if value is None:
            return DEFAULT_SKEW
        if value > MAX_CLOCK_SKEW:
            raise SettingsError(
                f"{name} must be at most {MAX_CLOCK_SKEW.total_seconds():g} seconds, got "
                f"{value.total_seconds():g}: clocks that far apart need fixing (NTP), not "
                "tolerating; every recovery waits this long past its deadline"
            )
        return value

    def seconds_or_none(self, name: str, *, allow_zero: bool = False) -> timedelta | None:
        raw = self.env.get(name, "").strip()
        if not raw:
            return None
        try:
            value = float(raw)
        except ValueError:
            raise SettingsError(f"{name} must be a number of seconds, got {raw!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            limit = "zero or more" if allow_zero else "positive"
            raise SettingsError(f"{name} must be {limit} seconds, got {raw!r}")
        return timedelta(seconds=value)

    def days(self, name: str, default: int) -> int:
        raw = self.env.get(name, "").strip()
        if not raw:
            return default
        if not raw.isascii() or not raw.isdigit() or int(raw) > MAX_RETENTION_DAYS:
            raise SettingsError(
                f"{name} must be a whole number of days from 0 (never purge) to "
                f"{MAX_RETENTION_DAYS}, got {raw!r}"
            )
        return int(raw)

    def workflow_versions(self, name: str) -> dict[str, int]:
        """``order=2,single_step=1``: each a workflow this deployment carries, at a version it
        carries (so a typo fails the start, not the first order)."""
        raw = self.env.get(name, "").strip()
        versions: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in raw.split(","))):
            workflow, _, version = part.partition("=")
            ref = workflow_ref(workflow.strip(), int(version)) if version.isdigit() else None
            if ref is None or ref not in WORKFLOWS:
                raise SettingsError(
                    f"{name}: {part!r} is not NAME=VERSION of a workflow this deployment "
                    f"carries; known: {', '.join(WORKFLOWS)}"
                )
            versions[workflow.strip()] = int(version)
        return versions

    def int_or_none(self, name: str) -> int | None:
        raw = self.env.get(name, "").strip()
        if not raw:
            return None
        if not raw.isdigit() or int(raw) < 1:
            raise SettingsError(f"{name} must be a positive integer, got {raw!r}")
        return int(raw)

    def remote_limits(self) -> ServiceLimits:
        return ServiceLimits(
            self.seconds(
                REMOTE_TIMEOUT_SETTING, timedelta(seconds=DEFAULT_REMOTE_TIMEOUT_S)
            ).total_seconds(),
            self.int_or_none(REMOTE_MAX_CONNECTIONS_SETTING) or DEFAULT_REMOTE_MAX_CONNECTIONS,
        )

    def servicebus(self, name: str) -> Connection:
        conn = self.env.get(name, "").strip()
        namespace = self.env.get(f"{name}__fullyQualifiedNamespace", "").strip()
        if conn:
            return Connection(name, connection_string=conn)
        if namespace:
            return Connection(
                name, endpoint=namespace, client_id=self.env.get(f"{name}__clientId") or None
            )
        raise SettingsError(
            f"Service Bus connection {name} is not configured: set {name} to a connection string "
            f"(local) or {name}__fullyQualifiedNamespace (+ {name}__clientId) for a managed "
            "identity (Azure)"
        )

    def signing_keys(self, servicebus: Connection) -> signing.Keyring:
        name = signing.SIGNING_KEYS_SETTING
        raw = self.env.get(name, "").strip()
        if raw:
            return signing.parse_keyring(raw, setting=name)
        sas_key = development_sas_key(servicebus.connection_string)
        if sas_key is not None:
            return signing.local_keyring(sas_key)
        raise SettingsError(
            f"app setting {name} is not set: the app signs its internal messages with it. In "
            "Azure it is a Key Vault reference that infra/ provisions; elsewhere set it to "
            "k1:<base64 of 32 random bytes> "
            "(`openssl rand -base64 32`). Only a development broker's connection string "
            "(UseDevelopmentEmulator=true) may go without it."
        )

    def storage(self, name: str) -> Connection:
        conn = self.env.get(name, "").strip()
        table = self.env.get(f"{name}__tableServiceUri", "").strip()
        blob = self.env.get(f"{name}__blobServiceUri", "").strip()
        if conn:
            return Connection(name, connection_string=conn)
        if table and blob:
            return Connection(
                name,
                endpoint=table,
                blob_endpoint=blob,
                client_id=self.env.get(f"{name}__clientId") or None,
            )
        if table:
            raise SettingsError(
                f"{name}__blobServiceUri is not set: with a managed identity the state storage "
                f"needs its blob service too (the purge archives finished orders there), e.g. "
                "https://<account>.blob.core.windows.net/"
            )
        raise SettingsError(
            f"state storage {name} is not configured: set {name} to a connection string (local) "
            f"or {name}__tableServiceUri and {name}__blobServiceUri (+ {name}__clientId) for a "
            "managed identity (Azure)"
        )
