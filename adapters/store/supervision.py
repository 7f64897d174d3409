"""Who sweeps which bucket of the active-order index, and when each bucket was last swept.

Several Supervisor instances share the index's buckets through per-bucket leases held in one
partition of the ``supervision`` table, claimed with ETags the way the pattern's LockedBy
claims are:

- ``bucket-<nn>``: ``Holder`` and ``LeasedUntil`` (the lease), and the bucket's checkpoint:
  ``SweptAt`` (the ``now`` of the last sweep that handled every row due then), ``SweptBy``,
  ``LagSeconds`` (how long the most overdue row had been due when that sweep found it) and
  ``DueFound``.
- ``member-<instance>``: ``Until``, renewed with the instance's leases, so each instance knows
  how many share the work and takes its fair share.

One query reads the whole roster and one batch changes it (all rows share a partition), so a
claim is all or nothing: a lost race writes nothing. Leases are an optimisation, not what keeps
orders correct: every change to an order is ETag-conditional, so two instances sweeping one
bucket at once never both recover an order.

The rows' model, the recovery bound and the lag are pure and live in :mod:`adapters.store.roster`;
the
roster in memory is :class:`devstack.memory.MemorySupervision`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableTransactionError, UpdateMode

from adapters.store.roster import (
    PARTITION,
    BucketLease,
    Member,
    Roster,
    Sweep,
    bucket_row_key,
    member_row_key,
    roster_from_entities,
    swept_lease,
)
from adapters.store.roster import (
    Lag as Lag,  # re-exported: adapters.store.supervision.lag etc. keep working
)
from adapters.store.roster import RecoveryBound as RecoveryBound
from adapters.store.roster import lag as lag
from adapters.store.roster import recovery_bound as recovery_bound
from adapters.store.rows import ConcurrencyConflict, utc
from adapters.tables import Table


def _lease_entity(lease: BucketLease) -> dict[str, Any]:
    entity: dict[str, Any] = {
        "PartitionKey": PARTITION,
        "RowKey": bucket_row_key(lease.bucket),
        "Holder": lease.holder,
        "SweptBy": lease.swept_by,
        "LagSeconds": float(lease.lag_s),
        "DueFound": int(lease.due_found),
    }
    for name, value in (
        ("LeasedUntil", lease.until),
        ("SweptAt", lease.swept_at),
    ):
        if value is not None:
            entity[name] = utc(value)
    return entity


class SupervisionTable:
    """The roster in Table Storage (see the module docstring)."""

    def __init__(self, table: Table) -> None:
        self._table = table

    async def read(self) -> Roster:
        entities = self._table.query_entities(
            "PartitionKey eq @pk", parameters={"pk": PARTITION}, results_per_page=1000
        )
        return roster_from_entities([entity async for entity in entities])

    async def claim(
        self,
        member: Member,
        hold: Sequence[BucketLease],
        release: Sequence[BucketLease],
        reap: Sequence[Member] = (),
    ) -> dict[int, str]:
        """Renew ``member``, take or renew ``hold`` (their ``holder``/``until`` already set),
        give up ``release`` and delete ``reap``, all or nothing. Returns the held buckets' new
        ETags. Raises :class:`ConcurrencyConflict` if any row changed since it was read."""
        operations: list[tuple[Any, ...]] = [
            (
                "upsert",
                {
                    "PartitionKey": PARTITION,
                    "RowKey": member_row_key(member.instance),
                    "Until": utc(member.until),
                },
                {"mode": UpdateMode.REPLACE},
            )
        ]
        changed = [*hold, *release]
        for lease in changed:
            operations.append(_write(lease))
        for gone in reap:
            operations.append(
                (
                    "delete",
                    {"PartitionKey": PARTITION, "RowKey": member_row_key(gone.instance)},
                    {"etag": gone.etag, "match_condition": MatchConditions.IfNotModified},
                )
            )
        try:
            results = await self._table.submit_transaction(operations)  # type: ignore[arg-type]
        except TableTransactionError as exc:
            raise ConcurrencyConflict("supervisor roster", str(exc.message)) from exc
        etags = [str(r.get("etag")) for r in results[1 : 1 + len(changed)]]
        return {lease.bucket: etag for lease, etag in zip(changed, etags, strict=True)}

    async def checkpoint(
        self, sweeps: Sequence[Sweep], by: str, *, others: Sequence[BucketLease] = ()
    ) -> int:
        """Record finished sweeps, and write ``others`` as they are (leases extended or given
        up), each on condition of the ETag from the claim (a bucket taken over meanwhile keeps
        its new holder's record). One batch; if a lease changed, the rows one by one. Returns
        how many rows were written."""
        rows = [swept_lease(sweep, by) for sweep in sweeps] + list(others)
        if not rows:
            return 0
        try:
            await self._table.submit_transaction([_write(lease) for lease in rows])
            return len(rows)
        except TableTransactionError:
            # A bucket was taken over since the claim: record the others one by one.
            return sum([await self._write_unless_changed(lease) for lease in rows])

    async def _write_unless_changed(self, lease: BucketLease) -> bool:
        try:
            await self._table.update_entity(
                _lease_entity(lease),
                mode=UpdateMode.REPLACE,
                etag=lease.etag,
                match_condition=MatchConditions.IfNotModified,
            )
        except (ResourceModifiedError, ResourceNotFoundError):
            return False
        return True


def _write(lease: BucketLease) -> tuple[Any, ...]:
    """A batch operation writing ``lease`` over the row version it was read at (its ETag;
    None: a new row)."""
    if lease.etag is None:
        return ("create", _lease_entity(lease))
    return (
        "update",
        _lease_entity(lease),
        {
            "mode": UpdateMode.REPLACE,
            "etag": lease.etag,
            "match_condition": MatchConditions.IfNotModified,
        },
    )
