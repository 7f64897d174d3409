"""Dead letters sent back to their queue by the pattern app, for the operations app, which may
send to scheduler-commands only (docs/architecture.md, "Two apps").

The operations app chose the dead letter, found it may be replayed and completes it once its
:class:`domain.messages.ReplayDeadLetter` command is on the queue
(service/operations/dead_letter_settler.py). Here it is sent as it was first sent. A queue of
the app's signed messages (an agent's requests, the replies, the commands) gets it only if its
signature verifies for that queue, so a replay command can put on an internal queue only what
the app itself signed for it; anything else, and a command naming no queue of the app, is
dropped with a critical ``untrusted_message`` alert. A command that comes twice sends the same
MessageId twice, and duplicate detection drops the copy within its window.
"""

from __future__ import annotations

from domain import signing
from domain.messages import SIGNED_ROLES, OperatorAlert, ReplayDeadLetter, excerpt
from service.inbound import UNTRUSTED_REASON
from service.runtime import Runtime


async def replay(rt: Runtime, command: ReplayDeadLetter, *, caused_by: str | None) -> None:
    problem = _refusal(rt, command)
    if problem is None:
        await rt.bus.send_copy(rt.settings.queue(command.queue), command)
        return
    await rt.alert(
        OperatorAlert(
            order_id=None,
            severity="critical",
            reason=UNTRUSTED_REASON,
            detail=(
                f"a replay of dead letter {command.sequence_number} of {command.queue!r} asked "
                f"by {command.requested_by} {problem}. Nothing was sent. Only the operations "
                "app should ask for replays: find who else can send to the commands queue."
            ),
            raw_excerpt=excerpt(command.raw_body()),
            source=rt.actor("commands"),
            caused_by=caused_by,
        )
    )


def _refusal(rt: Runtime, command: ReplayDeadLetter) -> str | None:
    """Why the dead letter must not be sent, or None."""
    queues = rt.settings.queues
    entity = queues.get(command.queue)
    if entity is None:
        return f"names no queue of the app ({', '.join(queues)})"
    if command.queue not in SIGNED_ROLES:
        return None  # the orders queue (the submitters' own messages), the alerts
    verdict = signing.verify(
        rt.settings.keyring,
        signing.signature_of(command.properties),
        queue=entity,
        message_id=command.message_id,
        body=command.raw_body(),
    )
    if isinstance(verdict, signing.Rejected):
        return f"carries a message not signed for {entity}: {verdict.problem}: {verdict.detail}"
    return None
