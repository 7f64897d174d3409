"""Fault profiles for the fake remote services: schema, merging, loading with clear errors.

A profile is JSON::

    {
      "description": "what this profile is for",
      "default":  { <rules> },
      "services": { "payment": { <rules that override the default, field by field> } }
    }

Rules (every field optional; the defaults make a clean, fast service):

    latency                   {"fixed_ms": 20} or {"min_ms": 5, "max_ms": 50}
    hang_rate                 probability the request hangs for hang_seconds, then either
    hang_seconds              answers normally ("respond") or drops the connection ("close")
    hang_then                 "respond" | "close"
    throttle_rate             probability of 429 with Retry-After: retry_after_seconds
    retry_after_seconds
    transient_rate            probability of 503
    decline_rate              probability a forward operation (reserve/charge/create) is refused
    decline_order_ids         order ids whose forward operations are always refused (undos,
                              release/refund/cancel, are never declined)
    crash_after_effect_rate   probability the effect (or an undo's tombstone) is recorded and
                              the connection then dropped
    fail_first_n              the first N requests of each idempotency key get a 503

hang, throttle and transient share one draw (checked in that order), so their rates add up to
at most 1 and each is the exact share of requests it hits. All random draws come from an RNG
seeded with (seed, service, key, request number of that key): the same requests give the same
faults whatever the thread interleaving.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

ServiceName = Literal["inventory", "payment", "shipping"]
SERVICE_NAMES: tuple[ServiceName, ...] = ("inventory", "payment", "shipping")

EXAMPLES_DIR = Path(__file__).with_name("profiles")  # clean, flaky, chaotic, stress (.json)

Rate = Annotated[float, Field(ge=0.0, le=1.0)]
_MODEL = ConfigDict(extra="forbid", frozen=True, strict=True)


class ProfileError(ValueError):
    """A profile that cannot be used; the message says where and what is wrong."""


class Latency(BaseModel):
    model_config = _MODEL

    fixed_ms: float | None = Field(default=None, ge=0, le=600_000)
    min_ms: float | None = Field(default=None, ge=0, le=600_000)
    max_ms: float | None = Field(default=None, ge=0, le=600_000)

    @model_validator(mode="after")
    def _one_form(self) -> Self:
        uniform = (self.min_ms, self.max_ms)
        if self.fixed_ms is not None:
            if uniform != (None, None):
                raise ValueError("give either fixed_ms or min_ms/max_ms, not both")
        elif None in uniform:
            raise ValueError("give fixed_ms, or both min_ms and max_ms")
        elif self.min_ms > self.max_ms:  # type: ignore[operator]
            raise ValueError("min_ms must not exceed max_ms")
        return self

    def sample_seconds(self, rng: random.Random) -> float:
        """Always draws once, so the draws after it do not depend on the latency form."""
        draw = rng.random()
        if self.fixed_ms is not None:
            return self.fixed_ms / 1000.0
        low, high = self.min_ms or 0.0, self.max_ms or 0.0
        return (low + (high - low) * draw) / 1000.0


class FaultRules(BaseModel):
    model_config = _MODEL

    latency: Latency = Latency(fixed_ms=0)
    hang_rate: Rate = 0.0
    hang_seconds: float = Field(default=30.0, gt=0, le=3600)
    hang_then: Literal["respond", "close"] = "respond"
    throttle_rate: Rate = 0.0
    retry_after_seconds: int = Field(default=1, ge=0, le=3600)
    transient_rate: Rate = 0.0
    decline_rate: Rate = 0.0
    decline_order_ids: list[str] = Field(default_factory=list, max_length=10_000)
    crash_after_effect_rate: Rate = 0.0
    fail_first_n: int = Field(default=0, ge=0, le=1000)

    @model_validator(mode="after")
    def _shared_draw_fits(self) -> Self:
        total = self.hang_rate + self.throttle_rate + self.transient_rate
        if total > 1.0 + 1e-9:
            raise ValueError(
                f"hang_rate + throttle_rate + transient_rate must be at most 1 (is {total:g})"
            )
        return self


class Profile(BaseModel):
    model_config = _MODEL

    description: str = ""
    default: FaultRules = FaultRules()
    services: dict[ServiceName, FaultRules] = Field(default_factory=dict)

    _effective: dict[str, FaultRules] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _merge(self) -> Self:
        base = self.default.model_dump()
        for name in SERVICE_NAMES:
            override = self.services.get(name)
            if override is None:
                self._effective[name] = self.default
                continue
            merged = {**base, **override.model_dump(exclude_unset=True)}
            try:
                self._effective[name] = FaultRules.model_validate(merged)
            except ValidationError as exc:
                raise ValueError(f"services.{name} (merged with default): {_brief(exc)}") from exc
        return self

    def rules_for(self, service: str) -> FaultRules:
        return self._effective[service]


def parse_profile(text: str, source: str = "profile") -> Profile:
    """Parse and validate profile JSON; a ProfileError names the line/column or the field."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(
            f"{source}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
    return validate_profile(data, source)


def validate_profile(data: Any, source: str = "profile") -> Profile:
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(f"{source}: {_brief(exc)}") from exc


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read profile: {exc}") from exc
    return parse_profile(text, str(path))


def example_profile(name: str) -> Path:
    """Path of a shipped example profile: ``example_profile("flaky")``."""
    path = EXAMPLES_DIR / f"{name}.json"
    if not path.is_file():
        known = sorted(p.stem for p in EXAMPLES_DIR.glob("*.json"))
        raise ProfileError(f"no example profile {name!r}; known: {known}")
    return path


def source_name(path: str | Path) -> str:
    """How a profile file is named to people: a shipped example by its name (``chaotic``),
    any other file by its path."""
    path = Path(path)
    try:
        shipped = path.resolve().parent == EXAMPLES_DIR.resolve() and path.suffix == ".json"
    except OSError:
        shipped = False
    return path.stem if shipped else str(path)


def as_profile(value: Profile | Mapping[str, Any] | str | Path | None) -> Profile:
    """Accept a Profile, a mapping, a path, or None (a clean profile)."""
    if value is None:
        return Profile()
    if isinstance(value, Profile):
        return value
    if isinstance(value, Mapping):
        return validate_profile(dict(value))
    return load_profile(value)


def _brief(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        message = str(error["msg"]).removeprefix("Value error, ")
        where = ".".join(str(part) for part in error["loc"])
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)
