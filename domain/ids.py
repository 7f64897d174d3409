"""Validation of ids and names before they reach a Table key, a filter or a queue name.

Order ids become PartitionKeys and appear in filters, so the allowed alphabet is deliberately
small: ``^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$``.

- Table keys forbid ``/ \\ # ?`` and control characters; a key containing them fails with an
  opaque 400 or, worse, addresses a different resource in the request URL.
- A quote would let a value close an OData string literal (``x' or PartitionKey ne '``) and
  widen a filter to other orders. Filters are parameterized as well; this is the second wall.
- ``.`` and ``:`` are kept out so they can act as separators in keys that embed an order id
  (the active-order index RowKey ``<order>.<generation>``, idempotency keys).

Everything here raises :class:`InvalidId`, a ``ValueError``, so pydantic turns it into a
validation error with the same message.

Idempotency keys: ``<order_id>:<step>:<operation>:<generation>``, e.g.
``o-42:charge_payment:do:1``. The attempt number is NOT part of the key: every retry and
every redelivery of one step in one direction must present the same key, so that the remote
service applies the effect at most once. The generation is: it starts at 1 and goes up by one
only when an operator resubmits a failed order, because what the resubmission redoes must be
able to take effect again (a compensated reservation, a declined charge after the customer fixed
their card), which an idempotent remote service would refuse, or answer from its record of the
first try, under the old key. ``do`` and ``undo`` have distinct keys so a refund never dedupes
against the charge it reverses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final, Literal, NamedTuple

Operation = Literal["do", "undo"]

ID_MAX_LENGTH: Final = 64
NAME_MAX_LENGTH: Final = 40
ENTITY_NAME_MAX_LENGTH: Final = 260
MAX_GENERATION: Final = 9_999

_LOWER = frozenset("abcdefghijklmnopqrstuvwxyz")
_ALNUM = _LOWER | frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")


@dataclass(frozen=True, slots=True)
class _Rule:
    """An alphabet with first/last character constraints and a length range."""

    first: frozenset[str]
    rest: frozenset[str]
    max_len: int
    text: str
    last: frozenset[str] | None = None
    min_len: int = 1
    valid: re.Pattern[str] = field(init=False, repr=False, compare=False)
    """The same rule as one pattern: a valid value (nearly every one) is told in one match,
    and only one that fails is walked through to say why."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "valid", _pattern(self))

    def check(self, value: object, kind: str) -> str:
        if not isinstance(value, str):
            got = type(value).__name__
            raise InvalidId(f"{kind} must be a string, got {got}; allowed: {self.text}")
        if self.valid.fullmatch(value):
            return value
        problem = self._problem(value)
        if problem is None:
            return value
        raise InvalidId(f"{kind} {_shown(value)} {problem}; allowed: {self.text}")

    def _problem(self, value: str) -> str | None:
        if not value:
            return "is empty"
        if len(value) > self.max_len:
            return f"is {len(value)} characters long (at most {self.max_len})"
        if len(value) < self.min_len:
            return f"is {len(value)} characters long (at least {self.min_len})"
        if value[0] not in self.first:
            return f"starts with {value[0]!r}"
        for index, char in enumerate(value[1:], start=1):
            if char not in self.rest:
                return f"has {char!r} at position {index}"
        if self.last is not None and value[-1] not in self.last:
            return f"ends with {value[-1]!r}"
        return None


def _pattern(rule: _Rule) -> re.Pattern[str]:
    def chars(alphabet: frozenset[str]) -> str:
        return "[" + "".join(re.escape(c) for c in sorted(alphabet)) + "]"

    first, rest = chars(rule.first), chars(rule.rest)
    if rule.last is None:
        body = f"{first}{rest}{{{rule.min_len - 1},{rule.max_len - 1}}}"
    else:
        alone = chars(rule.first & rule.last) if rule.min_len <= 1 else "(?!)"
        middle = f"{{{max(rule.min_len - 2, 0)},{rule.max_len - 2}}}"
        body = f"(?:{alone}|{first}{rest}{middle}{chars(rule.rest & rule.last)})"
    return re.compile(body, re.ASCII)


