"""The operators' workbook (infra/app/workbook.json), read offline: its items, its parameters and
the KQL of its charts.

Pure: a parsed workbook document in, facts and problems out. ``tests/infra/checks.py`` reads the
Bicep that deploys the workbook and hands the document here with the metric names the code
defines; ``tests/infra/test_workbook.py`` tests the reading itself.

The KQL is read with a small lexer, not a parser: it finds the tables a query reads at the heads
of its pipelines (the start of a statement, ``let name =``, a parenthesised sub-query, the
arguments of ``union``, ``join`` and ``lookup``), and the metric names a ``customMetrics``
query keeps with ``name == "..."`` or ``name in ("...", ...)``. A query that names its metrics
any other way (``startswith``, ``has``, ...) is reported: the check could not tell which
metrics it charts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

NOTEBOOK_VERSION = "Notebook/1.0"
KQL_ITEM_VERSION = "KqlItem/1.0"
TEXT_ITEM, QUERY_ITEM, PARAMETERS_ITEM, GROUP_ITEM = 1, 3, 9, 12
LOGS_QUERY = 0
"""``queryType`` of a Logs (KQL) query."""
COMPONENT_RESOURCE_TYPE = "microsoft.insights/components"
TIME_RANGE_PARAMETER = 4
"""``type`` of a time range picker parameter."""
TIME_RANGE_FORMATS = frozenset({"start", "end", "grain", "label", "value", "query"})
VISUALIZATIONS = frozenset(
    {
        "table",
        "tiles",
        "timechart",
        "linechart",
        "areachart",
        "barchart",
        "categoricalbar",
        "unstackedbar",
        "piechart",
        "scatterchart",
    }
)
APP_INSIGHTS_TABLES = frozenset(
    {
        # The tables a query scoped to an Application Insights component reads.
        "availabilityResults",
        "browserTimings",
        "customEvents",
        "customMetrics",
        "dependencies",
        "exceptions",
        "pageViews",
        "performanceCounters",
        "requests",
        "traces",
    }
)
METRICS_TABLE = "customMetrics"
"""Where the app's OpenTelemetry metrics land, one row per metric and export interval."""

_FUZZY_OPERATORS = frozenset(
    {
        "has",
        "has_cs",
        "has_any",
        "has_all",
        "hasprefix",
        "hassuffix",
        "contains",
        "contains_cs",
        "startswith",
        "startswith_cs",
        "endswith",
        "endswith_cs",
        "matches",
    }
)

_LEXEME = re.compile(
    r"""
      (?P<comment>//[^\n]*)
    | (?P<string>@?"(?:[^"\\\n]|\\.)*"|@?'(?:[^'\\\n]|\\.)*')
    | (?P<placeholder>\{[A-Za-z_][A-Za-z0-9_]*(?::[A-Za-z]+)?\})
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<number>\d[\w.]*)
    | (?P<op>==|!=|=~|!~|<=|>=|.)
    """,
    re.VERBOSE | re.DOTALL,
)


@dataclass(frozen=True)
class Token:
    kind: str
    """ident, string, placeholder, number or op."""
    text: str


def tokens(query: str) -> list[Token]:
    """The KQL tokens of ``query``, comments and white space left out."""
    found = []
    for match in _LEXEME.finditer(query):
        kind = match.lastgroup or "op"
        if kind == "comment" or (kind == "op" and match.group().isspace()):
            continue
        found.append(Token(kind, match.group()))
    return found


def _string_value(token: Token) -> str:
    text = token.text.removeprefix("@")
    return text[1:-1]


