"""Replaying and purging dead letters: which messages, whether each may be replayed, and what
each became.

**Replay** hands a dead letter to the pattern app, which sends it back to its queue as it was
first sent (same body, MessageId, application properties and headers): the operations app sends
to scheduler-commands only, so it puts there one :class:`domain.messages.ReplayDeadLetter`
carrying the message (:mod:`service.replays` sends it), and only then completes it in the
dead-letter queue. Three things are checked first, per message:

- A queue whose trigger accepts only the app's signed messages (agent requests, replies,
  commands) gets back only a message whose signature verifies: anything else would be refused
  there with an ``untrusted_message`` alert. It stays; purge it instead.
- Service Bus duplicate detection drops a message whose MessageId it saw within its window
  (``DUPLICATE_WINDOW``, 10 minutes for every queue of this app: devstack/servicebus/Config.json
  and infra/), counted from when the message was first sent. A replay inside it would be
  dropped without a word, so it is refused until the window has passed. A replay that was sent
  but not completed (a crash between the two) is sent again by the next replay, and dropped
  then as the duplicate it is.
- It must fit in a command: a body of at most ``MAX_REPLAY_BYTES`` (160 KiB), properties and
  headers of the kinds and sizes :class:`domain.messages.ReplayDeadLetter` takes.

**Purge** completes dead letters: they are gone.

Both record ``dead_letter_replayed`` / ``dead_letter_purged`` in the timeline of the order the
message names, when the name can be trusted: a message the app signed, or a submission (the
orders queue holds the submitters' own, unsigned, messages).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final, Literal

from azure.servicebus import ServiceBusReceivedMessage
from azure.servicebus.exceptions import ServiceBusError
from pydantic import ValidationError

from adapters.queues import body_of, properties_of
from domain import ids, signing
from domain.messages import (
    MAX_REPLAY_BYTES,
    SIGNED_ROLES,
    MessageTooLarge,
    ReplayDeadLetter,
    summarize,
)
from service.operations.errors import InvalidRequest
from service.operations.models import DeadLetterOutcome, DeadLetterOutcomeKind

Kind = Literal["replay", "purge"]
DUPLICATE_WINDOW: Final = timedelta(minutes=10)
HandOver = Callable[[ReplayDeadLetter], Awaitable[None]]
"""Puts a replay command on the pattern app's commands queue."""
MAX_SCAN: Final = 500
"""Dead letters received at most while looking for the ones named."""
MAX_SELECTED: Final = 100


def selection(sequence_numbers: object, everything: object) -> frozenset[int] | None:
    """The sequence numbers asked for (None: every dead letter)."""
    if everything is True:
        if sequence_numbers:
            raise InvalidRequest("invalid_selection", "give sequence numbers or all, not both")
        return None
    if not isinstance(sequence_numbers, list | tuple) or not sequence_numbers:
        raise InvalidRequest(
            "invalid_selection",
            "say which dead letters: their sequence numbers (see the dead-letter listing), or all",
        )
    numbers = frozenset(sequence_numbers)
    if len(numbers) > MAX_SELECTED or not all(
        isinstance(n, int) and not isinstance(n, bool) and 1 <= n < 2**63 for n in numbers
    ):
        raise InvalidRequest(
            "invalid_selection",
            f"sequence numbers are integers >= 1, at most {MAX_SELECTED} at a time",
        )
    return numbers


