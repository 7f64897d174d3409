"""The azd predeploy check: refuse to deploy code that drops a workflow version orders need.

    python -m infra.predeploy

Run by `azd deploy` (azure.yaml, ``hooks.predeploy``) from the checkout about to be deployed:
it compares the workflow versions that checkout carries (:data:`domain.workflows.WORKFLOWS`) with
the versions of the orders in flight and in Error in the deployed storage account
(:func:`service.versions.versions_in_use`), prints the verdict, and exits 1 if the package would
drop a version still needed. It reads the account named by azd's environment
(``AZURE_STORAGE_TABLE_ENDPOINT``, ``ORDERS_TABLE``, ``ACTIVE_ORDERS_TABLE``) with the deployer's
Entra identity (``DefaultAzureCredential``: the Bicep grants the deploying principal Storage
Table Data Reader on those two tables), or a connection string in ``StateStorage``.

Exit codes: 0 deployable (or no tables yet: a first deploy), 1 refused, 2 the orders could not be
read (the message says why; ``SKIP_WORKFLOW_CHECK=1`` deploys anyway, on the operator's word).
Locally, ``orderctl workflows --check`` makes the same check against the running stack.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping

from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

from adapters.store.records import OrderRecords
from adapters.tables import TableService
from domain.workflows import WORKFLOWS
from service.versions import VersionUse, check, versions_in_use


def table_service(env: Mapping[str, str]) -> TableService:
    if env.get("StateStorage"):
        return TableService.from_connection_string(env["StateStorage"])
    endpoint = env.get("AZURE_STORAGE_TABLE_ENDPOINT", "")
    if not endpoint:
        raise LookupError(
            "AZURE_STORAGE_TABLE_ENDPOINT is not set: run this from azd (azure.yaml's predeploy "
            "hook passes the environment's outputs) or export it (`azd env get-values`)"
        )
    from azure.identity import DefaultAzureCredential

    return TableService(endpoint, DefaultAzureCredential())


async def versions_needed(env: Mapping[str, str]) -> dict[str, VersionUse]:
    """The workflow versions of the orders in flight and in Error in the deployed account."""
    store = OrderRecords(
        table_service(env),
        orders_table=env.get("ORDERS_TABLE", "orders"),
        active_table=env.get("ACTIVE_ORDERS_TABLE", "activeorders"),
        owns_service=True,
    )
    async with store:
        return await versions_in_use(store)


def main(env: Mapping[str, str] = os.environ) -> int:
    if env.get("SKIP_WORKFLOW_CHECK") == "1":
        print("workflow check skipped (SKIP_WORKFLOW_CHECK=1)")
        return 0
    try:
        in_use = asyncio.run(versions_needed(env))
    except LookupError as error:
        print(f"workflow check: {error}", file=sys.stderr)
        return 2
    except ClientAuthenticationError as error:
        print(f"workflow check: cannot sign in to read the orders ({error})", file=sys.stderr)
        return 2
    except HttpResponseError as error:
        if error.status_code == 404:  # no tables yet: a first deploy has no orders to keep
            print("workflow check: no orders yet; deployable")
            return 0
        print(
            f"workflow check: cannot read the orders ({error.status_code}: {error.reason}). "
            "The deploying principal needs Storage Table Data Reader on the orders and "
            "active-order tables (set AZURE_PRINCIPAL_ID and run `azd provision`); with "
            "VNET_ENABLED the storage account also refuses any network but its private "
            "endpoints: deploy from inside the virtual network (docs/deploy.md, Private "
            "network). Or set SKIP_WORKFLOW_CHECK=1 to deploy without the check.",
            file=sys.stderr,
        )
        return 2
    ok, verdict = check(in_use, WORKFLOWS)
    print(f"workflow check: {verdict}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