@dataclass(frozen=True)
class Kql:
    """What one query reads, as far as the lexer can tell."""

    tables: frozenset[str]
    """Tables (and ``let`` names) at the heads of its pipelines."""
    let_names: frozenset[str]
    metrics: frozenset[str]
    """Metric names kept with ``name == "..."`` / ``name in (...)``."""
    fuzzy_name_filters: tuple[str, ...]
    """Operators other than ``==``/``in`` that ``name`` is compared with."""
    placeholders: frozenset[tuple[str, str | None]]
    """Workbook parameters it uses: (name, format), e.g. ``("TimeRange", "grain")``."""
    dimensions: frozenset[str] = frozenset()
    """The metrics' attributes it reads: ``customDimensions.x`` or ``customDimensions["x"]``."""

    @property
    def sources(self) -> frozenset[str]:
        """The tables it reads (``let`` names left out)."""
        return self.tables - self.let_names


def read_kql(query: str) -> Kql:
    toks = tokens(query)
    tables, lets = _sources(toks)
    metrics, fuzzy = _metric_names(toks)
    placeholders = frozenset(
        (inner.partition(":")[0], inner.partition(":")[2] or None)
        for inner in (t.text[1:-1] for t in toks if t.kind == "placeholder")
    )
    return Kql(
        frozenset(tables),
        frozenset(lets),
        frozenset(metrics),
        fuzzy,
        placeholders,
        frozenset(_dimensions(toks)),
    )


def _dimensions(toks: list[Token]) -> set[str]:
    found: set[str] = set()
    for i, token in enumerate(toks):
        if token.kind != "ident" or token.text != "customDimensions":
            continue
        after, key = _at(toks, i + 1), _at(toks, i + 2)
        if after is None or key is None:
            continue
        if after.text == "." and key.kind == "ident":
            found.add(key.text)
        elif after.text == "[" and key.kind == "string":
            found.add(_string_value(key))
    return found


def _at(toks: list[Token], i: int) -> Token | None:
    return toks[i] if 0 <= i < len(toks) else None


def _text(toks: list[Token], i: int) -> str | None:
    token = _at(toks, i)
    return token.text if token else None


def _sources(toks: list[Token]) -> tuple[set[str], set[str]]:
    tables: set[str] = set()
    lets: set[str] = set()
    for i, token in enumerate(toks):
        if token.kind != "ident":
            continue
        before, after = _text(toks, i - 1), _text(toks, i + 1)
        statement_start = before is None or before == ";"
        following = _at(toks, i + 1)
        if token.text == "let" and statement_start and following and following.kind == "ident":
            lets.add(following.text)
            continue
        let_value = before == "=" and _text(toks, i - 3) == "let"
        if (statement_start or let_value) and after in (None, "|", ";"):
            tables.add(token.text)
        elif before == "(" and after == "|":
            tables.add(token.text)  # toscalar(T | ...), join (T | ...), union (T | ...)
        elif token.text == "union" and (statement_start or before == "|"):
            tables |= _union_arguments(toks, i + 1)
        elif token.text in ("join", "lookup") and before == "|":
            tables |= _join_argument(toks, i + 1)
    return tables, lets


def _skip_options(toks: list[Token], j: int) -> int:
    """Past ``kind=inner``, ``withsource=T``, ``hint.strategy=shuffle`` and the like."""
    while (token := _at(toks, j)) is not None and token.kind == "ident":
        if _text(toks, j + 1) == "." and _text(toks, j + 3) == "=":
            j += 5
        elif _text(toks, j + 1) == "=":
            j += 3
        else:
            break
    return j


def _union_arguments(toks: list[Token], j: int) -> set[str]:
    found = set()
    j = _skip_options(toks, j)
    while (token := _at(toks, j)) is not None:
        if token.kind == "ident" and _text(toks, j + 1) in (None, ",", "|", ";"):
            found.add(token.text)
            j += 1
        elif token.text == "(":
            depth = 0
            while (inner := _at(toks, j)) is not None:
                depth += {"(": 1, ")": -1}.get(inner.text, 0)
                j += 1
                if depth == 0:
                    break
        else:
            break
        if _text(toks, j) != ",":
            break
        j += 1
    return found


def _join_argument(toks: list[Token], j: int) -> set[str]:
    j = _skip_options(toks, j)
    token = _at(toks, j)
    if token is not None and token.kind == "ident" and _text(toks, j + 1) in ("on", None, "|"):
        return {token.text}
    return set()


