"""The operator HTTP API of the operations app: FastAPI routes over :mod:`service.operations`."""
