"""What the app speaks to the outside through, on well-kept clients: the Table client on
azure-core's pipeline (:mod:`adapters.tables`), the agents' HTTP to their remote services
(:mod:`adapters.remote_http`) and the async token credentials every client authenticates with
in Azure (:mod:`adapters.credentials`).

Async only. The project owns no socket-level HTTP code: aiohttp and azure-core carry every
request. Nothing here imports devstack.
"""
