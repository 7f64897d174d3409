"""What each function of the app does to Service Bus, Table Storage, Blob Storage and Key Vault,
read from the code's syntax trees.

The infra checks compare these operations with the role assignments in the Bicep, so a new call
on a queue, table, container or secret that no role covers fails a test. Nothing here is a
list of what the app does: each function found by indexing ``function_app`` is followed through
the code it calls, and every operation on an Azure client is recorded with the resource it
names and the line that does it.

How the code is read (a small abstract interpreter over ``ast``):

- Values are sets of *atoms*: an instance of an app class (with the arguments it was built
  with), a class, a function, a module, an Azure client (its kind and the resource names it is
  bound to), a resource name, a mapping of names, a tuple or a sequence. Types come from what
  is assigned and passed; annotations only fill in what is not.
- Calls are followed with the arguments of each call site (context-sensitive), so a helper
  called with the orders table and with the active-order table reports each where it is
  called from.
- Resource names come from the settings: which field of ``Settings`` (or of a dataclass it
  holds, such as the retention purge's) each app setting feeds is found by running
  ``RetentionSettings.from_env`` with a marker value per setting (:func:`settings_fields`). A string
  the code builds at run time (a submitter's reply queue) is a name "named at run time",
  which only a role on the whole namespace or account covers.
- Azure clients are recognised by their SDK classes and by the factories the SDKs share
  (``get_table_client``, ``get_container_client``, ``get_blob_client``, ``get_queue_sender``,
  ``get_queue_receiver``); whatever implements a factory (the SDK or the app's own Table client)
  is not followed further. Each method called on a client is classified as read or write (send
  or receive); a method the tables below do not classify is reported, never guessed.
- The app sends its messages through :meth:`adapters.servicebus.Bus.send` (and a replayed dead
  letter through ``Bus.send_copy``: :data:`SEND_PRIMITIVES`): a call to one is a send to the
  queue its ``queue`` argument names, and its internals (a cache of SDK senders by queue name)
  are not followed.
- The app's I/O is async: the SDK clients are the asyncio ones (``.aio``), ``await`` is looked
  through, and ``async with`` and ``async for`` on an app object follow its ``__aenter__`` and
  ``__aexit__``, ``__aiter__`` and ``__anext__``. A sync SDK client is not recognised: an
  operation on one is reported as one on a client the analysis lost track of.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import string
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, TypeAlias

Service: TypeAlias = Literal["queue", "table", "blob", "secret"]
Kind: TypeAlias = Literal["send", "receive", "read", "write"]
Res: TypeAlias = tuple[str, str]
"""("setting", NAME): the resource an app setting names; ("literal", name); ("runtime", the
expression that names it at run time)."""

AST_RETRIES = 3


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> Any:
    """``ast.parse``, tried again on CPython 3.11's "AST constructor recursion depth mismatch":
    its AST constructor kept its recursion count in interpreter-wide state (CPython gh-106905), so a
    compile on another thread of the test process at the same moment (a local host importing,
    a finalizer) can trip it. The error says nothing about the source; the next try parses it."""
    for attempt in range(AST_RETRIES):
        try:
            return ast.parse(source, filename=filename, mode=mode)
        except SystemError as error:
            if "recursion depth mismatch" not in str(error) or attempt == AST_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


APP_ENTRY = "function_app"
SEND_PRIMITIVES: Mapping[str, str] = {
    # function key -> the parameter naming the queue it sends to
    "adapters.servicebus.Bus.send": "queue",
    "adapters.servicebus.Bus.send_copy": "queue",
}

# Azure client kinds: the SDK's asyncio client classes the code may import, by kind.
SDK_CLASSES: Mapping[str, str] = {
    "azure.data.tables.aio.TableServiceClient": "TableService",
    "azure.data.tables.aio.TableClient": "Table",
    "azure.storage.blob.aio.BlobServiceClient": "BlobService",
    "azure.storage.blob.aio.ContainerClient": "Container",
    "azure.storage.blob.aio.BlobClient": "Blob",
    "azure.servicebus.aio.ServiceBusClient": "ServiceBus",
    "azure.servicebus.aio.ServiceBusSender": "Sender",
    "azure.servicebus.aio.ServiceBusReceiver": "Receiver",
    "azure.keyvault.secrets.aio.SecretClient": "Secrets",
}
SERVICE_OF_KIND: Mapping[str, Service] = {
    "TableService": "table",
    "Table": "table",
    "BlobService": "blob",
    "Container": "blob",
    "Blob": "blob",
    "ServiceBus": "queue",
    "Sender": "queue",
    "Receiver": "queue",
    "Secrets": "secret",
}
FACTORIES: Mapping[str, tuple[str, str]] = {
    # method -> (kind of the client it returns, keyword of the name it takes first)
    "get_table_client": ("Table", "table_name"),
    "get_container_client": ("Container", "container"),
    "get_queue_sender": ("Sender", "queue_name"),
    "get_queue_receiver": ("Receiver", "queue_name"),
}
OPERATIONS: Mapping[str, Mapping[str, Kind]] = {
    # kind -> method -> what it does to the resource the client is bound to
    "Table": {
        **dict.fromkeys(("get_entity", "query_entities", "list_entities"), "read"),
        **dict.fromkeys(
            (
                "create_entity",
                "upsert_entity",
                "update_entity",
                "delete_entity",
                "submit_transaction",
                "create_table",
                "delete_table",
            ),
            "write",
        ),
    },
    "TableService": {},  # its table operations name the table: TABLE_SERVICE_OPERATIONS
    "Container": {
        **dict.fromkeys(
            ("list_blobs", "walk_blobs", "list_blob_names", "get_container_properties", "exists"),
            "read",
        ),
        **dict.fromkeys(
            ("create_container", "delete_container", "upload_blob", "delete_blob", "delete_blobs"),
            "write",
        ),
    },
    "Blob": {
        **dict.fromkeys(
            ("download_blob", "get_blob_properties", "get_block_list", "exists"), "read"
        ),
        **dict.fromkeys(
            (
                "upload_blob",
                "stage_block",
                "commit_block_list",
                "delete_blob",
                "append_block",
                "create_append_blob",
                "set_blob_metadata",
                "set_standard_blob_tier",
            ),
            "write",
        ),
    },
    "BlobService": {},
    "ServiceBus": {},
    "Sender": dict.fromkeys(
        ("send_messages", "schedule_messages", "cancel_scheduled_messages"), "send"
    ),
    "Receiver": dict.fromkeys(
        (
            "peek_messages",
            "receive_messages",
            "receive_deferred_messages",
            "complete_message",
            "abandon_message",
            "defer_message",
            "dead_letter_message",
            "renew_message_lock",
        ),
        "receive",
    ),
    "Secrets": {
        **dict.fromkeys(("get_secret", "list_properties_of_secrets"), "read"),
        **dict.fromkeys(("set_secret", "begin_delete_secret"), "write"),
    },
}
TABLE_SERVICE_OPERATIONS: Mapping[str, Kind] = dict.fromkeys(
    ("create_table", "create_table_if_not_exists", "delete_table"), "write"
)
CONSTRUCTOR_NAMES: Mapping[str, tuple[int, str]] = {
    # kind -> (position, keyword) of the resource name its constructor takes
    "Table": (1, "table_name"),
    "Container": (1, "container_name"),
    "Blob": (1, "container_name"),
}
NO_REQUEST: frozenset[str] = frozenset(
    # Client methods that make no request to the resource.
    ("close", "__aenter__", "__aexit__", "get_blob_client", "get_table_client", "url")
)
_CONTAINER_TYPES = frozenset(
    ("list", "tuple", "set", "frozenset", "Sequence", "Iterable", "Iterator", "Collection")
)
_UNION_TYPES = frozenset(("Optional", "Union"))
_GROWING = frozenset(("append", "add", "extend", "insert"))


# ----------------------------------------------------------------------------------- results


@dataclass(frozen=True, order=True)
class Access:
    service: Service
    kind: Kind
    resource: Res
    where: str
    """``path:line`` of the call, or ``binding`` for a trigger."""

    def describe(self, settings: Mapping[str, Any] | None = None) -> str:
        what = {"queue": "queue", "table": "table", "blob": "container", "secret": "secret"}
        origin, name = self.resource
        if origin == "runtime":
            target = f"a {what[self.service]} named at run time (`{name}`)"
        elif origin == "setting":
            value = (settings or {}).get(name)
            shown = f"{value!r} " if isinstance(value, str) else ""
            target = f"{what[self.service]} {shown}({name})"
        else:
            target = f"{what[self.service]} {name!r}"
        verb = {"send": "sends to", "receive": "receives from", "read": "reads", "write": "writes"}
        return f"{verb[self.kind]} {target} at {self.where}"


@dataclass(frozen=True)
class CodeAccess:
    """Every function's operations, and what could not be classified."""

    accesses: Mapping[str, frozenset[Access]]
    unclassified: tuple[str, ...] = ()
    """``path:line: Kind.method`` of client calls no table here classifies."""
    unfollowed: tuple[str, ...] = ()
    """``path:line: .method()`` of calls on a value the analysis lost track of, where a method
    of that name does reach Azure (an app method with operations, or a client operation): the
    operations behind such a call would be missed, so it is reported instead."""


