"""A local stack with ``storage_faults``: the hosts' storage settings name the proxy, which
forwards signed Table requests to the real Azurite; every other client keeps Azurite itself; a
restarted proxy comes back at its address."""

from __future__ import annotations

import json

import pytest
from azure.data.tables import TableServiceClient

from devstack.faults.storage_proxy import FaultRates
from devstack.stack.local_stack import STORAGE_PROXY, STORAGE_PROXY_STATS, LocalStack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400), pytest.mark.anyio]


async def test_the_hosts_reach_azurite_through_the_proxy_which_restarts_at_its_address(tmp_path):
    stack = LocalStack(tmp_path, hosts=0, storage_faults=FaultRates())
    info = await stack.start()
    try:
        hosts = json.loads((tmp_path / "local.settings.json").read_text())["Values"]
        proxied = hosts["StateStorage"]
        assert hosts["AzureWebJobsStorage"] == proxied != info.settings["StateStorage"]
        assert STORAGE_PROXY in stack.components()
        entity = {"PartitionKey": "p", "RowKey": "r", "Note": "through the proxy"}
        with TableServiceClient.from_connection_string(proxied) as through_proxy:
            through_proxy.get_table_client(hosts["ORDERS_TABLE"]).create_entity(entity)
        with TableServiceClient.from_connection_string(info.settings["StateStorage"]) as direct:
            stored = direct.get_table_client(hosts["ORDERS_TABLE"]).get_entity("p", "r")
        assert stored["Note"] == "through the proxy", "signed by the client, verified by Azurite"

        await stack.restart(STORAGE_PROXY)
        with TableServiceClient.from_connection_string(proxied) as through_proxy:
            again = through_proxy.get_table_client(hosts["ORDERS_TABLE"]).get_entity("p", "r")
        assert again["Note"] == "through the proxy"
    finally:
        stack.stop()
    proxy_stats = json.loads((tmp_path / STORAGE_PROXY_STATS).read_text())
    assert (proxy_stats["requests"], proxy_stats["faults"]) == (1, {}), "the restarted one's"
