"""core.tablestorage without a server: the OData codec, filters, keys, transactions' text,
Shared Key, tokens, retries and errors (httpx.MockTransport stands in for the service)."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
)
from azure.data.tables import EdmType, EntityProperty, TableTransactionError
from hypothesis import given
from hypothesis import strategies as st

from core.tablestorage import Sent, TableService, batch, client, odata
from core.tablestorage.auth import BearerToken, SharedKey, parse_connection_string

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
    import hashlib
    import hmac

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


def test_a_token_is_reused_until_five_minutes_before_it_expires(monkeypatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("core.tablestorage.auth.time.time", lambda: now[0])
    issued: list[str] = []

    class Credential:
        def get_token(self, scope: str) -> Any:
            assert scope == "https://storage.azure.com/.default"
            issued.append(f"t{len(issued)}")
            return SimpleNamespace(token=issued[-1], expires_on=now[0] + 3600)

    bearer = BearerToken(Credential())
    assert bearer.authorization("GET", "/x", {}) == "Bearer t0"
    now[0] += 3600 - 301
    assert bearer.authorization("GET", "/x", {}) == "Bearer t0"
    now[0] += 2
    assert bearer.authorization("GET", "/x", {}) == "Bearer t1"


# ------------------------------------------------------------------ retries and errors


def service(answers: list[Any], seen: list[Sent] | None = None) -> TableService:
    """A service whose transport answers from ``answers`` in turn (a response or an error)."""

    def handler(request: httpx.Request) -> httpx.Response:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    hook = seen.append if seen is not None else None
    return TableService.from_connection_string(
        CS, request_hook=hook, transport=httpx.MockTransport(handler)
    )


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch) -> None:
    monkeypatch.setattr(client.time, "sleep", lambda _: None)


def error(status: int, code: str) -> httpx.Response:
    body = {"odata.error": {"code": code, "message": {"value": f"0:{code} happened"}}}
    return httpx.Response(status, json=body)


def test_transient_failures_are_retried_and_each_attempt_is_counted() -> None:
    seen: list[Sent] = []
    answers = [
        httpx.ConnectError("refused"),
        httpx.Response(503),
        httpx.Response(200, json={"PartitionKey": "p", "RowKey": "r", "odata.etag": "e"}),
    ]
    row = service(answers, seen).get_table_client("t").get_entity("p", "r")
    assert row.metadata["etag"] == "e"
    assert [s.method for s in seen] == ["GET", "GET", "GET"]


def test_retries_end() -> None:
    with pytest.raises(ServiceRequestError, match="refused"):
        service([httpx.ConnectError("refused")] * 4).get_table_client("t").get_entity("p", "r")
    with pytest.raises(HttpResponseError) as raised:
        service([httpx.Response(503)] * 4).get_table_client("t").get_entity("p", "r")
    assert raised.value.status_code == 503


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (401, "AuthenticationFailed", ClientAuthenticationError),
        (404, "ResourceNotFound", ResourceNotFoundError),
        (409, "EntityAlreadyExists", ResourceExistsError),
        (412, "UpdateConditionNotSatisfied", ResourceModifiedError),
        (400, "InvalidInput", HttpResponseError),
    ],
)
def test_errors_have_the_sdks_types_and_codes(status: int, code: str, kind: type) -> None:
    table = service([error(status, code)]).get_table_client("t")
    with pytest.raises(kind) as raised:
        table.create_entity({"PartitionKey": "p", "RowKey": "r"})
    assert raised.value.status_code == status and raised.value.error_code == code
    assert code in str(raised.value)


def test_a_failed_transaction_names_its_operation() -> None:
    failed = (
        "--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_1\r\n\r\n"
        "--changesetresponse_1\r\nContent-Type: application/http\r\n\r\n"
        "HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\n\r\n"
        '{"odata.error":{"code":"EntityAlreadyExists","message":{"value":"1:exists"}}}\r\n'
        "--changesetresponse_1--\r\n--batchresponse_1--\r\n"
    )
    table = service([httpx.Response(202, text=failed)]).get_table_client("t")
    with pytest.raises(TableTransactionError) as raised:
        table.submit_transaction(
            [
                ("create", {"PartitionKey": "p", "RowKey": "a"}),
                ("create", {"PartitionKey": "p", "RowKey": "b"}),
            ]
        )
    assert (raised.value.status_code, raised.value.error_code, raised.value.index) == (
        409,
        "EntityAlreadyExists",
        1,
    )


def test_a_transaction_the_service_would_refuse_is_refused_before_any_request() -> None:
    seen: list[Sent] = []
    table = service([], seen).get_table_client("t")
    with pytest.raises(ValueError, match="share a PartitionKey"):
        table.submit_transaction(
            [
                ("create", {"PartitionKey": "a", "RowKey": "r"}),
                ("create", {"PartitionKey": "b", "RowKey": "r"}),
            ]
        )
    with pytest.raises(ValueError, match="at most 100"):
        table.submit_transaction(
            [("create", {"PartitionKey": "a", "RowKey": str(i)}) for i in range(101)]
        )
    with pytest.raises(ValueError, match="unknown transaction operation 'merge'"):
        table.submit_transaction([("merge", {"PartitionKey": "a", "RowKey": "r"})])
    assert seen == []


def test_deleting_a_row_already_gone_is_not_an_error() -> None:
    service([error(404, "ResourceNotFound")]).get_table_client("t").delete_entity("p", "r")


def test_timestamps_round_trip_through_filters_and_rows() -> None:
    later = T + timedelta(days=1)
    assert odata.decode(json.loads(json.dumps(odata.encode({"D": later}))))["D"] == later