# ------------------------------------------------------------------------------------- atoms


Bindings: TypeAlias = tuple[tuple[str, frozenset], ...]


@dataclass(frozen=True)
class Obj:
    cls: str
    ctor: Bindings = ()


@dataclass(frozen=True)
class Cls:
    cls: str


@dataclass(frozen=True)
class Fn:
    func: str
    self_atom: Any = None
    closure: Any = None
    """The frame key the function was defined in (lambdas and nested functions)."""


@dataclass(frozen=True)
class Mod:
    name: str


@dataclass(frozen=True)
class Client:
    kind: str
    names: frozenset[Res] = frozenset()


@dataclass(frozen=True)
class ClientClass:
    kind: str


@dataclass(frozen=True)
class Name:
    res: Res


@dataclass(frozen=True)
class NameMap:
    items: tuple[tuple[str, str], ...]
    """key -> the setting naming its value."""


@dataclass(frozen=True)
class Tup:
    items: tuple[frozenset, ...]


@dataclass(frozen=True)
class Seq:
    elements: frozenset


@dataclass(frozen=True)
class Unknown:
    """A value the analysis cannot tell: as a name, any; as a callee, anything."""


Atoms: TypeAlias = frozenset
NOTHING: Atoms = frozenset()
"""No value worth following (None, a number, a bool)."""
SOME: Atoms = frozenset({Unknown()})
_SELF = Obj("<the instance being built>")


# ------------------------------------------------------------------------------- the program


@dataclass
class FuncInfo:
    key: str
    module: Module
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
    cls: ClassInfo | None
    parent: FuncInfo | None

    @cached_property
    def params(self) -> list[ast.arg]:
        args = self.node.args
        return [*args.posonlyargs, *args.args, *args.kwonlyargs]

    @cached_property
    def defaults(self) -> dict[str, ast.expr]:
        args = self.node.args
        positional = [*args.posonlyargs, *args.args]
        found = dict(
            zip(
                [a.arg for a in positional[len(positional) - len(args.defaults) :]],
                args.defaults,
                strict=True,
            )
        )
        for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
            if default is not None:
                found[arg.arg] = default
        return found

    @cached_property
    def decorators(self) -> set[str]:
        if isinstance(self.node, ast.Lambda):
            return set()
        return {_dotted(d.func if isinstance(d, ast.Call) else d) for d in self.node.decorator_list}

    @property
    def is_property(self) -> bool:
        return bool({"property", "cached_property", "functools.cached_property"} & self.decorators)

    @property
    def is_classmethod(self) -> bool:
        return "classmethod" in self.decorators

    @property
    def is_staticmethod(self) -> bool:
        return "staticmethod" in self.decorators

    @cached_property
    def body_nodes(self) -> list[ast.AST]:
        """Every node of the body, not descending into nested functions, lambdas or classes."""
        roots = [self.node.body] if isinstance(self.node, ast.Lambda) else self.node.body
        return list(_walk_scope(roots))

    @cached_property
    def local_sources(self) -> dict[str, list[tuple[str, Any]]]:
        sources: dict[str, list[tuple[str, Any]]] = {}
        params = {p.arg for p in self.params}
        for node in self.body_nodes:
            for name, source in _bindings_of(node):
                if name not in params:
                    sources.setdefault(name, []).append(source)
        return sources

    @cached_property
    def returns(self) -> list[ast.expr]:
        if isinstance(self.node, ast.Lambda):
            return [self.node.body]
        return [n.value for n in self.body_nodes if isinstance(n, ast.Return) and n.value]


@dataclass
class ClassInfo:
    key: str
    module: Module
    node: ast.ClassDef
    methods: dict[str, FuncInfo] = field(default_factory=dict)

    @cached_property
    def is_dataclass(self) -> bool:
        return any(
            _dotted(d.func if isinstance(d, ast.Call) else d).endswith("dataclass")
            for d in self.node.decorator_list
        )

    @cached_property
    def annotations(self) -> dict[str, ast.AnnAssign]:
        return {
            s.target.id: s
            for s in self.node.body
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
        }

    @cached_property
    def fields(self) -> list[str]:
        """Dataclass fields in order (``ClassVar`` excluded)."""
        return [
            name
            for name, s in self.annotations.items()
            if "ClassVar" not in ast.unparse(s.annotation)
        ]


