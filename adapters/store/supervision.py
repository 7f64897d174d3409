"""Who sweeps which bucket of the active-order index, and when each bucket was last swept.

Several Supervisor instances share the index's buckets through per-bucket leases held in one
partition of the ``supervision`` table, claimed with ETags the way the pattern's LockedBy
claims are:

- ``bucket-<nn>``: ``Holder`` and ``LeasedUntil`` (the lease), and the bucket's checkpoint:
  ``SweptAt`` (the ``now`` of the last sweep that handled or handed out every row due then),
  ``SweptBy``, ``LagSeconds`` (how long the most overdue row had been due when that sweep found
  it) and ``DueFound``; and what the latest tick that held it measured of the fleet's drain
  (:mod:`service.hand_out`): ``Dispatched`` rows handed out at ``DispatchedAt``, ``Returned``
  (rows an earlier hand-out's lease ran out on before anyone moved them on), ``DrainRate`` (rows
  per second the fleet moved on since the tick before) and ``Left`` (rows due it neither handled
  nor handed out).
- ``member-<instance>``: ``Until``, renewed with the instance's leases, so each instance knows
  how many share the work and takes its fair share.

One query reads the whole roster and one batch changes it (all rows share a partition), so a
claim is all or nothing: a lost race writes nothing. Leases are an optimisation, not what keeps
orders correct: every change to an order is ETag-conditional, so two instances sweeping one
bucket at once never both recover an order.

Every row a claim or a checkpoint writes carries that write's random ``WriteId``, so a write
whose outcome is unknown is read back, never guessed: its answer was lost
(:func:`adapters.tables.may_have_applied`), or it was refused with a 412 that may answer a
resend of itself (azure-core resends a PUT after a read timeout, aiohttp after a reset; the
first may have landed). The rows are read; they are ours if they carry our WriteId.

The rows' model below is pure; the roster in memory is
:class:`devstack.memory.MemorySupervision`. What operators read of it (the lag, the backlog's
drain, the recovery bound) is :mod:`service.operations.supervisor`'s.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from azure.core.exceptions import AzureError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableTransactionError, UpdateMode

from adapters.store.active_index import INDEX_BUCKETS
from adapters.store.rows import ConcurrencyConflict, etag_of, if_unchanged, utc
from adapters.tables import Entity, Table, may_have_applied
from domain import ids


def _lease_entity(lease: BucketLease, write_id: str) -> dict[str, Any]:
    entity: dict[str, Any] = {
        "PartitionKey": PARTITION,
        "RowKey": bucket_row_key(lease.bucket),
        WRITE_ID: write_id,
        "Holder": lease.holder,
        "SweptBy": lease.swept_by,
        "LagSeconds": float(lease.lag_s),
        "DueFound": int(lease.due_found),
        "Dispatched": int(lease.dispatched),
        "Returned": int(lease.returned),
        "DrainRate": float(lease.drain_rate),
        "Left": int(lease.left),
    }
    for name, value in (
        ("LeasedUntil", lease.until),
        ("SweptAt", lease.swept_at),
        ("DispatchedAt", lease.dispatched_at),
    ):
        if value is not None:
            entity[name] = utc(value)
    return entity


class SupervisionTable:
    """The roster in Table Storage (see the module docstring)."""

    def __init__(self, table: Table) -> None:
        self._table = table

    async def read(self) -> Roster:
        return roster_from_entities(await self._entities())

    async def _entities(self) -> list[Entity]:
        entities = self._table.query_entities(
            "PartitionKey eq @pk", parameters={"pk": PARTITION}, results_per_page=1000
        )
        return [entity async for entity in entities]

    async def claim(
        self,
        member: Member,
        hold: Sequence[BucketLease],
        release: Sequence[BucketLease],
        reap: Sequence[Member] = (),
    ) -> dict[int, str]:
        """Renew ``member``, take or renew ``hold`` (their ``holder``/``until`` already set),
        give up ``release`` and delete ``reap``, all or nothing. Returns the held buckets' new
        ETags. Raises :class:`ConcurrencyConflict` if any row changed since it was read (read
        the roster again and plan again), unless the rows read back carry this claim: a refusal
        or a lost answer is read back first (module docstring)."""
        write_id = uuid.uuid4().hex
        renewed = _member_key(member.instance) | {"Until": utc(member.until), WRITE_ID: write_id}
        operations: list[tuple[Any, ...]] = [("upsert", renewed, {"mode": UpdateMode.REPLACE})]
        changed = [*hold, *release]
        operations += [_write(lease, write_id) for lease in changed]
        operations += [("delete", _member_key(g.instance), if_unchanged(g.etag)) for g in reap]
        try:
            results = await self._table.submit_transaction(operations)  # type: ignore[arg-type]
        except AzureError as exc:
            refused = isinstance(exc, TableTransactionError)
            if not refused and not may_have_applied(exc):
                raise
            landed = await self._landed(member.instance, changed, write_id)
            if landed is not None:
                return landed
            lost = "" if refused else "the claim's answer was lost; the roster does not hold it: "
            raise ConcurrencyConflict("supervisor roster", lost + str(exc.message)) from exc
        etags = [str(r.get("etag")) for r in results[1 : 1 + len(changed)]]
        return {lease.bucket: etag for lease, etag in zip(changed, etags, strict=True)}

    async def _landed(
        self, instance: str, changed: Sequence[BucketLease], write_id: str
    ) -> dict[int, str] | None:
        """The ETags of ``changed`` if the roster, read now, holds the claim ``write_id`` (its
        member row and every row it changed carry it); else None."""
        rows = {str(e["RowKey"]): e for e in await self._entities()}
        keys = [member_row_key(instance), *(bucket_row_key(lease.bucket) for lease in changed)]
        if any(rows.get(key, {}).get(WRITE_ID) != write_id for key in keys):
            return None
        return {lease.bucket: etag_of(rows[bucket_row_key(lease.bucket)]) for lease in changed}

    async def checkpoint(
        self, sweeps: Sequence[Sweep], by: str, *, others: Sequence[BucketLease] = ()
    ) -> int:
        """Record finished sweeps, and write ``others`` as they are (leases extended or given
        up), each on condition of the ETag from the claim (a bucket taken over meanwhile keeps
        its new holder's record). One batch; if a lease changed, or the batch's answer was lost,
        the rows one by one, each read back unless its write says it landed. Returns how many
        rows were written."""
        rows = [swept_lease(sweep, by) for sweep in sweeps] + list(others)
        if not rows:
            return 0
        write_id = uuid.uuid4().hex
        try:
            await self._table.submit_transaction([_write(lease, write_id) for lease in rows])
            return len(rows)
        except AzureError as exc:
            if not isinstance(exc, TableTransactionError) and not may_have_applied(exc):
                raise
        return sum([await self._write_unless_changed(lease, write_id) for lease in rows])

    async def _write_unless_changed(self, lease: BucketLease, write_id: str) -> bool:
        """Write ``lease`` unless its row changed since the claim; True if the row holds it
        (written now, or by the batch before). A refusal or a lost answer is read back."""
        try:
            await self._table.update_entity(
                _lease_entity(lease, write_id),
                mode=UpdateMode.REPLACE,
                **if_unchanged(lease.etag),
            )
        except (ResourceModifiedError, ResourceNotFoundError):
            pass  # taken over since the claim; or ours, landed before: a resend's 412
        except AzureError as exc:
            if not may_have_applied(exc):
                raise
        else:
            return True
        return await self._carries(lease.bucket, write_id)

    async def _carries(self, bucket: int, write_id: str) -> bool:
        try:
            row = await self._table.get_entity(PARTITION, bucket_row_key(bucket))
        except ResourceNotFoundError:
            return False
        return row.get(WRITE_ID) == write_id


def _write(lease: BucketLease, write_id: str) -> tuple[Any, ...]:
    """A batch operation writing ``lease`` over the row version it was read at (its ETag;
    None: a new row)."""
    if lease.etag is None:
        return ("create", _lease_entity(lease, write_id))
    replace = {"mode": UpdateMode.REPLACE, **if_unchanged(lease.etag)}
    return ("update", _lease_entity(lease, write_id), replace)


PARTITION: Final = "supervisor"
WRITE_ID: Final = "WriteId"
"""The random id of the claim or checkpoint that wrote a row (module docstring)."""
_BUCKET_PREFIX: Final = "bucket-"
_MEMBER_PREFIX: Final = "member-"


@dataclass(frozen=True, slots=True)
class BucketLease:
    bucket: int
    holder: str = ""
    until: datetime | None = None
    swept_at: datetime | None = None
    swept_by: str = ""
    lag_s: float = 0.0
    due_found: int = 0
    dispatched: int = 0
    """Rows the latest tick holding the bucket handed out (service.hand_out), at..."""
    dispatched_at: datetime | None = None
    returned: int = 0
    """Rows that tick found due again: an earlier hand-out's lease ran out on them."""
    drain_rate: float = 0.0
    """Rows per second of this bucket the fleet moved on, as that tick measured it."""
    left: int = 0
    """Rows due that tick neither handled nor handed out (its budget or the fleet's pace)."""
    etag: str | None = None
    """None: the row does not exist yet (a claim creates it)."""

    def held_by(self, instance: str, now: datetime) -> bool:
        return self.holder == instance and self.until is not None and self.until > now

    def free(self, now: datetime) -> bool:
        return not self.holder or self.until is None or self.until <= now


@dataclass(frozen=True, slots=True)
class Member:
    instance: str
    until: datetime
    etag: str | None = None


@dataclass(frozen=True, slots=True)
class Roster:
    buckets: tuple[BucketLease, ...]
    """One per bucket, in bucket order; rows not written yet appear free with no ETag."""
    members: tuple[Member, ...]


@dataclass(frozen=True, slots=True)
class Sweep:
    """A bucket swept to the end: every row due at ``at`` was handled."""

    lease: BucketLease
    at: datetime
    lag_s: float
    due_found: int


def bucket_row_key(bucket: int) -> str:
    return f"{_BUCKET_PREFIX}{bucket:02d}"


def member_row_key(instance: str) -> str:
    return _MEMBER_PREFIX + ids.validate_instance_id(instance)


def _member_key(instance: str) -> dict[str, Any]:
    return {"PartitionKey": PARTITION, "RowKey": member_row_key(instance)}


def roster_from_entities(entities: Sequence[dict[str, Any]]) -> Roster:
    buckets = {b: BucketLease(bucket=b) for b in range(INDEX_BUCKETS)}
    members = []
    for entity in entities:
        key = str(entity["RowKey"])
        if key.startswith(_BUCKET_PREFIX):
            bucket = int(key.removeprefix(_BUCKET_PREFIX))
            if bucket in buckets:
                buckets[bucket] = _lease_from_entity(bucket, entity)
        elif key.startswith(_MEMBER_PREFIX):
            members.append(
                Member(
                    instance=key.removeprefix(_MEMBER_PREFIX),
                    until=utc(entity["Until"]),
                    etag=etag_of(entity),
                )
            )
    return Roster(buckets=tuple(buckets.values()), members=tuple(members))


def _lease_from_entity(bucket: int, entity: dict[str, Any]) -> BucketLease:
    def when(name: str) -> datetime | None:
        value = entity.get(name)
        return utc(value) if isinstance(value, datetime) else None

    return BucketLease(
        bucket=bucket,
        holder=str(entity.get("Holder") or ""),
        until=when("LeasedUntil"),
        swept_at=when("SweptAt"),
        swept_by=str(entity.get("SweptBy") or ""),
        lag_s=float(entity.get("LagSeconds") or 0.0),
        due_found=int(entity.get("DueFound") or 0),
        dispatched=int(entity.get("Dispatched") or 0),
        dispatched_at=when("DispatchedAt"),
        returned=int(entity.get("Returned") or 0),
        drain_rate=float(entity.get("DrainRate") or 0.0),
        left=int(entity.get("Left") or 0),
        etag=etag_of(entity),
    )


def swept_lease(sweep: Sweep, by: str) -> BucketLease:
    """``sweep``'s lease with its checkpoint: swept at ``sweep.at`` by ``by``."""
    return dataclasses.replace(
        sweep.lease,
        swept_at=sweep.at,
        swept_by=by,
        lag_s=round(sweep.lag_s, 3),
        due_found=sweep.due_found,
    )