_ID = _Rule(
    first=_ALNUM,
    rest=_ALNUM | frozenset("_-"),
    max_len=ID_MAX_LENGTH,
    text="1-64 characters of A-Z a-z 0-9 '_' '-', starting with a letter or digit",
)
_SKU = _Rule(
    first=_ALNUM,
    rest=_ALNUM | frozenset("._-"),
    max_len=64,
    text="1-64 characters of A-Z a-z 0-9 '.' '_' '-', starting with a letter or digit",
)
_NAME = _Rule(
    first=_LOWER,
    rest=_LOWER | frozenset("0123456789_"),
    max_len=NAME_MAX_LENGTH,
    text="1-40 characters of a-z 0-9 '_', starting with a lowercase letter",
)
_INSTANCE = _Rule(
    first=_ALNUM,
    rest=_ALNUM | frozenset("._:@-"),
    max_len=128,
    text="1-128 characters of A-Z a-z 0-9 '.' '_' ':' '@' '-', starting with a letter or digit",
)
# Service Bus entity names: letters, digits, '.', '-', '_', starting and ending with a letter or
# digit. '/' (sub-paths such as '$DeadLetterQueue' or topic subscriptions) is refused on purpose.
_ENTITY = _Rule(
    first=_ALNUM,
    rest=_ALNUM | frozenset("._-"),
    last=_ALNUM,
    max_len=ENTITY_NAME_MAX_LENGTH,
    text="1-260 characters of A-Z a-z 0-9 '.' '_' '-', starting and ending with a letter or digit",
)
_TABLE = _Rule(
    first=_ALNUM - frozenset("0123456789"),
    rest=_ALNUM,
    min_len=3,
    max_len=63,
    text="3-63 letters and digits, starting with a letter",
)
_GENERATION = re.compile(r"[1-9][0-9]{0,3}", re.ASCII)


class InvalidId(ValueError):
    """An id or name that must not reach storage or a queue; the message says why."""


def _shown(value: str) -> str:
    if len(value) > 40:
        return f"{value[:40]!r} (+{len(value) - 40} more characters)"
    return repr(value)


def validate_order_id(value: object) -> str:
    """Return ``value`` if it is a valid order id, else raise :class:`InvalidId`."""
    return _ID.check(value, "order id")


def validate_id(value: object, kind: str) -> str:
    """Validate any other identifier (customer id, ...) with the order-id alphabet."""
    return _ID.check(value, kind)


def validate_sku(value: object) -> str:
    return _SKU.check(value, "sku")


def validate_name(value: object, kind: str) -> str:
    """Step, action, workflow and agent names, and short codes (alert reasons)."""
    return _NAME.check(value, kind)


def validate_instance_id(value: object, kind: str = "instance id") -> str:
    """Who acts: a scheduler or supervisor instance, an operator. Stored, never used as a key."""
    return _INSTANCE.check(value, kind)


def validate_entity_name(value: object, kind: str = "queue name") -> str:
    """A Service Bus queue name supplied from outside (an order's reply queue)."""
    return _ENTITY.check(value, kind)


def validate_table_name(value: object) -> str:
    return _TABLE.check(value, "table name")


def validate_generation(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GENERATION:
        raise InvalidId(f"generation must be an integer from 1 to {MAX_GENERATION}, got {value!r}")
    return value


def validate_operation(value: object) -> Operation:
    if value == "do":
        return "do"
    if value == "undo":
        return "undo"
    raise InvalidId(f"operation must be 'do' or 'undo', got {_shown(str(value))}")


class IdempotencyKey(NamedTuple):
    order_id: str
    step: str
    operation: Operation
    generation: int

    def __str__(self) -> str:
        return f"{self.order_id}:{self.step}:{self.operation}:{self.generation}"


IDEMPOTENCY_KEY_MAX_LENGTH: Final = ID_MAX_LENGTH + NAME_MAX_LENGTH + len("undo") + 4 + 3


def idempotency_key(order_id: str, step: str, operation: Operation, generation: int = 1) -> str:
    """The key a step presents to its remote service (see the module docstring for the rule)."""
    return str(
        IdempotencyKey(
            validate_order_id(order_id),
            validate_name(step, "step name"),
            validate_operation(operation),
            validate_generation(generation),
        )
    )


def parse_idempotency_key(value: object) -> IdempotencyKey:
    """Split and validate a key made by :func:`idempotency_key`."""
    if not isinstance(value, str):
        raise InvalidId(f"idempotency key must be a string, got {type(value).__name__}")
    parts = value.split(":")
    if len(parts) != 4:
        raise InvalidId(
            f"idempotency key {_shown(value)} must have 4 ':'-separated parts "
            "<order_id>:<step>:<do|undo>:<generation>"
        )
    order_id, step, operation, generation = parts
    if not _GENERATION.fullmatch(generation):
        raise InvalidId(
            f"idempotency key {_shown(value)} has generation {generation[:12]!r}; "
            f"expected an integer from 1 to {MAX_GENERATION} without leading zeros"
        )
    return IdempotencyKey(
        validate_order_id(order_id),
        validate_name(step, "step name"),
        validate_operation(operation),
        int(generation),
    )