@dataclass
class Module:
    name: str
    path: Path
    rel: str
    tree: ast.Module
    imports: dict[str, str] = field(default_factory=dict)
    """Local name -> dotted target (``service.runtime`` or ``service.runtime.Runtime``)."""
    functions: dict[str, FuncInfo] = field(default_factory=dict)
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    globals: dict[str, list[tuple[FuncInfo | None, tuple[str, Any]]]] = field(default_factory=dict)


class Program:
    """The modules an app's entry point (``function_app``, ``operations_app``) imports,
    transitively, parsed and indexed."""

    def __init__(self, root: Path, entry: str = APP_ENTRY) -> None:
        self.root = root
        self.modules: dict[str, Module] = {}
        self.funcs: dict[str, FuncInfo] = {}
        self.classes: dict[str, ClassInfo] = {}
        self._load(entry)

    def module_path(self, name: str) -> Path | None:
        base = self.root.joinpath(*name.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
        return None

    def _load(self, name: str) -> None:
        if name in self.modules:
            return
        path = self.module_path(name)
        if path is None:
            return
        tree = parse(path.read_text(encoding="utf-8"), filename=str(path))
        module = Module(name, path, str(path.relative_to(self.root)), tree)
        self.modules[name] = module
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    module.imports[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
                    self._load(alias.name)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, package)
                self._load(base)
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    module.imports[alias.asname or alias.name] = target
                    self._load(target)
        self._index(module)

    def _index(self, module: Module) -> None:
        for node in module.tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                module.functions[node.name] = self._function(module, node, None, None)
            elif isinstance(node, ast.ClassDef):
                info = ClassInfo(f"{module.name}.{node.name}", module, node)
                module.classes[node.name] = self.classes[info.key] = info
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        info.methods[item.name] = self._function(module, item, info, None)
            for name, source in _bindings_of(node):
                module.globals.setdefault(name, []).append((None, source))
        for func in list(self.funcs.values()):
            if func.module is not module:
                continue
            declared = {
                n for node in func.body_nodes if isinstance(node, ast.Global) for n in node.names
            }
            for name in declared:
                for source in func.local_sources.get(name, []):
                    module.globals.setdefault(name, []).append((func, source))

    def _function(
        self,
        module: Module,
        node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda,
        cls: ClassInfo | None,
        parent: FuncInfo | None,
    ) -> FuncInfo:
        if isinstance(node, ast.Lambda):
            key = f"{module.name}.<lambda@{node.lineno}:{node.col_offset}>"
        elif parent is not None:
            key = f"{parent.key}.<locals>.{node.name}@{node.lineno}"
        else:
            key = f"{cls.key if cls else module.name}.{node.name}"
        info = FuncInfo(key, module, node, cls, parent)
        self.funcs[key] = info
        for child in info.body_nodes:
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                self._function(module, child, None, info)
        return info

    def nested(self, parent: FuncInfo, node: ast.AST) -> FuncInfo:
        """The function ``node`` defines inside ``parent`` (or, for a lambda outside any
        function body, e.g. a parameter default, in ``parent``'s module)."""
        if isinstance(node, ast.Lambda):
            key = f"{parent.module.name}.<lambda@{node.lineno}:{node.col_offset}>"
            return self.funcs.get(key) or self._function(parent.module, node, None, None)
        assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        return self.funcs[f"{parent.key}.<locals>.{node.name}@{node.lineno}"]

    def function_at(self, rel: str, line: int) -> FuncInfo | None:
        """The function defined (or first decorated) at ``rel:line``."""
        for func in self.funcs.values():
            node = func.node
            if func.module.rel != rel or isinstance(node, ast.Lambda):
                continue
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if line in (first, node.lineno):
                return func
        return None

    def mro(self, cls: ClassInfo) -> Iterator[ClassInfo]:
        yield cls
        for base in cls.node.bases:
            target = self.resolve_dotted(cls.module, _dotted(base))
            if target in self.classes and target != cls.key:
                yield from self.mro(self.classes[target])

    def resolve_dotted(self, module: Module, dotted: str) -> str:
        """The absolute dotted target of a (possibly dotted) name used in ``module``."""
        head, _, rest = dotted.partition(".")
        if head in module.imports:
            base = module.imports[head]
        elif head in module.classes or head in module.functions:
            base = f"{module.name}.{head}"
        else:
            return dotted
        return f"{base}.{rest}" if rest else base


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _walk_scope(roots: Iterable[ast.AST]) -> Iterator[ast.AST]:
    stack = list(roots)[::-1]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _bindings_of(node: ast.AST) -> Iterator[tuple[str, tuple[str, Any]]]:
    """(name, source) for each name ``node`` binds; a source is how to evaluate it."""
    if isinstance(node, ast.Assign):
        for target in node.targets:
            yield from _targets(target, ("value", node.value), ())
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        yield node.target.id, ("annotated", (node.annotation, node.value))
    elif isinstance(node, ast.NamedExpr):
        yield node.target.id, ("value", node.value)
    elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
        yield from _targets(node.target, ("element", node.iter), ())
    elif isinstance(node, ast.With | ast.AsyncWith):
        for item in node.items:
            if item.optional_vars is not None:
                yield from _targets(item.optional_vars, ("value", item.context_expr), ())
    elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        yield node.name, ("def", node)
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.attr in _GROWING
        and node.args
    ):
        # x.append(v), x.add(v), x.extend(vs): what a collection holds comes from there too.
        kind = "values" if node.func.attr == "extend" else "value"
        yield node.func.value.id, ("holds", (kind, node.args[-1]))


def _targets(
    target: ast.AST, source: tuple[str, Any], path: tuple[int, ...]
) -> Iterator[tuple[str, tuple[str, Any]]]:
    if isinstance(target, ast.Name):
        yield target.id, ("unpack", (source, path)) if path else source
    elif isinstance(target, ast.Tuple | ast.List):
        for i, item in enumerate(target.elts):
            yield from _targets(item, source, (*path, i))


# -------------------------------------------------------------------------------- the frames


@dataclass(frozen=True)
class FrameKey:
    func: str
    bindings: Bindings
    closure: FrameKey | None


@dataclass
class Summary:
    returns: Atoms = NOTHING
    accesses: set[Access] = field(default_factory=set)
    reached: set[str] = field(default_factory=set)


@dataclass
class Frame:
    key: FrameKey
    func: FuncInfo
    bindings: dict[str, Atoms]
    summary: Summary
    closure: Frame | None = None
    locals: dict[str, Atoms] = field(default_factory=dict)
    evaluating: set[str] = field(default_factory=set)


# ------------------------------------------------------------------------------ the analysis


