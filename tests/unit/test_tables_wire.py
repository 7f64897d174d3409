"""The Table client's wire format without a server (adapters.tables: odata, batch, auth): the
OData codec, filters, keys, transactions' text, Shared Key and connection strings. What the
client sends and how it reads the answers: tests/unit/test_tables_adapter.py."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.data.tables import EdmType, EntityProperty
from hypothesis import given
from hypothesis import strategies as st

from adapters.tables import batch, odata
from adapters.tables.auth import SharedKey, parse_connection_string

KEY = base64.b64encode(b"k" * 32).decode()
CS = f"AccountName=acct;AccountKey={KEY};TableEndpoint=http://h:1/acct"
T = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


# ------------------------------------------------------------------------------ codec


def test_types_are_written_as_the_sdk_writes_them() -> None:
    body = odata.encode(
        {
            "PartitionKey": "p",
            "S": "text",
            "I": 7,
            "Big": 2**40,
            "I64": EntityProperty(3, EdmType.INT64),
            "F": 1.0,
            "B": True,
            "D": T,
            "G": uuid.UUID(int=1),
            "Bin": b"\x00\xff",
            "Gone": None,
        }
    )
    assert body == {
        "PartitionKey": "p",
        "S": "text",
        "I": 7,
        "Big": str(2**40),
        "Big@odata.type": "Edm.Int64",
        "I64": "3",
        "I64@odata.type": "Edm.Int64",
        "F": 1.0,
        "F@odata.type": "Edm.Double",
        "B": True,
        "D": "2026-03-01T12:00:00.123456Z",
        "D@odata.type": "Edm.DateTime",
        "G": "00000000-0000-0000-0000-000000000001",
        "G@odata.type": "Edm.Guid",
        "Bin": "AP8=",
        "Bin@odata.type": "Edm.Binary",
    }


def test_an_unsupported_type_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="cannot hold a list"):
        odata.encode({"L": [1]})


values = st.one_of(
    st.text(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.datetimes(min_value=datetime(1601, 1, 1), timezones=st.just(UTC)),
    st.binary(max_size=64),
    st.uuids(),
)


@given(values)
def test_what_is_written_reads_back_the_same(value: Any) -> None:
    wire = json.loads(json.dumps(odata.encode({"V": value})))
    read = odata.decode(wire)["V"]
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value not in range(-(2**31), 2**31)
    ):
        assert read == EntityProperty(value, EdmType.INT64)
    else:
        assert read == value


def test_metadata_holds_the_etag_and_timestamp() -> None:
    row = odata.decode(
        {
            "odata.etag": 'W/"x"',
            "PartitionKey": "p",
            "RowKey": "r",
            "Timestamp": "2026-03-01T12:00:00.1234567Z",
            "Timestamp@odata.type": "Edm.DateTime",
        }
    )
    assert dict(row) == {"PartitionKey": "p", "RowKey": "r"}
    assert row.metadata == {"etag": 'W/"x"', "timestamp": T}


def test_seven_fractional_digits_keep_six() -> None:
    assert odata.parse_datetime("2026-03-01T12:00:00.1234567Z") == T
    assert odata.parse_datetime("2026-03-01T12:00:00Z") == T.replace(microsecond=0)


def test_timestamps_round_trip_through_filters_and_rows() -> None:
    later = T + timedelta(days=1)
    assert odata.decode(json.loads(json.dumps(odata.encode({"D": later}))))["D"] == later


# ----------------------------------------------------------------------- keys, filters


def test_keys_are_quoted_and_encoded() -> None:
    path = odata.entity_path("orders", "o'1 %", "r/x")
    assert path == "orders(PartitionKey='o%27%271%20%25',RowKey='r%2Fx')"


def test_filter_parameters_become_literals() -> None:
    text = odata.substitute(
        "PartitionKey eq @pk and N ge @n and Big lt @big and At lt @at and B eq @b",
        {"pk": "x' or PartitionKey ne '", "n": 3, "big": 2**40, "at": T, "b": False},
    )
    assert text == (
        "PartitionKey eq 'x'' or PartitionKey ne ''' and N ge 3 and Big lt 1099511627776L "
        "and At lt datetime'2026-03-01T12:00:00.123456Z' and B eq false"
    )


@given(st.text())
def test_a_string_parameter_never_leaves_its_quotes(value: str) -> None:
    literal = odata.substitute("RowKey eq @v", {"v": value})[len("RowKey eq ") :]
    assert literal.startswith("'") and literal.endswith("'")
    assert literal[1:-1].replace("''", "").count("'") == 0
    assert literal[1:-1].replace("''", "'") == value


def test_a_missing_parameter_is_named() -> None:
    with pytest.raises(KeyError, match="@pk"):
        odata.substitute("PartitionKey eq @pk", {})


# ------------------------------------------------------------------------ transactions


def test_a_transaction_is_one_changeset_in_order() -> None:
    boundary, body = batch.build(
        [
            batch.Operation("PUT", "http://h/t(PartitionKey='p',RowKey='a')", {"X": 1}, 'W/"1"'),
            batch.Operation("DELETE", "http://h/t(PartitionKey='p',RowKey='b')", None, "*"),
        ]
    )
    text = body.decode()
    assert text.startswith(f"--{boundary}\r\nContent-Type: multipart/mixed; boundary=changeset_")
    assert text.index("PUT http://h/t(") < text.index("DELETE http://h/t(")
    assert 'If-Match: W/"1"' in text and "If-Match: *" in text
    assert text.rstrip().endswith(f"--{boundary}--")


ANSWER = (
    "--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_1\r\n\r\n"
    "--changesetresponse_1\r\nContent-Type: application/http\r\n"
    "Content-Transfer-Encoding: binary\r\n\r\n"
    'HTTP/1.1 204 No Content\r\nETag: W/"a"\r\n\r\n\r\n'
    "--changesetresponse_1\r\nContent-Type: application/http\r\n"
    "Content-Transfer-Encoding: binary\r\n\r\n"
    'HTTP/1.1 201 Created\r\nETag: W/"b"\r\nContent-Type: application/json\r\n\r\n{"x":1}\r\n'
    "--changesetresponse_1--\r\n--batchresponse_1--\r\n"
)


def test_a_transactions_answers_are_read_in_order() -> None:
    parts = batch.parse(ANSWER)
    assert [(p.status, p.headers["etag"]) for p in parts] == [(204, 'W/"a"'), (201, 'W/"b"')]
    assert parts[1].body == '{"x":1}'


# ------------------------------------------------------------------------------- auth


def test_shared_key_signs_verb_type_date_and_resource() -> None:
    key = SharedKey.of("acct", KEY)
    headers = {"x-ms-date": "Sun, 01 Mar 2026 12:00:00 GMT", "Content-Type": "application/json"}
    signed = key.authorization("POST", "/acct/orders?comp=x&y=1", headers)
    text = "POST\n\napplication/json\nSun, 01 Mar 2026 12:00:00 GMT\n/acct/acct/orders?comp=x"
    digest = hmac.new(b"k" * 32, text.encode(), hashlib.sha256).digest()
    assert signed == f"SharedKey acct:{base64.b64encode(digest).decode()}"


def test_connection_strings() -> None:
    parsed = parse_connection_string(CS)
    assert parsed.endpoint == "http://h:1/acct" and parsed.auth.account == "acct"
    cloud = parse_connection_string(
        f"DefaultEndpointsProtocol=https;AccountName=a;AccountKey={KEY}"
    )
    assert cloud.endpoint == "https://a.table.core.windows.net"
    dev = parse_connection_string("UseDevelopmentStorage=true")
    assert dev.endpoint == "http://127.0.0.1:10002/devstoreaccount1"
    with pytest.raises(ValueError, match="lacks AccountName and AccountKey"):
        parse_connection_string("TableEndpoint=http://h")
    with pytest.raises(ValueError, match="not base64"):
        parse_connection_string("AccountName=a;AccountKey=%%%")
