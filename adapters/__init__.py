"""What the app speaks to the outside through, on well-kept clients: the Table client on
azure-core's pipeline (:mod:`adapters.tables`), the agents' HTTP to their remote services
(:mod:`adapters.remote_http`) and the async token credentials they authenticate with
(:mod:`adapters.credentials`).

Async only, and built beside the code that runs today (core.tablestorage, core.http11, the
agents' httpx transport): the restructuring into domain/, service/ and adapters/ moves the app
onto these, after which the project owns no socket-level HTTP code. Nothing here imports
devstack.
"""