class Analyzer:
    """Follows calls from an entry function; see the module docstring."""

    def __init__(
        self,
        program: Program,
        settings_fields: Mapping[str, Mapping[str, str | Mapping[str, str]]],
        reachable: set[str] | None = None,
    ) -> None:
        self.program = program
        self.settings_fields = settings_fields
        """Class (``module.Name``) -> field -> the setting it holds (:func:`settings_fields`)."""
        self.reachable = reachable
        """Functions whose assignments to globals count (None: all of them)."""
        self._summaries: dict[FrameKey, Summary] = {}
        self._frames: dict[FrameKey, Frame] = {}
        self._active: set[FrameKey] = set()
        self._attributes: dict[tuple[Any, str], Atoms] = {}
        self._attr_active: set[tuple[Any, str]] = set()
        self._globals: dict[tuple[str, str], Atoms] = {}
        self.unclassified: set[str] = set()
        self.unknown_receivers: set[tuple[str, str]] = set()
        """(method, where) of calls on a value the analysis lost track of."""

    # -- entry points ------------------------------------------------------------------------

    def run(self, func: FuncInfo) -> Summary:
        closure = self._frame_for(func.parent, {}) if func.parent else None
        return self.call(func, {}, closure)

    def call(self, func: FuncInfo, bindings: Mapping[str, Atoms], closure: Frame | None) -> Summary:
        frozen = tuple(sorted((k, v) for k, v in bindings.items() if v))
        key = FrameKey(func.key, frozen, closure.key if closure else None)
        if key in self._summaries:
            return self._summaries[key]
        if key in self._active:
            return Summary()
        self._active.add(key)
        try:
            frame = Frame(key, func, dict(frozen), Summary(reached={func.key}), closure)
            self._frames[key] = frame
            self._execute(frame)
            returns = self._union(self.eval(e, frame) for e in func.returns)
            if not returns and not isinstance(func.node, ast.Lambda) and func.node.returns:
                returns = self.annotation(func.node.returns, func.module, func.cls)
            frame.summary.returns = returns
        finally:
            self._active.discard(key)
        self._summaries[key] = frame.summary
        return frame.summary

    def _frame_for(self, func: FuncInfo, bindings: Mapping[str, Atoms]) -> Frame:
        closure = self._frame_for(func.parent, {}) if func.parent else None
        frozen = tuple(sorted((k, v) for k, v in bindings.items() if v))
        key = FrameKey(func.key, frozen, closure.key if closure else None)
        if key not in self._frames:
            self._frames[key] = Frame(key, func, dict(frozen), Summary(), closure)
        return self._frames[key]

    def _execute(self, frame: Frame) -> None:
        for node in frame.func.body_nodes:
            if isinstance(node, ast.Call):
                self.eval(node, frame)
            elif isinstance(node, ast.With | ast.AsyncWith):
                entered = (
                    ("__aenter__", "__aexit__")
                    if isinstance(node, ast.AsyncWith)
                    else ("__enter__", "__exit__")
                )
                for item in node.items:
                    for atom in self.eval(item.context_expr, frame):
                        self._dunder(atom, entered, frame)
            elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
                walked = (
                    ("__aiter__", "__anext__")
                    if isinstance(node, ast.AsyncFor) or getattr(node, "is_async", False)
                    else ("__iter__", "__next__")
                )
                for atom in self.eval(node.iter, frame):
                    self._dunder(atom, walked, frame)

    def _dunder(self, atom: Any, names: tuple[str, ...], frame: Frame) -> None:
        if isinstance(atom, Obj):
            for name in names:
                method = self._method(self.program.classes[atom.cls], name)
                if method is not None:
                    self._merge(frame, self.call(method, {"self": frozenset({atom})}, None))

    # -- expressions -------------------------------------------------------------------------

    def eval(self, node: ast.AST | None, frame: Frame) -> Atoms:
        if node is None:
            return NOTHING
        method = getattr(self, f"_eval_{type(node).__name__}", None)
        return method(node, frame) if method else SOME

    def _eval_Constant(self, node: ast.Constant, frame: Frame) -> Atoms:
        if isinstance(node.value, str):
            return frozenset({Name(("literal", node.value))})
        return NOTHING

    def _eval_Compare(self, node: ast.Compare, frame: Frame) -> Atoms:
        return NOTHING

    def _eval_Name(self, node: ast.Name, frame: Frame) -> Atoms:
        return self.lookup(node.id, frame)

    def _eval_Attribute(self, node: ast.Attribute, frame: Frame) -> Atoms:
        return self._union(
            self.attribute(a, node.attr, frame) for a in self.eval(node.value, frame)
        )

    def _eval_Call(self, node: ast.Call, frame: Frame) -> Atoms:
        func = node.func
        results: set[Any] = set()
        if isinstance(func, ast.Attribute):
            bases = self.eval(func.value, frame)
            handled, others = self._client_call(node, func.attr, bases, frame)
            if handled is not None and not others:
                return handled
            results |= handled or NOTHING
            if any(isinstance(b, Unknown) for b in others):
                self.unknown_receivers.add((func.attr, f"{frame.func.module.rel}:{node.lineno}"))
            callees = self._union(self.attribute(b, func.attr, frame) for b in others)
        else:
            if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2:
                name = node.args[1]
                if isinstance(name, ast.Constant) and isinstance(name.value, str):
                    attr = ast.Attribute(value=node.args[0], attr=name.value, ctx=ast.Load())
                    ast.copy_location(attr, node)
                    return self._eval_Attribute(attr, frame) | self._rest(node, frame, 2)
            callees = self.eval(func, frame)
        unresolved = not callees
        for callee in callees:
            outcome = self._call_atom(callee, node, frame)
            if outcome is None:
                unresolved = True
            else:
                results |= outcome
        if unresolved:
            self._callbacks(node, frame)
            results |= SOME
        return frozenset(results)

    def _rest(self, node: ast.Call, frame: Frame, start: int) -> Atoms:
        return self._union(self.eval(a, frame) for a in node.args[start:])

    def _eval_Subscript(self, node: ast.Subscript, frame: Frame) -> Atoms:
        keys = self.eval(node.slice, frame)
        index = node.slice.value if isinstance(node.slice, ast.Constant) else None
        found: set[Any] = set()
        for atom in self.eval(node.value, frame):
            found |= _element(atom, keys, index)
        return frozenset(found)

    def _eval_BoolOp(self, node: ast.BoolOp, frame: Frame) -> Atoms:
        return self._union(self.eval(v, frame) for v in node.values)

    def _eval_IfExp(self, node: ast.IfExp, frame: Frame) -> Atoms:
        return self.eval(node.body, frame) | self.eval(node.orelse, frame)

    def _eval_Await(self, node: ast.Await, frame: Frame) -> Atoms:
        return self.eval(node.value, frame)

    def _eval_NamedExpr(self, node: ast.NamedExpr, frame: Frame) -> Atoms:
        return self.eval(node.value, frame)

    def _eval_Tuple(self, node: ast.Tuple, frame: Frame) -> Atoms:
        return frozenset({Tup(tuple(self.eval(e, frame) for e in node.elts))})

    def _eval_List(self, node: ast.List, frame: Frame) -> Atoms:
        return frozenset({Seq(self._union(self.eval(e, frame) for e in node.elts))})

    def _eval_ListComp(self, node: ast.ListComp, frame: Frame) -> Atoms:
        return frozenset({Seq(self.eval(node.elt, frame))})

    _eval_SetComp = _eval_ListComp
    _eval_GeneratorExp = _eval_ListComp

    def _eval_Lambda(self, node: ast.Lambda, frame: Frame) -> Atoms:
        return frozenset({Fn(self.program.nested(frame.func, node).key, None, frame.key)})

    # -- names -------------------------------------------------------------------------------

    def lookup(self, name: str, frame: Frame) -> Atoms:
        func = frame.func
        if any(p.arg == name for p in func.params):
            return frame.bindings.get(name) or self._unbound(func, name)
        if name in func.local_sources:
            if name not in frame.locals:
                if name in frame.evaluating:
                    return NOTHING
                frame.evaluating.add(name)
                try:
                    frame.locals[name] = self._local(func.local_sources[name], frame)
                finally:
                    frame.evaluating.discard(name)
            return frame.locals[name]
        if frame.closure is not None:
            return self.lookup(name, frame.closure)
        return self.module_name(func.module, name)

    def _local(self, sources: list[tuple[str, Any]], frame: Frame) -> Atoms:
        """What a local name holds: what is assigned to it; its annotations only when that
        tells nothing (``x: T = None`` assigned a ``T`` later is that ``T``; ``x: T =
        request.app.state.x``, a value kept where the analysis cannot see, is a ``T``)."""
        found = self._union(self._source(s, frame) for s in sources)
        if _known(found):
            return found
        declared = self._union(
            self.annotation(detail[0], frame.func.module, frame.func.cls)
            for kind, detail in sources
            if kind == "annotated"
        )
        return declared if _known(declared) else found | declared | SOME

    def _unbound(self, func: FuncInfo, name: str) -> Atoms:
        """A parameter no call site bound: ``self``/``cls``, else its annotation and default."""
        if func.cls is not None and func.params and func.params[0].arg == name:
            if func.is_classmethod:
                return frozenset({Cls(func.cls.key)})
            if not func.is_staticmethod:
                return frozenset({Obj(func.cls.key)})
        found = self._declared(func, name)
        default = func.defaults.get(name)
        if default is not None:
            found |= self.eval(default, self._module_frame(func.module))
        return found if _known(found) else found | SOME

    def _declared(self, func: FuncInfo, name: str) -> Atoms:
        arg = next(p for p in func.params if p.arg == name)
        dependency = self._dependency(arg.annotation, func.module)
        if dependency is not None:  # FastAPI passes what the dependency returns
            module, provider = dependency
            call = ast.Call(func=provider, args=[], keywords=[])
            return self.eval(ast.copy_location(call, provider), self._module_frame(module))
        return self.annotation(arg.annotation, func.module, func.cls)

    def _dependency(self, node: ast.AST | None, module: Module) -> tuple[Module, ast.expr] | None:
        """The provider ``f`` of an ``Annotated[T, Depends(f)]`` annotation (through a type
        alias), and the module it is written in."""
        if isinstance(node, ast.Name | ast.Attribute):
            alias = self._alias(self.program.resolve_dotted(module, _dotted(node)))
            return self._dependency(alias[1], alias[0]) if alias is not None else None
        if not isinstance(node, ast.Subscript) or _dotted(node.value).rpartition(".")[2] != (
            "Annotated"
        ):
            return None
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else []
        for item in items[1:]:
            if isinstance(item, ast.Call) and _dotted(item.func).endswith("Depends") and item.args:
                return module, item.args[0]
        return None

    def _source(self, source: tuple[str, Any], frame: Frame) -> Atoms:
        kind, detail = source
        if kind == "value":
            return self.eval(detail, frame)
        if kind == "annotated":
            _, value = detail
            return self.eval(value, frame) if value is not None else NOTHING
        if kind == "holds":
            how, expr = detail
            held = self.eval(expr, frame)
            if how == "values":
                held = self._union(_elements(a) for a in held)
            return frozenset({Seq(held)})
        if kind == "element":
            return self._union(_elements(a) for a in self.eval(detail, frame))
        if kind == "unpack":
            inner, path = detail
            found = self._source(inner, frame)
            for index in path:
                found = self._union(_element(a, NOTHING, index) for a in found)
            return found
        if kind == "def":
            return frozenset({Fn(self.program.nested(frame.func, detail).key, None, frame.key)})
        return SOME

    def module_name(self, module: Module, name: str) -> Atoms:
        if name in module.functions:
            return frozenset({Fn(module.functions[name].key)})
        if name in module.classes:
            return frozenset({Cls(module.classes[name].key)})
        if name in module.imports:
            return self._target(module.imports[name])
        if name in module.globals:
            return self._global(module, name)
        return SOME

    def _target(self, dotted: str) -> Atoms:
        if dotted in SDK_CLASSES:
            return frozenset({ClientClass(SDK_CLASSES[dotted])})
        if dotted in self.program.modules:
            return frozenset({Mod(dotted)})
        module_name, _, attr = dotted.rpartition(".")
        if module_name in self.program.modules:
            return self.module_name(self.program.modules[module_name], attr)
        return SOME

    def _global(self, module: Module, name: str) -> Atoms:
        key = (module.name, name)
        if key not in self._globals:
            self._globals[key] = NOTHING
            found: set[Any] = set()
            for func, source in module.globals[name]:
                if func is None:
                    found |= self._source(source, self._module_frame(module))
                elif self.reachable is None or func.key in self.reachable:
                    found |= self._source(source, self._frame_for(func, {}))
            self._globals[key] = frozenset(found)
        return self._globals[key]

    def _module_frame(self, module: Module) -> Frame:
        key = FrameKey(f"{module.name}.<module>", (), None)
        if key not in self._frames:
            node = ast.Lambda(args=ast.arguments([], [], None, [], [], None, []), body=ast.Pass())
            ast.copy_location(node, module.tree)
            node.lineno = node.col_offset = 0
            func = FuncInfo(key.func, module, node, None, None)
            func.__dict__["local_sources"] = {}
            func.__dict__["body_nodes"] = []
            self._frames[key] = Frame(key, func, {}, Summary())
        return self._frames[key]

    # -- attributes --------------------------------------------------------------------------

    def attribute(self, atom: Any, attr: str, frame: Frame) -> Atoms:
        if isinstance(atom, Mod):
            module = self.program.modules[atom.name]
            if f"{atom.name}.{attr}" in self.program.modules:
                return frozenset({Mod(f"{atom.name}.{attr}")})
            return self.module_name(module, attr)
        if isinstance(atom, Cls):
            info = self.program.classes[atom.cls]
            method = self._method(info, attr)
            if method is not None:
                self_atom = atom if method.is_classmethod else None
                return frozenset({Fn(method.key, self_atom)})
            return SOME
        if isinstance(atom, ClientClass):
            return frozenset({Fn(f"<client>.{atom.kind}.{attr}", atom)})
        if isinstance(atom, Obj):
            return self._instance_attribute(atom, attr, frame)
        if isinstance(atom, NameMap | Client | Seq):
            return frozenset({Fn(f"<builtin>.{attr}", atom)})
        return SOME

    def _method(self, info: ClassInfo, name: str) -> FuncInfo | None:
        for cls in self.program.mro(info):
            if name in cls.methods:
                return cls.methods[name]
        return None

    def _instance_attribute(self, atom: Obj, attr: str, frame: Frame) -> Atoms:
        fields = self.settings_fields.get(atom.cls, {})
        if attr in fields:
            target = fields[attr]
            if isinstance(target, str):
                return frozenset({Name(("setting", target))})
            return frozenset({NameMap(tuple(sorted(target.items())))})
        info = self.program.classes[atom.cls]
        method = self._method(info, attr)
        if method is not None:
            if method.is_property:
                summary = self.call(method, {"self": frozenset({atom})}, None)
                self._merge(frame, summary)
                return summary.returns
            self_atom = (
                None
                if method.is_staticmethod
                else (Cls(atom.cls) if method.is_classmethod else atom)
            )
            return frozenset({Fn(method.key, self_atom)})
        key = (atom, attr)
        if key in self._attributes:
            return self._attributes[key]
        if key in self._attr_active:
            return NOTHING
        self._attr_active.add(key)
        try:
            found = self._assigned(atom, info, attr)
        finally:
            self._attr_active.discard(key)
        self._attributes[key] = found
        return found

    def _assigned(self, atom: Obj, info: ClassInfo, attr: str) -> Atoms:
        """What ``self.<attr>`` holds: the dataclass field passed, else what methods assign."""
        ctor = dict(atom.ctor)
        for cls in self.program.mro(info):
            if cls.is_dataclass and attr in cls.fields and ctor.get(attr):
                return ctor[attr]
        found: set[Any] = set()
        annotations: set[Any] = set()
        for cls in self.program.mro(info):
            for method in cls.methods.values():
                for node in method.body_nodes:
                    value = _self_assignment(node, attr)
                    if value is None:
                        continue
                    bindings = dict(ctor) if method.node.name == "__init__" else {}
                    bindings["self"] = frozenset({atom})
                    method_frame = self._frame_for(method, bindings)
                    if isinstance(value, tuple):
                        annotation, value = value
                        annotations |= self.annotation(annotation, cls.module, cls)
                    found |= self.eval(value, method_frame) if value is not None else NOTHING
            declared = cls.annotations.get(attr)
            if declared is not None:
                found |= self.eval(declared.value, self._module_frame(cls.module))
                annotations |= self.annotation(declared.annotation, cls.module, cls)
        # Annotations only fill in what no assignment tells (``x: T | None = None``).
        if not _known(frozenset(found)):
            found |= annotations
        if not found and not any(attr in cls.annotations for cls in self.program.mro(info)):
            found |= self._subclass_attribute(info, attr)
        return frozenset(found) if _known(frozenset(found)) else frozenset(found) | SOME

    def _subclass_attribute(self, info: ClassInfo, attr: str) -> Atoms:
        """What ``attr`` holds on an instance of ``info`` whose class declares no such
        attribute: the subclasses' that declare it as a field (an instance known by its
        annotation may be of a subclass: a ``Settings`` that is a ``RetentionSettings``)."""
        found: set[Any] = set()
        for key, sub in self.program.classes.items():
            if sub is info or info not in self.program.mro(sub) or attr not in sub.annotations:
                continue
            found |= self._instance_attribute(Obj(key), attr, self._module_frame(sub.module))
        return frozenset(found)

    # -- calls -------------------------------------------------------------------------------

    def _call_atom(self, callee: Any, node: ast.Call, frame: Frame) -> Atoms | None:
        """What calling ``callee`` returns (its accesses merged into ``frame``); None when it is
        not something the analysis can follow."""
        if isinstance(callee, Cls):
            return self._construct(self.program.classes[callee.cls], node, frame)
        if isinstance(callee, ClientClass):
            named = CONSTRUCTOR_NAMES.get(callee.kind)
            names = self._names_of(node, frame, *named) if named else frozenset()
            return frozenset({Client(callee.kind, names)})
        if not isinstance(callee, Fn):
            return None
        if callee.func.startswith("<client>."):
            _, kind, _ = callee.func.split(".", 2)
            return frozenset({Client(kind)})
        if callee.func.startswith("<builtin>."):
            return _builtin_method(callee.func.rpartition(".")[2], callee.self_atom)
        func = self.program.funcs.get(callee.func)
        if func is None:
            return None
        if func.key in SEND_PRIMITIVES:
            self._send(func, node, frame)
            return NOTHING
        bindings = self._bind(func, node, frame, callee.self_atom)
        closure = self._frames.get(callee.closure) if callee.closure else None
        if closure is None and func.parent is not None:
            closure = self._frame_for(func.parent, {})
        summary = self.call(func, bindings, closure)
        self._merge(frame, summary)
        return summary.returns

    def _construct(self, info: ClassInfo, node: ast.Call, frame: Frame) -> Atoms:
        init = self._method(info, "__init__")
        if init is not None:
            bindings = self._bind(init, node, frame, _SELF)
            del bindings["self"]
            atom = Obj(info.key, tuple(sorted((k, v) for k, v in bindings.items() if v)))
            bindings["self"] = frozenset({atom})
            self._merge(frame, self.call(init, bindings, None))
            return frozenset({atom})
        if info.is_dataclass:
            fields = [f for cls in reversed(list(self.program.mro(info))) for f in cls.fields]
            values = {
                name: self.eval(arg, frame) for name, arg in zip(fields, node.args, strict=False)
            }
            values |= {k.arg: self.eval(k.value, frame) for k in node.keywords if k.arg}
            return frozenset({Obj(info.key, tuple(sorted((k, v) for k, v in values.items() if v)))})
        return frozenset({Obj(info.key)})

    def _bind(
        self, func: FuncInfo, node: ast.Call, frame: Frame, self_atom: Any
    ) -> dict[str, Atoms]:
        params = [p.arg for p in func.params]
        bindings: dict[str, Atoms] = {}
        positional = [p.arg for p in [*func.node.args.posonlyargs, *func.node.args.args]]
        if self_atom is not None and positional:
            bindings["self" if self_atom is _SELF else positional[0]] = frozenset({self_atom})
            positional = positional[1:]
        elif func.cls is not None and func.is_classmethod and positional:
            bindings[positional[0]] = frozenset({Cls(func.cls.key)})
            positional = positional[1:]
        for name, arg in zip(positional, node.args, strict=False):
            if not isinstance(arg, ast.Starred):
                bindings[name] = self._argument(func, name, arg, frame)
        for keyword in node.keywords:
            if keyword.arg in params:
                bindings[keyword.arg] = self._argument(func, keyword.arg, keyword.value, frame)
        return bindings

    def _argument(self, func: FuncInfo, name: str, arg: ast.expr, frame: Frame) -> Atoms:
        """What a call passes for ``name``; where that is unknown, also what it is declared."""
        value = self.eval(arg, frame)
        return value if _known(value) else value | self._declared(func, name)

    def _callbacks(self, node: ast.Call, frame: Frame) -> None:
        """A call the analysis cannot follow (a thread pool, a framework): any function
        passed to it may be called, with whatever arguments."""
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            for atom in self.eval(arg, frame):
                if isinstance(atom, Fn) and atom.func in self.program.funcs:
                    func = self.program.funcs[atom.func]
                    closure = self._frames.get(atom.closure) if atom.closure else None
                    self._merge(frame, self.call(func, {}, closure))

    def _send(self, func: FuncInfo, node: ast.Call, frame: Frame) -> None:
        param = SEND_PRIMITIVES[func.key]
        index = [p.arg for p in func.params].index(param) - 1  # after self
        expr = next((k.value for k in node.keywords if k.arg == param), None)
        if expr is None and index < len(node.args):
            expr = node.args[index]
        for res in self._resources(expr, frame, node):
            self._record(frame, "queue", "send", res, node)

    def _client_call(
        self, node: ast.Call, method: str, bases: Atoms, frame: Frame
    ) -> tuple[Atoms | None, list[Any]]:
        """Client factories and client operations: what the call returns on the clients among
        ``bases`` (None if there are none), and the other bases, to follow as usual."""
        like = [b for b in bases if self._is_client_like(b)]
        clients = [b for b in bases if isinstance(b, Client)]
        if method in FACTORIES and (clients or like):
            kind, keyword = FACTORIES[method]
            return frozenset({Client(kind, self._names_of(node, frame, 0, keyword))}), [
                b for b in bases if not isinstance(b, Client) and b not in like
            ]
        if like and method in TABLE_SERVICE_OPERATIONS:
            for res in self._names_of(node, frame, 0, "table_name"):
                self._record(frame, "table", TABLE_SERVICE_OPERATIONS[method], res, node)
            clients += like
        if not clients:
            return None, list(bases)
        found: set[Any] = set()
        for client in clients:
            if isinstance(client, Client):
                found |= self._operation(client, method, node, frame)
        return frozenset(found), [b for b in bases if b not in clients]

    def _is_client_like(self, atom: Any) -> bool:
        """An app class that implements a client factory (the app's own Table client)."""
        if not isinstance(atom, Obj):
            return False
        info = self.program.classes[atom.cls]
        return any(self._method(info, name) for name in FACTORIES)

    def _operation(self, client: Client, method: str, node: ast.Call, frame: Frame) -> Atoms:
        service = SERVICE_OF_KIND[client.kind]
        if method == "get_blob_client":
            if client.kind == "Container":
                return frozenset({Client("Blob", client.names)})
            return frozenset({Client("Blob", self._names_of(node, frame, 0, "container"))})
        if client.kind == "TableService" and method in TABLE_SERVICE_OPERATIONS:
            for res in self._names_of(node, frame, 0, "table_name"):
                self._record(frame, "table", TABLE_SERVICE_OPERATIONS[method], res, node)
            return NOTHING
        kind = OPERATIONS.get(client.kind, {}).get(method)
        if kind is None:
            if method not in NO_REQUEST and not method.startswith("from_"):
                self.unclassified.add(
                    f"{frame.func.module.rel}:{node.lineno}: {client.kind}.{method}"
                )
            return NOTHING
        names = client.names
        if service == "secret":
            names = self._names_of(node, frame, 0, "name")
        for res in names or {("runtime", "a client whose resource the code does not name")}:
            self._record(frame, service, kind, res, node)
        return NOTHING

    def _names_of(self, node: ast.Call, frame: Frame, index: int, keyword: str) -> frozenset[Res]:
        expr = next((k.value for k in node.keywords if k.arg == keyword), None)
        if expr is None and index < len(node.args):
            expr = node.args[index]
        if expr is None:
            return frozenset()
        return self._resources(expr, frame, node)

    def _resources(self, expr: ast.AST | None, frame: Frame, node: ast.AST) -> frozenset[Res]:
        values = self.eval(expr, frame)
        names = {a.res for a in values if isinstance(a, Name)}
        if not names or any(not isinstance(a, Name) for a in values):
            names = {("runtime", ast.unparse(expr) if expr is not None else "?")}
        return frozenset(names)

    def _record(self, frame: Frame, service: Service, kind: Kind, res: Res, node: ast.AST) -> None:
        where = f"{frame.func.module.rel}:{getattr(node, 'lineno', 0)}"
        frame.summary.accesses.add(Access(service, kind, res, where))

    def _merge(self, frame: Frame, summary: Summary) -> None:
        frame.summary.accesses |= summary.accesses
        frame.summary.reached |= summary.reached

    # -- annotations -------------------------------------------------------------------------

    def annotation(self, node: ast.AST | None, module: Module, cls: ClassInfo | None) -> Atoms:
        if node is None:
            return NOTHING
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                parsed = parse(node.value, mode="eval").body
            except SyntaxError:
                return NOTHING
            return self.annotation(parsed, module, cls)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self.annotation(node.left, module, cls) | self.annotation(
                node.right, module, cls
            )
        if isinstance(node, ast.Subscript):
            head = _dotted(node.value).rpartition(".")[2]
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if head == "Annotated":  # FastAPI's ``Annotated[T, Depends(...)]``: a T
                return self.annotation(items[0], module, cls)
            if head in _UNION_TYPES:
                return self._union(self.annotation(i, module, cls) for i in items)
            if head in _CONTAINER_TYPES:
                if head == "tuple" and not (len(items) == 2 and isinstance(items[1], ast.Constant)):
                    return frozenset({Tup(tuple(self.annotation(i, module, cls) for i in items))})
                return frozenset({Seq(self.annotation(items[0], module, cls))})
            return NOTHING
        dotted = _dotted(node)
        if dotted == "Self" and cls is not None:
            return frozenset({Obj(cls.key)})
        target = self.program.resolve_dotted(module, dotted)
        if target in self.program.classes:
            return frozenset({Obj(target)})
        if target in SDK_CLASSES:
            return frozenset({Client(SDK_CLASSES[target])})
        alias = self._alias(target)
        if alias is not None:
            return self.annotation(alias[1], alias[0], None)
        return NOTHING

    def _alias(self, target: str) -> tuple[Module, ast.expr] | None:
        """The module and value of a module-level type alias ``Name = <annotation>``."""
        name, _, attribute = target.rpartition(".")
        module = self.program.modules.get(name)
        if module is None:
            return None
        for node in module.tree.body:
            if isinstance(node, ast.Assign) and [_dotted(t) for t in node.targets] == [attribute]:
                return module, node.value
        return None

    @staticmethod
    def _union(parts: Iterable[Atoms]) -> Atoms:
        found: set[Any] = set()
        for part in parts:
            found |= part
        return frozenset(found)


