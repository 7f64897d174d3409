"""The operator API's OpenAPI document, as FastAPI generates it, is the contract the hand-written
one stated (docs/operator-openapi.json, committed before the move to FastAPI): the same paths,
methods, operationIds, parameters, status codes, descriptions and schemas.

The differences meant are listed below, each a normalization applied to the generated document
before the comparison, with why it is harmless; any other difference fails.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from devstack.stack.processes import REPO_ROOT

COMMITTED = REPO_ROOT / "docs" / "operator-openapi.json"
KEYS = [{"functionKeyHeader": []}, {"functionKeyQuery": []}]


def operations(document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for item in document["paths"].values():
        yield from item.values()


def parameter_schemas(document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for operation in operations(document):
        for parameter in operation.get("parameters", ()):
            yield parameter["schema"]


def untitled_parameters(document: dict[str, Any]) -> None:
    """FastAPI titles each parameter's schema and repeats its description there; the
    parameter's own name and description are unchanged."""
    for schema in parameter_schemas(document):
        schema.pop("title", None)
        schema.pop("description", None)


def optional_parameters_plain(document: dict[str, Any]) -> None:
    """FastAPI writes an optional query parameter as ``anyOf: [<type>, null]``: a query
    parameter is absent rather than null, so the type is the same."""
    for schema in parameter_schemas(document):
        options = [o for o in schema.pop("anyOf", ()) if o != {"type": "null"}]
        if options:
            (only,) = options
            schema.update(only)


def security_at_the_top(document: dict[str, Any]) -> None:
    """FastAPI states the function key on every operation instead of once for the document:
    the same requirement (a key in the header or the query) for every route."""
    for operation in operations(document):
        assert operation.pop("security") == KEYS
    document["security"] = KEYS


def openapi_answer_untyped(document: dict[str, Any]) -> None:
    """GET /openapi.json answers JSON of no declared shape: FastAPI says ``schema: {}``."""
    content = document["paths"]["/openapi.json"]["get"]["responses"]["200"]["content"]
    assert content["application/json"].pop("schema") == {}


def null_defaults_written(document: dict[str, Any]) -> None:
    """FastAPI's schema generator leaves out a property's ``default: null`` (a default is an
    annotation in JSON Schema; an absent optional field is still null)."""
    committed = json.loads(COMMITTED.read_text(encoding="utf-8"))["components"]["schemas"]
    for name, schema in document["components"]["schemas"].items():
        for field, described in schema.get("properties", {}).items():
            was = committed.get(name, {}).get("properties", {}).get(field, {})
            if was.get("default", "") is None and "default" not in described:
                described["default"] = None


INTENDED: list[Callable[[dict[str, Any]], None]] = [
    untitled_parameters,
    optional_parameters_plain,
    security_at_the_top,
    openapi_answer_untyped,
    null_defaults_written,
]


@pytest.fixture(scope="module")
def generated() -> dict[str, Any]:
    from operator_api.app import build
    from service.operations.composition import OperationsRoot

    return build(OperationsRoot()).openapi()


def normalized(document: dict[str, Any]) -> dict[str, Any]:
    made = copy.deepcopy(document)
    for normalize in INTENDED:
        normalize(made)
    return made


def differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ, as JSON pointers (lists compared in order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            found
            for key in sorted(set(a) | set(b))
            for found in (
                [f"{where}/{key}: only in the {'generated' if key in b else 'committed'} one"]
                if (key in a) != (key in b)
                else differences(a[key], b[key], f"{where}/{key}")
            )
        ]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            found
            for i, pair in enumerate(zip(a, b, strict=True))
            for found in differences(*pair, f"{where}/{i}")
        ]
    return [] if a == b else [f"{where}: {json.dumps(a)[:80]} != {json.dumps(b)[:80]}"]


def test_the_generated_document_is_the_committed_contract(generated):
    committed = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert differences(committed, normalized(generated)) == []


def test_each_intended_difference_is_one_that_exists(generated):
    """A normalization that changes nothing would hide nothing; drop it instead."""
    for normalize in INTENDED:
        changed = copy.deepcopy(generated)
        normalize(changed)
        assert changed != generated, f"{normalize.__name__} has nothing left to normalize"


def test_a_changed_route_is_a_difference(generated):
    """The comparison sees what a real change would be: an operation renamed, a status gone."""
    changed = copy.deepcopy(generated)
    changed["paths"]["/orders"]["get"]["operationId"] = "listEverything"
    del changed["paths"]["/health"]["get"]["responses"]["503"]
    committed = json.loads(COMMITTED.read_text(encoding="utf-8"))
    found = differences(committed, normalized(changed))
    assert len(found) == 2 and "operationId" in found[0] + found[1]


def test_the_document_served_is_the_generated_one(generated):
    """GET /api/openapi.json answers FastAPI's document (no 422: invalid input is a 400)."""
    assert not any("422" in op["responses"] for op in operations(generated))
    assert "HTTPValidationError" not in generated["components"]["schemas"]
    assert generated["servers"] == [{"url": "/api"}]