def _metric_names(toks: list[Token]) -> tuple[set[str], tuple[str, ...]]:
    names: set[str] = set()
    fuzzy: list[str] = []
    for i, token in enumerate(toks):
        if token.kind != "ident" or token.text != "name" or _text(toks, i - 1) == ".":
            continue
        operator = _at(toks, i + 1)
        if operator is None:
            continue
        if operator.text in ("==", "=~"):
            value = _at(toks, i + 2)
            if value is not None and value.kind == "string":
                names.add(_string_value(value))
        elif operator.text == "in":
            j = i + 2 + (_text(toks, i + 2) == "~")
            if _text(toks, j) == "(":
                j += 1
                while (value := _at(toks, j)) is not None and value.text != ")":
                    if value.kind == "string":
                        names.add(_string_value(value))
                    j += 1
        elif operator.kind == "ident" and operator.text in _FUZZY_OPERATORS:
            fuzzy.append(operator.text)
    return names, tuple(fuzzy)


# --------------------------------------------------------------------- the document


def items(document: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every item, those inside groups included, in document order."""

    def walk(entries: Iterable[Any]) -> Iterator[dict[str, Any]]:
        for entry in entries:
            if not isinstance(entry, dict):
                continue
            yield entry
            content = entry.get("content")
            if entry.get("type") == GROUP_ITEM and isinstance(content, dict):
                yield from walk(content.get("items") or [])

    yield from walk(document.get("items") or [])


def parameters(document: Mapping[str, Any]) -> dict[str, Any]:
    """Parameter name -> its ``type``, over every parameters item."""
    found = {}
    for item in items(document):
        if item.get("type") == PARAMETERS_ITEM:
            for parameter in (item.get("content") or {}).get("parameters") or []:
                if isinstance(parameter, dict) and isinstance(parameter.get("name"), str):
                    found[parameter["name"]] = parameter.get("type")
    return found


@dataclass(frozen=True)
class Chart:
    """One query item."""

    name: str
    title: str
    content: dict[str, Any]
    kql: Kql


def charts(document: Mapping[str, Any]) -> list[Chart]:
    found = []
    for item in items(document):
        if item.get("type") != QUERY_ITEM:
            continue
        content = item.get("content") or {}
        query = content.get("query") if isinstance(content.get("query"), str) else ""
        found.append(
            Chart(
                name=str(item.get("name", "")),
                title=str(content.get("title", "")),
                content=content,
                kql=read_kql(query),
            )
        )
    return found


def problems(
    document: Any,
    defined_metrics: frozenset[str],
    where: str,
    attributes: Mapping[str, frozenset[str]] | None = None,
) -> list[str]:
    """What is wrong with a workbook document that should chart exactly ``defined_metrics``
    from the Application Insights component it is deployed with; with ``attributes`` (metric
    -> what it is recorded with), a chart may read only its metrics' attributes."""
    if not isinstance(document, dict):
        return [f"{where}: not a JSON object"]
    found = []
    if document.get("version") != NOTEBOOK_VERSION:
        found.append(
            f"{where}: version is {document.get('version')!r}, must be {NOTEBOOK_VERSION!r}"
        )
    names = [str(item.get("name")) for item in items(document)]
    for name in sorted({n for n in names if names.count(n) > 1}):
        found.append(f"{where}: more than one item is named {name!r} (names must be unique)")
    declared = parameters(document)
    time_ranges = {name for name, kind in declared.items() if kind == TIME_RANGE_PARAMETER}
    charted: set[str] = set()
    all_charts = charts(document)
    if not all_charts:
        found.append(f"{where}: no query item (type {QUERY_ITEM}): the workbook charts nothing")
    for chart in all_charts:
        found += _chart_problems(chart, declared, time_ranges, defined_metrics, f"{where}")
        found += _dimension_problems(chart, attributes or {}, f"{where}: chart {chart.name!r}")
        charted |= chart.kql.metrics
    if not defined_metrics:
        found.append(
            "the code defines no metric (adapters.metrics.NAMES | service.sweep_report.NAMES is "
            "empty): nothing to hold the workbook against"
        )
    for metric in sorted(defined_metrics - charted):
        found.append(
            f"{where}: metric {metric!r} is defined by the code but no chart queries it "
            f'(add a chart that keeps it with name == "{metric}")'
        )
    return found


def _dimension_problems(
    chart: Chart, attributes: Mapping[str, frozenset[str]], at: str
) -> list[str]:
    """Each ``customDimensions`` key the chart reads, against every metric it keeps that the
    code declares attributes for (a metric it does not know is reported elsewhere)."""
    found = []
    for dimension in sorted(chart.kql.dimensions):
        for metric in sorted(chart.kql.metrics & attributes.keys()):
            if dimension not in attributes[metric]:
                found.append(
                    f"{at}: reads customDimensions.{dimension}, but {metric!r} is recorded "
                    f"with {sorted(attributes[metric]) or 'no attributes'} "
                    "(adapters.metrics.ATTRIBUTES, service.sweep_report.ATTRIBUTES)"
                )
    return found


def _chart_problems(
    chart: Chart,
    declared: Mapping[str, Any],
    time_ranges: set[str],
    defined_metrics: frozenset[str],
    where: str,
) -> list[str]:
    at = f"{where}: chart {chart.name!r}"
    content = chart.content
    found = []
    for key, expected in (
        ("version", KQL_ITEM_VERSION),
        ("queryType", LOGS_QUERY),
        ("resourceType", COMPONENT_RESOURCE_TYPE),
    ):
        value = content.get(key)
        value = value.lower() if key == "resourceType" and isinstance(value, str) else value
        if value != expected:
            found.append(f"{at}: {key} is {content.get(key)!r}, must be {expected!r}")
    if content.get("crossComponentResources"):
        found.append(
            f"{at}: crossComponentResources sends the query elsewhere; leave it out so it runs "
            "on the component the workbook is deployed with"
        )
    if not chart.title:
        found.append(f"{at}: has no title")
    if content.get("visualization") not in VISUALIZATIONS:
        found.append(
            f"{at}: visualization {content.get('visualization')!r} is not one of "
            f"{sorted(VISUALIZATIONS)}"
        )
    time = content.get("timeContextFromParameter")
    if time not in time_ranges:
        found.append(
            f"{at}: timeContextFromParameter is {time!r}, must name a time range parameter "
            f"({sorted(time_ranges) or 'none declared'})"
        )
    query = content.get("query")
    if not isinstance(query, str) or not query.strip():
        return [*found, f"{at}: has no query"]
    kql = chart.kql
    for name, fmt in sorted(kql.placeholders, key=str):
        if name not in declared:
            found.append(f"{at}: uses {{{name}}}, which no parameter declares")
        elif fmt is not None and name in time_ranges and fmt not in TIME_RANGE_FORMATS:
            found.append(f"{at}: {{{name}:{fmt}}} is not a time range format")
    if not kql.sources:
        found.append(f"{at}: reads no table the check can see (start the query with a table)")
    for table in sorted(kql.sources - APP_INSIGHTS_TABLES):
        found.append(
            f"{at}: reads {table!r}, which is not an Application Insights table "
            f"({', '.join(sorted(APP_INSIGHTS_TABLES))})"
        )
    if METRICS_TABLE in kql.sources:
        if kql.fuzzy_name_filters:
            found.append(
                f"{at}: compares name with {', '.join(kql.fuzzy_name_filters)}; name each "
                'metric with name == "..." or name in ("...")'
            )
        if not kql.metrics:
            found.append(
                f'{at}: reads {METRICS_TABLE} without naming its metrics (name == "..." or '
                'name in ("..."))'
            )
        for metric in sorted(kql.metrics - defined_metrics):
            found.append(
                f"{at}: queries metric {metric!r}, which the code does not define "
                "(adapters.metrics.NAMES, service.sweep_report.NAMES)"
            )
    return found