def _known(atoms: Atoms) -> bool:
    """True when ``atoms`` tell something (more than "unknown")."""
    return any(not isinstance(a, Unknown) for a in atoms)


def _element(atom: Any, keys: Atoms, index: Any) -> Atoms:
    if isinstance(atom, Tup):
        if isinstance(index, int) and -len(atom.items) <= index < len(atom.items):
            return atom.items[index]
        return frozenset().union(*atom.items) if atom.items else NOTHING
    if isinstance(atom, Seq):
        return atom.elements
    if isinstance(atom, NameMap):
        literal = {k.res[1] for k in keys if isinstance(k, Name) and k.res[0] == "literal"}
        table = dict(atom.items)
        if literal and len(literal) == len(keys) and literal <= table.keys():
            return frozenset(Name(("setting", table[k])) for k in literal)
        return frozenset(Name(("setting", s)) for _, s in atom.items)
    return SOME


def _elements(atom: Any) -> Atoms:
    """What iterating ``atom`` yields."""
    if isinstance(atom, Seq):
        return atom.elements
    if isinstance(atom, Tup):
        return frozenset().union(*atom.items) if atom.items else NOTHING
    if isinstance(atom, NameMap):
        return frozenset(Name(("literal", k)) for k, _ in atom.items)
    return SOME


