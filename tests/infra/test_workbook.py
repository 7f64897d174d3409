"""Reading the workbook (tests/infra/workbook.py): the KQL lexer and the document checks, in
memory. test_infra.py holds the real workbook against the code; these show that the reading
finds what it must and reports what is wrong."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.infra import checks, workbook
from tests.infra.workbook import read_kql

WORKBOOK_JSON = checks.REPO_ROOT / "infra" / "app" / "workbook.json"

# ------------------------------------------------------------------------------ tables


@pytest.mark.parametrize(
    ("query", "tables"),
    [
        ("customMetrics | where name == 'x'", {"customMetrics"}),
        ("requests", {"requests"}),
        ("  // a comment naming pageViews\nrequests | take 1", {"requests"}),
        ("let t = traces; t | take 1", {"traces"}),
        ("let n = toscalar(requests | count); exceptions | take n", {"requests", "exceptions"}),
        ("union requests, exceptions | count", {"requests", "exceptions"}),
        ("union withsource=T isfuzzy=true traces, (exceptions | take 1)", {"traces", "exceptions"}),
        (
            "requests | join kind=inner (exceptions | take 1) on operation_Id",
            {"requests", "exceptions"},
        ),
        ("requests | join hint.strategy=shuffle traces on operation_Id", {"requests", "traces"}),
        ("requests | lookup kind=leftouter customEvents on name", {"requests", "customEvents"}),
        ("requests | summarize max(duration) by bin(timestamp, {TimeRange:grain})", {"requests"}),
        ("requests | where url has 'https://example.com//x' | take 1", {"requests"}),
        ("requests | extend customMetrics = 1 | project customMetrics", {"requests"}),
    ],
)
def test_tables_are_found_at_pipeline_heads(query, tables):
    assert read_kql(query).sources == tables


def test_let_names_are_not_tables():
    kql = read_kql("let recent = requests | where timestamp > ago(1h);\nrecent | count")
    assert kql.let_names == {"recent"}
    assert kql.sources == {"requests"}


def test_a_misspelled_table_is_read_as_written():
    assert read_kql("request | count").sources == {"request"}
    assert read_kql("union requests, exception").sources == {"requests", "exception"}


# ----------------------------------------------------------------------------- metrics

METRIC = st.from_regex(r"[a-z]{1,8}(\.[a-z_]{1,8}){0,3}", fullmatch=True)


@given(st.sets(METRIC, min_size=1, max_size=6), st.sampled_from(['"', "'"]), st.booleans())
def test_metric_names_kept_with_in_are_read(names, quote, tilde):
    listed = ", ".join(f"{quote}{n}{quote}" for n in sorted(names))
    query = f"customMetrics\n| where name in{'~' if tilde else ''} ({listed})\n| count"
    assert read_kql(query).metrics == names


@given(METRIC, st.sampled_from(["==", "=~"]))
def test_a_metric_name_kept_with_equals_is_read(name, operator):
    query = f'customMetrics | where name {operator} "{name}" | summarize max(value)'
    assert read_kql(query).metrics == {name}


def test_names_elsewhere_are_not_metrics():
    kql = read_kql(
        'customMetrics | where name == "a.b" | extend s = tostring(customDimensions.name) '
        '| where customDimensions.name == "not.a.metric" | where cloud_RoleName == "x.y"'
    )
    assert kql.metrics == {"a.b"}


@pytest.mark.parametrize("operator", ["startswith", "has", "contains", "matches", "has_any"])
def test_fuzzy_name_filters_are_noticed(operator):
    kql = read_kql(f'customMetrics | where name {operator} "orders."')
    assert kql.fuzzy_name_filters == (operator,)
    assert kql.metrics == frozenset()


def test_placeholders_are_read_with_their_format():
    kql = read_kql(
        "requests | make-series n = count() on timestamp from {TimeRange:start} to "
        "{TimeRange:end} step {TimeRange:grain} | where x == {Other}"
    )
    assert kql.placeholders == {
        ("TimeRange", "start"),
        ("TimeRange", "end"),
        ("TimeRange", "grain"),
        ("Other", None),
    }


def test_dimensions_are_read_by_member_or_by_index():
    kql = read_kql(
        'customMetrics | extend a = tostring(customDimensions.step), b = customDimensions["cause"]'
        " | where tostring(customDimensions['agent']) != '' | project customDimensions"
    )
    assert kql.dimensions == {"step", "cause", "agent"}


# ---------------------------------------------------------------------------- document

DEFINED = frozenset({"orders.started", "step.duration"})


def chart(name: str, query: str, **content: Any) -> dict[str, Any]:
    return {
        "type": 3,
        "name": name,
        "content": {
            "version": "KqlItem/1.0",
            "query": query,
            "title": name,
            "timeContextFromParameter": "TimeRange",
            "queryType": 0,
            "resourceType": "microsoft.insights/components",
            "visualization": "timechart",
            **content,
        },
    }


def document(*charts: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": "Notebook/1.0",
        "items": [
            {
                "type": 9,
                "name": "parameters",
                "content": {"parameters": [{"name": "TimeRange", "type": 4}]},
            },
            *charts,
        ],
    }


GOOD = document(
    chart("orders", 'customMetrics | where name == "orders.started" | summarize sum(value)'),
    chart(
        "steps",
        'customMetrics | where name == "step.duration" '
        "| summarize max(valueMax) by bin(timestamp, {TimeRange:grain})",
    ),
    chart("calls", "requests | summarize count() by name"),
)


def test_a_good_document_has_no_problem():
    assert workbook.problems(GOOD, DEFINED, "wb.json") == []


def test_a_chart_reads_only_the_attributes_its_metrics_are_recorded_with():
    attributes = {"orders.started": frozenset({"workflow"}), "step.duration": frozenset()}
    by_workflow = document(
        chart(
            "orders",
            'customMetrics | where name == "orders.started" '
            "| summarize sum(value) by tostring(customDimensions.workflow)",
        ),
        chart("steps", 'customMetrics | where name == "step.duration" | summarize max(valueMax)'),
    )
    assert workbook.problems(by_workflow, DEFINED, "wb.json", attributes) == []
    by_reason = copy.deepcopy(by_workflow)
    by_reason["items"][1]["content"]["query"] = by_reason["items"][1]["content"]["query"].replace(
        "customDimensions.workflow", "customDimensions.reason"
    )
    assert workbook.problems(by_reason, DEFINED, "wb.json", attributes) == [
        "wb.json: chart 'orders': reads customDimensions.reason, but 'orders.started' is "
        "recorded with ['workflow'] (adapters.metrics.ATTRIBUTES, service.sweep_report.ATTRIBUTES)"
    ]


def test_charts_inside_groups_count():
    grouped = document(
        {
            "type": 12,
            "name": "group",
            "content": {"version": "NotebookGroup/1.0", "items": GOOD["items"][1:]},
        }
    )
    assert [c.name for c in workbook.charts(grouped)] == ["orders", "steps", "calls"]
    assert workbook.problems(grouped, DEFINED, "wb.json") == []


def broken(edit) -> list[str]:
    doc = copy.deepcopy(GOOD)
    edit(doc)
    return workbook.problems(doc, DEFINED, "wb.json")


def content(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(i for i in workbook.items(doc) if i.get("name") == name)["content"]


@pytest.mark.parametrize(
    ("edit", "expect"),
    [
        (lambda d: d.update(version="Notebook/2.0"), "version is 'Notebook/2.0'"),
        (lambda d: d["items"].append(d["items"][1]), "more than one item is named 'orders'"),
        (
            lambda d: content(d, "orders").update(
                query='customMetrics | where name == "orders.start"'
            ),
            "queries metric 'orders.start', which the code does not define",
        ),
        (
            lambda d: content(d, "orders").update(query="requests | count"),
            "metric 'orders.started' is defined by the code but no chart queries it",
        ),
        (
            lambda d: content(d, "calls").update(query="request | count"),
            "reads 'request', which is not an Application Insights table",
        ),
        (
            lambda d: content(d, "calls").update(query="print 1"),
            "reads no table the check can see",
        ),
        (
            lambda d: content(d, "orders").update(query="customMetrics | summarize sum(value)"),
            "reads customMetrics without naming its metrics",
        ),
        (
            lambda d: content(d, "orders").update(
                query='customMetrics | where name startswith "orders."'
            ),
            "compares name with startswith",
        ),
        (
            lambda d: content(d, "steps").update(
                query=content(d, "steps")["query"].replace("TimeRange:grain", "Range:grain")
            ),
            "uses {Range}, which no parameter declares",
        ),
        (
            lambda d: content(d, "steps").update(
                query=content(d, "steps")["query"].replace("TimeRange:grain", "TimeRange:bin")
            ),
            "{TimeRange:bin} is not a time range format",
        ),
        (
            lambda d: content(d, "calls").update(timeContextFromParameter="Range"),
            "timeContextFromParameter is 'Range'",
        ),
        (lambda d: content(d, "calls").update(queryType=1), "queryType is 1, must be 0"),
        (
            lambda d: content(d, "calls").update(
                resourceType="microsoft.operationalinsights/workspaces"
            ),
            "resourceType is 'microsoft.operationalinsights/workspaces'",
        ),
        (
            lambda d: content(d, "calls").update(crossComponentResources=["/subscriptions/x"]),
            "crossComponentResources sends the query elsewhere",
        ),
        (lambda d: content(d, "calls").update(visualization="3d"), "visualization '3d'"),
        (lambda d: content(d, "calls").update(title=""), "chart 'calls': has no title"),
        (lambda d: content(d, "calls").update(query=""), "chart 'calls': has no query"),
        (lambda d: d.update(items=d["items"][:1]), "no query item"),
    ],
)
def test_a_broken_document_is_reported(edit, expect):
    problems = broken(edit)
    assert any(expect in p for p in problems), problems


def test_no_defined_metric_is_a_problem_not_a_pass():
    problems = workbook.problems(GOOD, frozenset(), "wb.json")
    assert any("the code defines no metric" in p for p in problems), problems


def test_not_an_object():
    assert workbook.problems([], DEFINED, "wb.json") == ["wb.json: not a JSON object"]


def test_the_real_workbook_reads_the_four_tables():
    charts = workbook.charts(json.loads(WORKBOOK_JSON.read_text()))
    assert set().union(*(c.kql.sources for c in charts)) == {
        "customMetrics",
        "requests",
        "exceptions",
        "traces",
    }
