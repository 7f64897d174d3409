"""App settings: every name the code reads, where it comes from, and how clients are built.

In Azure the settings come from the Function App's configuration (infra/ declares each one) and
clients authenticate with the app's managed identity; locally they come from
local.settings.json or the environment and clients use connection strings. This module is the
one place that decides which.

The settings are a pydantic-settings model, a field per setting named as the setting, each
read by its kind (:mod:`adapters.setting_values`): every wrong or missing setting is named at
once, in one SettingsError. Each app reads the settings its code uses: the pattern app those of
:data:`AppSettings`, the operations app (and the tools) those and the retention purge's
(:mod:`adapters.retention_settings`: the purge runs there), so infra/ sets each app what it
reads. :class:`Settings` is what the app uses, with everything derived from it (the tuned workflows,
the keyring, the Supervisor's period) built when it is made, so a host whose settings the app
cannot honour refuses to load (:meth:`Settings.check_on_load`) instead of failing every message
later.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType
from typing import Annotated, Any, Self

from pydantic import Field, ValidationError, ValidationInfo, create_model, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from adapters.setting_values import (
    Seconds,
    SettingsError,
    WholeNumber,
    entity_name,
    fixed_interval,
    http_url,
    plain,
    reader,
    refusal,
    schedule_period,
    table_name,
    workflow_versions,
)
from domain import signing
from domain.agents import AGENTS
from domain.events import DEFAULT_COMPENSATION_BUDGET, DEFAULT_COMPENSATION_WARN_AFTER, DEFAULT_SKEW
from domain.workflows import WORKFLOWS, RetryPolicy, Workflow

SERVICEBUS_CONNECTION = "ServiceBusConnection"
STATE_STORAGE_CONNECTION = "StateStorage"
CONNECTION_NAMES = (SERVICEBUS_CONNECTION, STATE_STORAGE_CONNECTION)
QUEUE_SETTINGS = {
    "orders": "ORDERS_QUEUE",
    "commands": "SCHEDULER_COMMANDS_QUEUE",
    "responses": "AGENT_RESPONSES_QUEUE",
    "alerts": "OPERATOR_ALERTS_QUEUE",
    **{agent.name: agent.queue_setting for agent in AGENTS},
}
SERVICE_URL_SETTINGS = {agent.name: agent.url_setting for agent in AGENTS}
CLOCK_SKEW_SETTING = "CLOCK_SKEW_TOLERANCE_SECONDS"
DEFAULT_REMOTE_TIMEOUT = timedelta(seconds=10)
"""One call's bound when no setting names one: the remote client's attempt timeout."""
DEFAULT_REMOTE_MAX_CONNECTIONS = 32
DEFAULT_SUPERVISOR_SCHEDULE = "*/15 * * * * *"

# What the app can honour, and why: each bound is quoted when a setting is refused.
MAX_RUN_BUDGET = timedelta(seconds=270)
"""The longest a step's call may run: the agent holds its message's lock meanwhile, and host.json
renews a lock for at most 5 minutes (``maxAutoLockRenewalDuration``); 30 s are left to reply."""
MAX_WAIT = timedelta(days=14)
"""The longest wait a setting may ask for: a queue keeps a message 14 days (the time-to-live of
every queue of the app, in infra/ and the development broker's Config.json), and what the app
waits on (a request for an agent, a retry, an undo's next try) is a message."""
MAX_CLOCK_SKEW = timedelta(minutes=5)
MAX_FAILURE_THRESHOLD = 100
MAX_SUPERVISOR_CONCURRENCY = 16
"""One per bucket of the active-orders index (``adapters.store.active_index.INDEX_BUCKETS``)."""
MAX_REMOTE_CONNECTIONS = 256

_RUN_BUDGET = Seconds(
    most=MAX_RUN_BUDGET,
    why="the agent holds its message's lock while the call runs, and host.json renews a lock "
    "for 5 minutes at most. Give a long backlog room with STEP_QUEUE_SECONDS instead.",
)
_CALL = Seconds(
    most=MAX_RUN_BUDGET,
    why="a call never outlives its step's run budget (STEP_TIMEOUT_SECONDS, at most 270): the "
    "remote client cuts each call to the time left before it",
)
_WAIT_WHY = (
    "a queue keeps a message 14 days (1209600 s), and what the app waits on (a request, a "
    "retry, an undo's next try) is a message; a longer wait could not be honoured"
)
_WAIT = Seconds(most=MAX_WAIT, why=_WAIT_WHY)
_WAIT_OR_ZERO = Seconds(most=MAX_WAIT, why=_WAIT_WHY, zero=True)
_SKEW = Seconds(
    most=MAX_CLOCK_SKEW,
    zero=True,
    why="clocks that far apart need fixing (NTP), not tolerating; every recovery waits this "
    "long past its deadline",
)
_THRESHOLD = WholeNumber(
    1,
    MAX_FAILURE_THRESHOLD,
    why="each failure waits up to RETRY_MAX_DELAY_SECONDS before the next attempt, so an order "
    "would retry for days, and the services must keep their keys for (steps x threshold + 1) "
    "retry cycles (docs/remote-service-contract.md)",
)
_CONCURRENCY = WholeNumber(
    1,
    MAX_SUPERVISOR_CONCURRENCY,
    why="a tick sweeps the 16 buckets of the active-orders index; more would wait for nothing",
)
_CONNECTIONS = WholeNumber(
    1,
    MAX_REMOTE_CONNECTIONS,
    why="each is a socket, and three services at 256 stay within the 1,024 open files a Linux "
    "process gets by default, with room for Service Bus and Tables",
)


@dataclass(frozen=True)
class Connection:
    """A connection string (local) or an endpoint reached with a managed identity (Azure).

    For the state storage account, ``endpoint`` is the table service (the blob service, where
    the purge archives, is the operations app's: :mod:`adapters.retention_settings`); a
    connection string names both.
    """

    name: str
    connection_string: str | None = None
    endpoint: str | None = None
    client_id: str | None = None


@dataclass(frozen=True)
class ServiceLimits:
    """How a worker calls each remote service (adapters.remote_http): each call ends within
    ``timeout_s`` (the remote client cuts it further to the time left before complete-by), and
    at most ``max_connections`` calls to one service are under way at once."""

    timeout_s: float = DEFAULT_REMOTE_TIMEOUT.total_seconds()
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
    supervisor_schedule: str = DEFAULT_SUPERVISOR_SCHEDULE
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
    signing_keys: signing.Keyring | None = None
    """Keys the app signs its internal messages with (the first) and accepts (any); see
    :mod:`domain.signing`. None only in Settings built by hand for code that sends nothing."""
    remote_limits: ServiceLimits = ServiceLimits()
    """Each remote service's calls: their timeout and connections (``REMOTE_TIMEOUT_SECONDS``,
    ``REMOTE_MAX_CONNECTIONS``)."""
    _workflows: Mapping[str, Workflow] = field(init=False, repr=False, compare=False)
    _period: timedelta = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Build what is derived from the settings now, once: a value the workflows or the
        schedule cannot take fails here, where the settings are checked, not on a message."""
        tuned = {ref: self._tuned(flow) for ref, flow in WORKFLOWS.items()}
        object.__setattr__(self, "_workflows", MappingProxyType(tuned))
        object.__setattr__(self, "_period", schedule_period(self.supervisor_schedule))

    @property
    def keyring(self) -> signing.Keyring:
        if self.signing_keys is None:
            raise SettingsError(f"{signing.SIGNING_KEYS_SETTING} is not configured")
        return self.signing_keys

    def queue(self, role: str) -> str:
        return self.queues[role]

    @property
    def supervisor_period(self) -> timedelta:
        return self._period

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
        and retry policy applied (built with the settings)."""
        return self._workflows

    def current_version(self, name: str) -> int:
        """The version new orders of workflow ``name`` take (``WORKFLOW_VERSIONS``; else 1)."""
        return self.workflow_versions.get(name, 1)

    def _tuned(self, flow: Workflow) -> Workflow:
        budgets = {"complete_by_budget": self.step_timeout, "queue_budget": self.step_queue}
        set_budgets = {name: budget for name, budget in budgets.items() if budget is not None}
        steps = tuple(dataclasses.replace(step, **set_budgets) for step in flow.steps)
        retry = flow.retry
        if self.retry_base_delay is not None or self.retry_max_delay is not None:
            base = retry.base_delay if self.retry_base_delay is None else self.retry_base_delay
            cap = retry.cap if self.retry_max_delay is None else self.retry_max_delay
            retry = RetryPolicy(
                base_delay=base, factor=retry.factor, cap=max(cap, base), jitter=retry.jitter
            )
        threshold = (
            flow.failure_threshold if self.failure_threshold is None else self.failure_threshold
        )
        if (steps, retry, threshold) == (flow.steps, flow.retry, flow.failure_threshold):
            return flow
        return dataclasses.replace(flow, steps=steps, retry=retry, failure_threshold=threshold)

    @classmethod
    def model(cls) -> type[AppSettingsBase]:
        """The app settings these are read from: :data:`AppSettings`, what every app reads (the
        pattern app's alone; :class:`adapters.retention_settings.RetentionSettings` reads the
        retention purge's too)."""
        return AppSettings

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Self:
        """The settings in ``env`` (default: the process environment), every one of
        :meth:`model` checked; a SettingsError names every wrong or missing setting at once,
        not only the first."""
        values = os.environ if env is None else env
        model = cls.model()
        try:
            environment = model(_build_sources=((_Given(model, values),), {}))
        except ValidationError as errors:
            raise SettingsError(_listed(errors)) from None
        return cls(**environment.fields())

    @classmethod
    def check_on_load(cls, env: Mapping[str, str] | None = None) -> Self | None:
        """Called when the app is loaded: where ``env`` (default: the process environment)
        configures the app (it names one of its connections: a Functions host, in Azure or
        locally), wrong settings stop the load with every problem named, instead of failing
        every message later, and the settings are returned: the app's composition root builds
        on them. Elsewhere (a tool that only indexes the functions) there is nothing to check:
        None."""
        values = os.environ if env is None else env
        if not any(name.startswith(CONNECTION_NAMES) for name in values):
            return None
        return cls.from_env(values)


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


_NOT_SET = (
    "set it in local.settings.json (Values) or the environment locally, or in the Function App "
    "configuration in Azure"
)


class AppSettingsBase(BaseSettings):
    """The app settings as the host gives them, a field per setting named as the setting, each
    read by its kind (:mod:`adapters.setting_values`).

    Fields are validated in order, so those that depend on others (a connection on its
    endpoint settings, the keys on the Service Bus connection, the warning on the budget) come
    after them and find them in ``info.data`` when they are valid. The queue and service URL
    settings, one per agent, are added by :data:`AppSettings`. Its schema is built when it is
    first used (``defer_build``: this base is never built), at the check on load.
    """

    model_config = SettingsConfigDict(
        extra="ignore", frozen=True, validate_default=False, defer_build=True
    )

    ServiceBusConnection__fullyQualifiedNamespace: Annotated[str | None, reader(plain)] = None
    ServiceBusConnection__clientId: Annotated[str | None, reader(plain)] = None
    ServiceBusConnection: Annotated[Connection | None, Field(validate_default=True)] = None
    MESSAGE_SIGNING_KEYS: Annotated[signing.Keyring | None, Field(validate_default=True)] = None
    StateStorage__tableServiceUri: Annotated[str | None, reader(plain)] = None
    StateStorage__clientId: Annotated[str | None, reader(plain)] = None
    StateStorage: Annotated[Connection | None, Field(validate_default=True)] = None
    REMOTE_TIMEOUT_SECONDS: Annotated[timedelta, reader(_CALL)] = DEFAULT_REMOTE_TIMEOUT
    REMOTE_MAX_CONNECTIONS: Annotated[int, reader(_CONNECTIONS)] = DEFAULT_REMOTE_MAX_CONNECTIONS
    ORDERS_TABLE: Annotated[str, reader(table_name)] = "orders"
    ACTIVE_ORDERS_TABLE: Annotated[str, reader(table_name)] = "activeorders"
    SUPERVISION_TABLE: Annotated[str, reader(table_name)] = "supervision"
    SUPERVISOR_SCHEDULE: Annotated[str, reader(fixed_interval)] = DEFAULT_SUPERVISOR_SCHEDULE
    SUPERVISOR_CONCURRENCY: Annotated[int, reader(_CONCURRENCY)] = 4
    PENDING_STALE_AFTER_SECONDS: Annotated[timedelta, reader(_WAIT)] = timedelta(minutes=2)
    STEP_TIMEOUT_SECONDS: Annotated[timedelta | None, reader(_RUN_BUDGET)] = None
    STEP_QUEUE_SECONDS: Annotated[timedelta | None, reader(_WAIT_OR_ZERO)] = None
    FAILURE_THRESHOLD: Annotated[int | None, reader(_THRESHOLD)] = None
    RETRY_BASE_DELAY_SECONDS: Annotated[timedelta | None, reader(_WAIT)] = None
    RETRY_MAX_DELAY_SECONDS: Annotated[timedelta | None, reader(_WAIT)] = None
    COMPENSATION_BUDGET_SECONDS: Annotated[timedelta, reader(_WAIT)] = DEFAULT_COMPENSATION_BUDGET
    COMPENSATION_WARN_AFTER_SECONDS: Annotated[
        timedelta, reader(_WAIT), Field(validate_default=True)
    ] = DEFAULT_COMPENSATION_WARN_AFTER
    CLOCK_SKEW_TOLERANCE_SECONDS: Annotated[timedelta, reader(_SKEW)] = DEFAULT_SKEW
    WORKFLOW_VERSIONS: Annotated[dict[str, int], reader(workflow_versions)] = {}

    @field_validator(SERVICEBUS_CONNECTION, mode="before")
    @classmethod
    def _servicebus(cls, value: object, info: ValidationInfo) -> Connection:
        name = SERVICEBUS_CONNECTION
        text = value.strip() if isinstance(value, str) else ""
        namespace = info.data.get(f"{name}__fullyQualifiedNamespace")
        if text:
            return Connection(name, connection_string=text)
        if namespace:
            return Connection(name, endpoint=namespace, client_id=info.data[f"{name}__clientId"])
        raise refusal(
            f"Service Bus connection {name} is not configured: set {name} to a connection string "
            f"(local) or {name}__fullyQualifiedNamespace (+ {name}__clientId) for a managed "
            "identity (Azure)"
        )

    @field_validator(signing.SIGNING_KEYS_SETTING, mode="before")
    @classmethod
    def _signing_keys(cls, value: object, info: ValidationInfo) -> signing.Keyring | None:
        name = signing.SIGNING_KEYS_SETTING
        text = value.strip() if isinstance(value, str) else ""
        if text:
            try:
                return signing.parse_keyring(text, setting=name)
            except ValueError as problem:
                raise refusal(str(problem)) from None
        servicebus = info.data.get(SERVICEBUS_CONNECTION)
        if servicebus is None:
            return None  # the connection's own refusal says what is missing
        sas_key = development_sas_key(servicebus.connection_string)
        if sas_key is not None:
            return signing.local_keyring(sas_key)
        raise refusal(
            f"app setting {name} is not set: the app signs its internal messages with it. In "
            "Azure it is a Key Vault reference that infra/ provisions; elsewhere set it to "
            "k1:<base64 of 32 random bytes> "
            "(`openssl rand -base64 32`). Only a development broker's connection string "
            "(UseDevelopmentEmulator=true) may go without it."
        )

    @field_validator(STATE_STORAGE_CONNECTION, mode="before")
    @classmethod
    def _storage(cls, value: object, info: ValidationInfo) -> Connection:
        name = STATE_STORAGE_CONNECTION
        text = value.strip() if isinstance(value, str) else ""
        table = info.data.get(f"{name}__tableServiceUri")
        if text:
            return Connection(name, connection_string=text)
        if table:
            return Connection(name, endpoint=table, client_id=info.data[f"{name}__clientId"])
        raise refusal(
            f"state storage {name} is not configured: set {name} to a connection string (local) "
            f"or {name}__tableServiceUri (+ {name}__clientId) for a managed identity (Azure)"
        )

    @field_validator("COMPENSATION_WARN_AFTER_SECONDS")
    @classmethod
    def _warned_within_budget(cls, warn_after: timedelta, info: ValidationInfo) -> timedelta:
        budget = info.data.get("COMPENSATION_BUDGET_SECONDS")
        if budget is not None and warn_after >= budget:
            raise refusal(
                f"COMPENSATION_WARN_AFTER_SECONDS ({warn_after.total_seconds():g}) must be less "
                f"than COMPENSATION_BUDGET_SECONDS ({budget.total_seconds():g}): the warning "
                "says an order is still compensating, so it must come before compensation "
                "gives up"
            )
        return warn_after

    def fields(self) -> dict[str, Any]:
        """What :class:`Settings` is made of, from the settings' values."""
        return dict(
            queues={role: getattr(self, name) for role, name in QUEUE_SETTINGS.items()},
            service_urls={
                agent: getattr(self, name) for agent, name in SERVICE_URL_SETTINGS.items()
            },
            servicebus=self.ServiceBusConnection,
            storage=self.StateStorage,
            orders_table=self.ORDERS_TABLE,
            active_table=self.ACTIVE_ORDERS_TABLE,
            supervision_table=self.SUPERVISION_TABLE,
            supervisor_schedule=self.SUPERVISOR_SCHEDULE,
            supervisor_concurrency=self.SUPERVISOR_CONCURRENCY,
            pending_stale_after=self.PENDING_STALE_AFTER_SECONDS,
            step_timeout=self.STEP_TIMEOUT_SECONDS,
            step_queue=self.STEP_QUEUE_SECONDS,
            failure_threshold=self.FAILURE_THRESHOLD,
            retry_base_delay=self.RETRY_BASE_DELAY_SECONDS,
            retry_max_delay=self.RETRY_MAX_DELAY_SECONDS,
            compensation_budget=self.COMPENSATION_BUDGET_SECONDS,
            compensation_warn_after=self.COMPENSATION_WARN_AFTER_SECONDS,
            clock_skew=self.CLOCK_SKEW_TOLERANCE_SECONDS,
            workflow_versions=self.WORKFLOW_VERSIONS,
            signing_keys=self.MESSAGE_SIGNING_KEYS,
            remote_limits=ServiceLimits(
                self.REMOTE_TIMEOUT_SECONDS.total_seconds(), self.REMOTE_MAX_CONNECTIONS
            ),
        )


AppSettings = create_model(
    "AppSettings",
    __base__=AppSettingsBase,
    **{name: (Annotated[str, reader(entity_name)], ...) for name in QUEUE_SETTINGS.values()},
    **{name: (Annotated[str, reader(http_url)], ...) for name in SERVICE_URL_SETTINGS.values()},
)
"""The app settings model: the base's fields and, required, the queue and service URL
settings the agent catalog names (one of each per agent). What every app reads: the pattern app
reads these alone, the operations app these and the retention purge's
(:class:`adapters.retention_settings.RetentionAppSettings`)."""


class _Given(PydanticBaseSettingsSource):
    """The settings in one mapping: the process environment (the Functions host's app
    settings), or local.settings.json's Values (orderctl, tests). Only the names the model
    declares are looked up (tests/infra records which the code reads)."""

    def __init__(self, settings_cls: type[BaseSettings], values: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.values = values

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.values.get(field_name), field_name, False

    def __call__(self) -> dict[str, str]:
        found = {}
        for name, field_info in self.settings_cls.model_fields.items():
            value, key, _ = self.get_field_value(field_info, name)
            if value is not None:
                found[key] = str(value)  # text, as the host gives it, read by each field's kind
        return found


def _listed(errors: ValidationError) -> str:
    problems = [_problem(error) for error in errors.errors(include_url=False)]
    if len(problems) == 1:
        return problems[0]
    listed = "\n".join(f"- {problem}" for problem in problems)
    return f"{len(problems)} app settings are wrong:\n{listed}"


def _problem(error: Any) -> str:
    setting = str(error["loc"][0])
    if error["type"] == "missing":
        return f"app setting {setting} is not set; {_NOT_SET}"
    message = str(error["msg"])
    return message if setting in message else f"{setting}: {message}"