def _builtin_method(method: str, atom: Any) -> Atoms:
    if isinstance(atom, NameMap):
        values = frozenset(Name(("setting", s)) for _, s in atom.items)
        if method == "values":
            return frozenset({Seq(values)})
        if method == "items":
            keys = frozenset(Name(("literal", k)) for k, _ in atom.items)
            return frozenset({Seq(frozenset({Tup((keys, values))}))})
        if method == "get":
            return values
        if method == "keys":
            return frozenset({Seq(frozenset(Name(("literal", k)) for k, _ in atom.items))})
    return SOME


def _self_assignment(node: ast.AST, attr: str) -> ast.expr | tuple[ast.expr, Any] | None:
    """The value ``node`` assigns to ``self.<attr>`` (annotation and value for ``x: T = v``)."""

    def is_target(target: ast.AST) -> bool:
        return (
            isinstance(target, ast.Attribute)
            and target.attr == attr
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
        )

    if isinstance(node, ast.Assign) and any(is_target(t) for t in node.targets):
        return node.value
    if isinstance(node, ast.AnnAssign) and is_target(node.target):
        return (node.annotation, node.value)
    return None


# ------------------------------------------------------------------------- settings and entries


def settings_fields(env: Mapping[str, str], names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Which field each app setting in ``names`` fills: run ``RetentionSettings.from_env`` (the
    settings either app reads) with one setting at a time set to a marker (a valid table, queue
    and container name), and find the marker among the fields of the settings (top level, or a
    value of a mapping field) and of the dataclasses they hold (the retention purge's
    :class:`adapters.retention_settings.Retention`).

    Returns class (``module.Name``) -> field -> setting, or field -> {key: setting} for a
    mapping field; a field of :class:`adapters.settings.Settings` under that class too, which
    the pattern app's code holds.
    """
    from adapters.retention_settings import RetentionSettings
    from adapters.settings import SettingsError

    found: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(sorted(names)):
        marker = "zqmark" + "".join(string.ascii_lowercase[int(d)] for d in str(i))
        try:
            settings = RetentionSettings.from_env({**env, name: marker})
        except SettingsError:
            continue  # not a name: the marker is not a valid value for it
        held = [settings] + [
            value
            for item in dataclasses.fields(settings)
            if dataclasses.is_dataclass(value := getattr(settings, item.name))
        ]
        for holder in held:
            for cls in filter(dataclasses.is_dataclass, type(holder).__mro__):
                fields = found.setdefault(f"{cls.__module__}.{cls.__qualname__}", {})
                for item in dataclasses.fields(cls):
                    value = getattr(holder, item.name)
                    if value == marker:
                        fields[item.name] = name
                    elif isinstance(value, Mapping):
                        keys = [k for k, v in value.items() if v == marker]
                        if keys:
                            fields.setdefault(item.name, {})[keys[0]] = name
    return found


def analyse(
    root: Path,
    entries: Mapping[str, tuple[str, int]],
    env: Mapping[str, str],
    names: Iterable[str],
    entry: str = APP_ENTRY,
) -> CodeAccess:
    """Each function's operations. ``entries``: function name -> (path, line) of its user
    function (for the operations app, of each route's endpoint); ``env``/``names``: the app
    settings the code reads (for :func:`settings_fields`); ``entry``: the app's entry module."""
    program = Program(root, entry)
    fields = settings_fields(env, names)
    funcs = {}
    for function, (rel, line) in entries.items():
        func = program.function_at(rel, line)
        if func is None:
            raise LookupError(f"function {function}: no definition found at {rel}:{line}")
        funcs[function] = func
    # First pass: which functions run at all (for the globals they assign); second: what they do.
    first = Analyzer(program, fields)
    reachable = set().union(*(first.run(func).reached for func in funcs.values()))
    second = Analyzer(program, fields, reachable)
    accesses = {name: frozenset(second.run(func).accesses) for name, func in funcs.items()}
    return CodeAccess(accesses, tuple(sorted(second.unclassified)), _unfollowed(second))


def _unfollowed(analyzer: Analyzer) -> tuple[str, ...]:
    """Client operations called on a value the analysis lost track of, on lines that no
    context resolved (a line resolved elsewhere is the same operation on a known client)."""
    operations = {m for ops in OPERATIONS.values() for m in ops} | set(TABLE_SERVICE_OPERATIONS)
    resolved = {a.where for summary in analyzer._summaries.values() for a in summary.accesses}
    return tuple(
        sorted(
            f"{where}: .{method}()"
            for method, where in analyzer.unknown_receivers
            if method in operations and where not in resolved
        )
    )


def as_json(access: CodeAccess) -> str:
    """The per-function map, for reading (``python -m tests.infra.code_access``)."""
    return json.dumps(
        {
            name: sorted(
                f"{a.service} {a.kind} {a.resource[0]}:{a.resource[1]} @ {a.where}"
                for a in accesses
            )
            for name, accesses in sorted(access.accesses.items())
        },
        indent=2,
    )


if __name__ == "__main__":
    from tests.infra import checks

    for app, facts in checks.code_facts().items():
        print(f"{app} app:", as_json(facts.access))