@dataclass
class Settler:
    """Decides, message by message, what a replay or purge of one queue does with it, and
    remembers the outcomes. ``keyring``: the app's signing keys; ``now``: the clock;
    ``wanted``: the sequence numbers asked for (None: any); ``actor``: who asks;
    ``hand_over``: what sends a replay command."""

    kind: Kind
    role: str
    entity: str
    keyring: signing.Keyring
    now: Callable[[], datetime]
    wanted: frozenset[int] | None
    actor: str
    hand_over: HandOver
    window: timedelta = DUPLICATE_WINDOW
    outcomes: dict[int, DeadLetterOutcome] = field(default_factory=dict)

    def enough(self) -> bool:
        return self.wanted is not None and self.wanted <= self.outcomes.keys()

    def consider(self, message: ServiceBusReceivedMessage) -> None:
        """A dry run's verdict on one dead letter (peeked)."""
        if not self._wanted(message):
            return
        if self.kind == "purge":
            self._note(message, "would_purge", "")
            return
        refusal = self._command(message)
        if isinstance(refusal, str):
            self._note(message, "refused", refusal)
        else:
            self._note(message, "would_replay", "")

    async def act(self, message: ServiceBusReceivedMessage) -> bool:
        """Settle one dead letter (received): True to complete it."""
        if not self._wanted(message):
            return False
        if self.kind == "purge":
            self._note(message, "purged", "removed from the dead letters")
            return True
        command = self._command(message)
        if isinstance(command, str):
            self._note(message, "refused", command)
            return False
        try:
            await self.hand_over(command)
        except MessageTooLarge as error:
            self._note(message, "refused", f"not replayed: {error} (purge it instead)")
            return False
        except ServiceBusError as error:
            self._note(message, "failed", f"not sent back, it stays: {type(error).__name__}")
            return False
        self._note(message, "replayed", f"sent back to {self.entity} (by the pattern app)")
        return True

    def missing(self) -> list[DeadLetterOutcome]:
        """The sequence numbers asked for that were not found."""
        return [
            DeadLetterOutcome(
                sequence_number=n,
                message_id=None,
                order_id=None,
                outcome="not_found",
                detail=f"no dead letter {n} in {self.entity} (replayed or purged already?)",
                recorded_in_timeline=False,
            )
            for n in sorted((self.wanted or frozenset()) - self.outcomes.keys())
        ]

    def _wanted(self, message: ServiceBusReceivedMessage) -> bool:
        number = message.sequence_number or 0
        return number not in self.outcomes and (self.wanted is None or number in self.wanted)

    def _command(self, message: ServiceBusReceivedMessage) -> ReplayDeadLetter | str:
        """The command that replays ``message``, or why it may not be replayed."""
        refusal = self._refusal(message)
        if refusal:
            return refusal
        body = body_of(message)
        if len(body) > MAX_REPLAY_BYTES:
            return (
                f"not replayed: its body is {len(body)} bytes, over the {MAX_REPLAY_BYTES} a "
                "replay carries (purge it, and have its sender send it again)"
            )
        try:
            return ReplayDeadLetter(
                queue=self.role,
                sequence_number=message.sequence_number or 0,
                message_id=message.message_id or "",
                body=base64.b64encode(body).decode("ascii"),
                properties=properties_of(message),
                correlation_id=message.correlation_id,
                subject=message.subject,
                content_type=message.content_type,
                reply_to=message.reply_to,
                requested_by=self.actor,
                requested_at=self.now(),
            )
        except ValidationError as invalid:
            return f"not replayed: it does not fit a replay command: {summarize(invalid)}"

    def _refusal(self, message: ServiceBusReceivedMessage) -> str | None:
        if self.role in SIGNED_ROLES:
            verdict = self._verify(message)
            if isinstance(verdict, signing.Rejected):
                return (
                    f"not replayed: {verdict.problem}: {verdict.detail}; the {self.role} "
                    "trigger would refuse it (purge it instead)"
                )
        sent = message.enqueued_time_utc
        if sent is not None:
            sent = sent if sent.tzinfo else sent.replace(tzinfo=UTC)
            until = sent + self.window
            if self.now() < until:
                return (
                    f"not replayed yet: first sent {sent:%H:%M:%S} UTC, and Service Bus drops "
                    f"a copy with the same MessageId until {until:%H:%M:%S} UTC (duplicate "
                    "detection); replay it after that"
                )
        return None

    def _verify(self, message: ServiceBusReceivedMessage) -> signing.Verified | signing.Rejected:
        return signing.verify(
            self.keyring,
            signing.signature_of(properties_of(message)),
            queue=self.entity,
            message_id=message.message_id or "",
            body=body_of(message),
        )

    def _note(
        self, message: ServiceBusReceivedMessage, outcome: DeadLetterOutcomeKind, detail: str
    ) -> None:
        number = message.sequence_number or 0
        self.outcomes[number] = DeadLetterOutcome(
            sequence_number=number,
            message_id=message.message_id,
            order_id=self._order_named(message),
            outcome=outcome,
            detail=detail,
            recorded_in_timeline=False,
        )

    def _order_named(self, message: ServiceBusReceivedMessage) -> str | None:
        trusted = self.role == "orders" or isinstance(self._verify(message), signing.Verified)
        if not trusted:
            return None
        try:
            data = json.loads(body_of(message)[:65536])
            return ids.validate_order_id(data.get("order_id"))
        except (ValueError, AttributeError, ids.InvalidId, RecursionError):
            return None
