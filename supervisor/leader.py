"""One Supervisor at a time, through a blob lease.

Several Supervisor instances may tick at once (scale-out, a slow tick overlapping the next).
The leader holds a lease on one blob; the others skip the tick. This is an optimisation, not
what keeps the state correct: every change the Supervisor makes is ETag-conditional, so two
supervisors that both ran would still never both recover an order.
"""

from __future__ import annotations

import contextlib
import logging
import uuid

from azure.core.exceptions import HttpResponseError, ResourceExistsError
from azure.storage.blob import BlobLeaseClient, BlobServiceClient

log = logging.getLogger("supervisor.leader")

# The shortest lease Blob Storage grants: a leader that dies blocks the others this long at most.
LEASE_SECONDS = 15
LEADER_BLOB = "supervisor-leader"


class Leadership:
    def __init__(self, blobs: BlobServiceClient, container: str, holder: str) -> None:
        self._container = blobs.get_container_client(container)
        self._blob = self._container.get_blob_client(LEADER_BLOB)
        # A stable lease id per holder: acquiring again renews our own lease.
        self._lease = BlobLeaseClient(
            self._blob, lease_id=str(uuid.uuid5(uuid.NAMESPACE_URL, holder))
        )
        self._prepared = False

    def acquire(self) -> bool:
        """True if this instance holds the lease for the next LEASE_SECONDS."""
        self._prepare()
        try:
            self._lease.acquire(lease_duration=LEASE_SECONDS)
        except ResourceExistsError:
            return False
        except HttpResponseError as exc:
            if exc.status_code == 409:
                return False
            raise
        return True

    def _prepare(self) -> None:
        if self._prepared:
            return
        with contextlib.suppress(ResourceExistsError):
            self._container.create_container()
        try:
            self._blob.upload_blob(b"", overwrite=False)
        except ResourceExistsError:
            pass
        except HttpResponseError as exc:
            if exc.status_code != 412:  # leased by another instance: it exists
                raise
        self._prepared = True
