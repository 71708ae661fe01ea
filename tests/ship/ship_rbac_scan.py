"""Derive the operator's Kubernetes permissions from its source code (static analysis).

Used by ``test_ship_rbac.py`` to check the chart's ClusterRoles against what the code calls, so
the permission list is never written twice by hand. What counts as "the operator's code": the
module that ``npu-lora operator`` runs (``npu_lora.cli.SUBCOMMANDS["operator"]``) and every
module of ``npu_lora_operator`` / ``npu_lora`` it imports, transitively (``import`` statements
anywhere in a module, plus string literals naming a module of those packages, which covers
``kopf.run(modules=[...])`` and ``importlib.import_module``). Until that entry module exists the
whole ``npu_lora_operator`` package except ``sandbox`` (the test-only API emulator) is scanned and
``Derivation.entry_found`` is False.

Sources of permissions, each mapped with the libraries' own naming:

1. kubernetes client calls. An index is built from the installed ``kubernetes.client.api``
   sources: every public method of every ``*Api`` class → its HTTP method and resource path
   (``BatchV1Api.create_namespaced_job`` → ``POST /apis/batch/v1/namespaces/{namespace}/jobs``
   → ``("batch", "jobs", "create")``). HTTP → verb as the apiserver's authorizer does: POST
   create, GET get (named) / list, PUT update, PATCH patch, DELETE delete / deletecollection;
   a list method passed to ``watch.Watch().stream`` or called with ``watch=True`` adds ``watch``.
   A method referenced without being called (``asyncio.to_thread(api.create_namespaced_job, ns,
   body)``, ``functools.partial``) counts too, its arguments taken from the enclosing call.
   The receiver's class is inferred from assignments/annotations (``x = client.CoreV1Api()``);
   when unknown, every class with that method name counts (over-approximation, e.g. core and
   events.k8s.io ``create_namespaced_event``). ``CustomObjectsApi`` paths take ``group`` and
   ``plural`` from the call's arguments, resolved statically (literals, f-strings, module
   constants, names imported from other modules by importing them).
2. kopf handler decorators (``@kopf.on.<cause>(...)``, ``@kopf.daemon``, ``@kopf.timer``,
   ``@kopf.index``), parsed with kopf's own ``Selector``. kopf watches the resource:
   ``list`` + ``watch``; change-detecting handlers (create/update/delete/resume/field), daemons
   and timers also ``patch`` the object (progress annotations, finalizers, ``patch`` kwarg) and
   its ``/status`` when the resource has a status subresource (handler results).
   ``on.event`` / ``index`` only watch. Webhook handlers (validate/mutate) are refused.
3. RBAC rules the operator creates (dict literals with ``apiGroups``/``resources``/``verbs`` keys,
   or ``V1PolicyRule(...)``): the apiserver lets a client create a Role only with permissions it
   holds itself (escalation prevention), so each such rule is a need of the operator.
4. kopf's own fixed needs when the code imports kopf (kopf 1.45, ``kopf/_core/reactor/
   observation.py`` and its docs' RBAC page): ``create`` core ``events`` (handler events),
   ``list``/``watch`` ``apiextensions.k8s.io`` ``customresourcedefinitions`` (runtime resource
   scanning), and ``list``/``watch`` core ``namespaces`` when not cluster-wide. Standalone mode:
   no peering resources.

Anything that cannot be resolved statically is reported in ``Derivation.unresolved`` (the test
fails on it) rather than guessed.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import itertools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

Perm = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)

OPERATOR_PACKAGE = "npu_lora_operator"
FOLLOW_PACKAGES = ("npu_lora_operator", "npu_lora")
EXCLUDED_WHEN_NO_ENTRY = ("npu_lora_operator.sandbox", "npu_lora_operator.commands.sandbox")

KOPF_WATCH_ONLY = {"event", "index"}
KOPF_CHANGING = {"create", "update", "delete", "resume", "field", "daemon", "timer"}
KOPF_NO_RESOURCE = {"startup", "cleanup", "login", "probe", "subhandler", "register"}
KOPF_WEBHOOKS = {"validate", "mutate"}
KOPF_TOP_LEVEL = ("daemon", "timer", "index")  # kopf.daemon, kopf.timer, kopf.index
#: method names too common to suspect an unrecognised REST-wrapper receiver (dict, list, set ...)
COMMON_METHODS = frozenset(
    [
        "get",
        "pop",
        "update",
        "items",
        "keys",
        "values",
        "append",
        "extend",
        "copy",
        "setdefault",
        "clear",
        "remove",
        "insert",
        "index",
        "count",
        "sort",
        "reverse",
        "add",
        "discard",
        "join",
        "split",
        "format",
        "encode",
        "decode",
        "read",
        "write",
        "close",
    ]
)

HTTP_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


# ---------------------------------------------------------------------------------------------
# kubernetes client index


@dataclass(frozen=True)
class ApiMethod:
    cls: str
    name: str
    http: str
    path: str

    def parse(self) -> tuple[str | None, str | None, bool, bool]:
        """(group or '{group}', resource path part or None, named, namespaced)."""
        segs = [s for s in self.path.split("/") if s]
        if not segs:
            return None, None, False, False
        if segs[0] == "api":
            group, rest = "", segs[2:]
        elif segs[0] == "apis" and len(segs) >= 3:
            group, rest = segs[1], segs[3:]
        else:
            return None, None, False, False  # /version, /openapi, /logs ...
        namespaced = False
        if (
            len(rest) >= 3
            and rest[0] == "namespaces"
            and rest[1] != "{name}"
            and rest[2] not in ("status", "finalize")
        ):
            rest = rest[2:]
            namespaced = True
        if not rest:
            return group, None, False, namespaced  # discovery
        resource = rest[0]
        named = len(rest) >= 2
        if len(rest) >= 3:
            resource = f"{resource}/{rest[2]}"
        return group, resource, named, namespaced

    def verb(self) -> str:
        _, _, named, _ = self.parse()
        if self.http == "GET":
            return "get" if named else "list"
        if self.http == "DELETE":
            return "delete" if named else "deletecollection"
        return HTTP_VERBS[self.http]


_SERIALIZE = re.compile(r"def _(\w+)_serialize\(.*?method='(\w+)',\s*resource_path='([^']+)'", re.S)
_CLASS = re.compile(r"^class (\w+Api)\b", re.M)


@cache
def api_index() -> dict[str, tuple[ApiMethod, ...]]:
    """Method name → every (class, HTTP method, path) of the installed kubernetes client."""
    import kubernetes.client.api as api_pkg

    out: dict[str, list[ApiMethod]] = {}
    for path in sorted(Path(api_pkg.__file__).parent.glob("*_api.py")):
        text = path.read_text()
        cls = _CLASS.search(text)
        if not cls:
            continue
        for m in _SERIALIZE.finditer(text):
            out.setdefault(m.group(1), []).append(
                ApiMethod(cls.group(1), m.group(1), m.group(2), m.group(3))
            )
    return {k: tuple(v) for k, v in out.items()}


@cache
def api_classes() -> frozenset[str]:
    return frozenset(m.cls for ms in api_index().values() for m in ms)


@cache
def known_resources() -> dict[tuple[str, str], bool]:
    """(group, resource) → namespaced, for every resource the client knows (no subresources)."""
    out: dict[tuple[str, str], bool] = {}
    for methods in api_index().values():
        for m in methods:
            group, resource, _, namespaced = m.parse()
            if group is None or resource is None or "{" in group or "{" in resource:
                continue
            if "/" in resource:
                continue
            out[(group, resource)] = out.get((group, resource), False) or namespaced
    return out


def _method_params(m: ApiMethod) -> list[str]:
    import kubernetes.client as k8s

    fn = getattr(getattr(k8s, m.cls), m.name)
    return [p for p in inspect.signature(fn).parameters if p != "self"]


# ---------------------------------------------------------------------------------------------
# results


@dataclass
class Derivation:
    #: permissions needed whatever the watched namespaces (namespaced and cluster-scoped)
    perms: set[Perm] = field(default_factory=set)
    #: additional permissions needed when the operator watches specific namespaces
    namespaced_mode_perms: set[Perm] = field(default_factory=set)
    #: permission → where it comes from ("file:line: why")
    sources: dict[Perm, list[str]] = field(default_factory=dict)
    unresolved: list[str] = field(default_factory=list)
    #: calls named like a REST-wrapper method on a receiver whose type is not inferred
    unknown_receivers: list[str] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    entry_module: str | None = None
    entry_found: bool = False
    uses_kopf: bool = False
    #: the code sets kopf's ``settings.scanning.disabled = True`` (no CRD/namespace observation)
    kopf_scanning_disabled: bool = False

    def add(self, perm: Perm, why: str, *, namespaced_mode_only: bool = False) -> None:
        (self.namespaced_mode_perms if namespaced_mode_only else self.perms).add(perm)
        self.sources.setdefault(perm, []).append(why)

    def needed(self, *, clusterwide: bool) -> set[Perm]:
        return set(self.perms) if clusterwide else self.perms | self.namespaced_mode_perms


def is_cluster_scoped(group: str, resource: str) -> bool:
    """True for cluster-scoped resources (CRDs, namespaces, nodes ...)."""
    from npu_lora.api.v1alpha1 import GROUP, PLURAL

    base = resource.split("/")[0]
    if (group, base) == (GROUP, PLURAL):
        return False
    known = known_resources()
    return (group, base) in known and not known[(group, base)]


# ---------------------------------------------------------------------------------------------
# module discovery


def _module_file(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin and spec.origin.endswith(".py"):
        return Path(spec.origin)
    for loc in spec.submodule_search_locations or []:
        init = Path(loc) / "__init__.py"
        if init.is_file():
            return init
    return None


def _package_modules(package: str) -> list[str]:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, package
    root = Path(next(iter(spec.submodule_search_locations)))
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = [package, *rel.parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append(".".join(parts))
    return out


def _follow(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in FOLLOW_PACKAGES)


def _imports_of(module: str, tree: ast.AST, is_package: bool) -> set[str]:
    out: set[str] = set()
    pkg = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            out.add(mod)
            for alias in node.names:
                out.add(f"{mod}.{alias.name}")  # may be a submodule
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.fullmatch(r"[A-Za-z_][\w.]*", node.value)
            and _follow(node.value)
        ):
            out.add(node.value)
    # importing a.b.c imports a and a.b
    for name in list(out):
        parts = name.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return {n for n in out if _follow(n)}


def operator_modules() -> tuple[list[str], str | None, bool]:
    """(modules to scan, entry module name, entry module exists)."""
    try:
        from npu_lora.cli import SUBCOMMANDS

        entry = SUBCOMMANDS["operator"][0]
    except (ImportError, KeyError):
        entry = None
    if entry and _module_file(entry):
        seen: set[str] = set()
        todo = [entry]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            path = _module_file(name)
            if path is None:
                continue
            seen.add(name)
            tree = ast.parse(path.read_text(), str(path))
            todo.extend(_imports_of(name, tree, path.name == "__init__.py") - seen)
        return sorted(seen), entry, True
    mods = [
        m
        for m in _package_modules(OPERATOR_PACKAGE)
        if not any(m == x or m.startswith(x + ".") for x in EXCLUDED_WHEN_NO_ENTRY)
    ]
    return mods, entry, False


# ---------------------------------------------------------------------------------------------
# static value resolution


class _Unresolved(Exception):
    pass


class ModuleScope:
    """Resolves expressions of one module to the set of string values they can take."""

    def __init__(self, name: str, tree: ast.Module):
        self.name = name
        self.tree = tree
        self.assigns: dict[str, list[ast.expr]] = {}
        self.imports: dict[str, tuple[str, str | None]] = {}  # local → (module, attr|None)
        pkg = name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    for n in _target_names(t):
                        self.assigns.setdefault(n, []).append(node.value)
            elif isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
                for n in _target_names(node.target):
                    self.assigns.setdefault(n, []).append(node.value)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.imports[a.asname] = (a.name, None)
                    else:
                        top = a.name.split(".")[0]
                        self.imports[top] = (top, None)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join([*base, node.module] if node.module else base)
                else:
                    mod = node.module or ""
                for a in node.names:
                    self.imports[a.asname or a.name] = (mod, a.name)

    # -- imported values
    def _imported(self, local: str) -> object:
        mod, attr = self.imports[local]
        if attr is None:
            return importlib.import_module(mod)
        m = importlib.import_module(mod)
        if hasattr(m, attr):
            return getattr(m, attr)
        return importlib.import_module(f"{mod}.{attr}")

    def _py_value(self, node: ast.expr) -> object:
        """Value of a Name/Attribute chain rooted at an import, else raise _Unresolved."""
        if isinstance(node, ast.Name) and node.id in self.imports:
            try:
                return self._imported(node.id)
            except Exception as e:
                raise _Unresolved(f"cannot import {self.imports[node.id]}: {e}") from e
        if isinstance(node, ast.Attribute):
            base = self._py_value(node.value)
            if hasattr(base, node.attr):
                return getattr(base, node.attr)
        raise _Unresolved(ast.unparse(node))

    def strings(self, node: ast.expr, _depth: int = 0) -> set[str]:
        if _depth > 20:
            raise _Unresolved(ast.unparse(node))
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, ast.JoinedStr):
            parts: list[set[str]] = []
            for v in node.values:
                if isinstance(v, ast.Constant):
                    parts.append({str(v.value)})
                elif isinstance(v, ast.FormattedValue) and v.format_spec is None:
                    parts.append(self.strings(v.value, _depth + 1))
                else:
                    raise _Unresolved(ast.unparse(node))
            return {"".join(p) for p in itertools.product(*parts)}
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left = self.strings(node.left, _depth + 1)
            right = self.strings(node.right, _depth + 1)
            return {a + b for a in left for b in right}
        if isinstance(node, ast.IfExp):
            return self.strings(node.body, _depth + 1) | self.strings(node.orelse, _depth + 1)
        if isinstance(node, ast.Name) and node.id in self.assigns:
            out: set[str] = set()
            for value in self.assigns[node.id]:
                out |= self.strings(value, _depth + 1)
            return out
        if isinstance(node, ast.Name | ast.Attribute):
            value = self._py_value(node)
            if isinstance(value, str):
                return {value}
        raise _Unresolved(ast.unparse(node))

    def string_list(self, node: ast.expr, _depth: int = 0) -> set[str]:
        """Values of a list/tuple/set of strings (any element)."""
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            out: set[str] = set()
            for elt in node.elts:
                if isinstance(elt, ast.Starred):
                    out |= self.string_list(elt.value, _depth + 1)
                else:
                    out |= self.strings(elt, _depth + 1)
            return out
        if isinstance(node, ast.Name) and node.id in self.assigns and _depth < 20:
            out = set()
            for value in self.assigns[node.id]:
                out |= self.string_list(value, _depth + 1)
            return out
        if isinstance(node, ast.Name | ast.Attribute):
            value = self._py_value(node)
            if isinstance(value, list | tuple | set | frozenset) and all(
                isinstance(x, str) for x in value
            ):
                return set(value)
        raise _Unresolved(ast.unparse(node))


def _target_names(t: ast.expr) -> Iterator[str]:
    if isinstance(t, ast.Name):
        yield t.id
    elif isinstance(t, ast.Attribute):
        yield ast.unparse(t)  # self.x
    elif isinstance(t, ast.Tuple | ast.List):
        for e in t.elts:
            yield from _target_names(e)


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


# ---------------------------------------------------------------------------------------------
# the scan


class _Scanner:
    def __init__(self, d: Derivation, program: Program, module: str):
        self.d = d
        self.program = program
        self.module = module
        self.path, self.tree, self.scope = program.load(module)  # type: ignore[misc]
        self.parents = program.parents(module)
        self.known_classes = api_classes() | set(program.wrappers)
        self.evaluator = Evaluator(program)
        self.types = self._api_types()
        self.kopf_aliases, self.kopf_on_aliases = self._kopf_aliases()

    def where(self, node: ast.AST) -> str:
        return f"{self.path.name}:{getattr(node, 'lineno', '?')}"

    # -- receiver types: name (or "self.x") → kubernetes Api class
    def _api_class_of(self, node: ast.expr | None) -> str | None:
        if node is None:
            return None
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name and name.split(".")[-1] in self.known_classes:
                return name.split(".")[-1]
        if isinstance(node, ast.Await):
            return self._api_class_of(node.value)
        name = _dotted(node)
        if name and name.split(".")[-1] in self.known_classes:
            return name.split(".")[-1]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            last = node.value.split(".")[-1]
            return last if last in self.known_classes else None
        if isinstance(node, ast.BinOp):  # Optional[X] / X | None
            return self._api_class_of(node.left) or self._api_class_of(node.right)
        if isinstance(node, ast.Subscript):
            return self._api_class_of(node.slice)
        return None

    def _api_types(self) -> dict[str, set[str]]:
        types: dict[str, set[str]] = {}
        returns: dict[str, str] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                cls = self._api_class_of(node.returns)
                if cls:
                    returns[node.name] = cls
        for _ in range(2):  # twice: `kube = STATE.kube` after `self.kube = Kube()`
            for node in ast.walk(self.tree):
                pairs: list[tuple[str, str | None]] = []
                if isinstance(node, ast.Assign):
                    cls = self._api_class_of(node.value)
                    if cls is None and isinstance(node.value, ast.Call):
                        fname = _dotted(node.value.func)
                        cls = returns.get((fname or "").split(".")[-1])
                    if cls is None:
                        known = self._lookup(types, node.value)
                        cls = next(iter(known)) if known and len(known) == 1 else None
                    pairs = [(n, cls) for t in node.targets for n in _target_names(t)]
                elif isinstance(node, ast.AnnAssign):
                    cls = self._api_class_of(node.annotation) or self._api_class_of(node.value)
                    pairs = [(n, cls) for n in _target_names(node.target)]
                elif isinstance(node, ast.arg):
                    pairs = [(node.arg, self._api_class_of(node.annotation))]
                elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                    cls = self._api_class_of(node.context_expr)
                    pairs = [(n, cls) for n in _target_names(node.optional_vars)]
                for n, cls in pairs:
                    if cls:
                        types.setdefault(n, set()).add(cls)
                        if "." in n:  # self.kube → any `<x>.kube`
                            types.setdefault("." + n.rsplit(".", 1)[1], set()).add(cls)
        return types

    @staticmethod
    def _lookup(types: dict[str, set[str]], node: ast.expr) -> set[str] | None:
        name = _dotted(node)
        if name is None:
            return None
        if name in types:
            return types[name]
        if "." in name:
            return types.get("." + name.rsplit(".", 1)[1])
        return None

    def _receiver_classes(self, node: ast.expr) -> set[str] | None:
        cls = self._api_class_of(node)
        if cls:
            return {cls}
        found = self._lookup(self.types, node)
        if found:
            return found
        name = _dotted(node)
        if name and "kube" in name.lower() and len(self.program.wrappers) == 1:
            return set(self.program.wrappers)  # heuristic: `kube`, `self.kube`, `STATE.kube`
        return None

    # -- kopf
    def _kopf_aliases(self) -> tuple[set[str], set[str]]:
        kopf_names, on_names = set(), set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == "kopf":
                        kopf_names.add(a.asname or "kopf")
                        self.d.uses_kopf = True
            elif isinstance(node, ast.ImportFrom) and node.module == "kopf":
                self.d.uses_kopf = True
                for a in node.names:
                    if a.name == "on":
                        on_names.add(a.asname or "on")
        return kopf_names, on_names

    def _kopf_cause(self, func: ast.expr) -> str | None:
        name = _dotted(func)
        if not name:
            return None
        parts = name.split(".")
        if len(parts) == 3 and parts[0] in self.kopf_aliases and parts[1] == "on":
            return parts[2]
        if len(parts) == 2 and parts[0] in self.kopf_on_aliases:
            return parts[1]
        if len(parts) == 2 and parts[0] in self.kopf_aliases and parts[1] in KOPF_TOP_LEVEL:
            return parts[1]
        return None

    def scan(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for dec in node.decorator_list:
                    if isinstance(dec, ast.Call):
                        cause = self._kopf_cause(dec.func)
                        if cause:
                            self._kopf_handler(cause, dec)
                    elif self._kopf_cause(dec):
                        self.d.unresolved.append(
                            f"{self.where(dec)}: kopf decorator without a resource"
                        )
            elif isinstance(node, ast.Attribute):
                if not self._wrapper_call(node):
                    self._api_reference(node)
            elif isinstance(node, ast.Dict):
                self._rule_dict(node)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if (
                        (_dotted(t) or "").endswith("scanning.disabled")
                        and isinstance(node.value, ast.Constant)
                        and node.value.value is True
                    ):
                        self.d.kopf_scanning_disabled = True
            elif isinstance(node, ast.Call):
                fname = _dotted(node.func) or ""
                if fname.split(".")[-1] == "V1PolicyRule":
                    self._rule_call(node)

    def _kopf_handler(self, cause: str, call: ast.Call) -> None:
        from kopf._cogs.structs.references import Selector

        if cause in KOPF_NO_RESOURCE:
            return
        if cause in KOPF_WEBHOOKS:
            self.d.unresolved.append(
                f"{self.where(call)}: kopf.on.{cause} (admission webhooks) is not supported by "
                "the chart (no webhook Service/configuration RBAC)"
            )
            return
        if cause not in KOPF_WATCH_ONLY | KOPF_CHANGING:
            self.d.unresolved.append(f"{self.where(call)}: unknown kopf handler kind {cause!r}")
            return
        try:
            pos = [self.scope.strings(a) for a in call.args[:3]]
            kw = {
                k.arg: self.scope.strings(k.value)
                for k in call.keywords
                if k.arg in ("group", "version", "kind", "plural", "singular", "shortcut")
            }
        except _Unresolved as e:
            self.d.unresolved.append(f"{self.where(call)}: kopf.{cause} resource: {e}")
            return
        kw_keys = list(kw)
        for combo in itertools.product(*pos, *(kw[k] for k in kw_keys)):
            args = combo[: len(pos)]
            kwargs = dict(zip(kw_keys, combo[len(pos) :], strict=True))
            sel = Selector(*args, **kwargs)
            resolved = _resolve_selector(sel)
            if resolved is None:
                self.d.unresolved.append(
                    f"{self.where(call)}: kopf.{cause}{tuple(args)} names no known resource"
                )
                continue
            group, plural = resolved
            why = f"{self.where(call)}: kopf.on.{cause} watches {plural}"
            for verb in ("list", "watch"):
                self.d.add((group, plural, verb), why)
            if cause in KOPF_CHANGING:
                self.d.add((group, plural, "patch"), why + " (progress/finalizers/patch)")
                if _has_status(group, plural):
                    self.d.add((group, f"{plural}/status", "patch"), why + " (handler results)")

    def _call_context(self, node: ast.Attribute) -> tuple[list[ast.expr], list[ast.keyword], str]:
        """Arguments the API method receives: its own call's, or those after it in the
        enclosing call when passed as a function (to_thread, partial, Watch.stream)."""
        parent = self.parents.get(node)
        if isinstance(parent, ast.Call) and parent.func is node:
            return list(parent.args), list(parent.keywords), "call"
        if isinstance(parent, ast.Call) and node in parent.args:
            i = parent.args.index(node)
            outer = (_dotted(parent.func) or "").split(".")[-1]
            kind = "stream" if outer == "stream" else "passed"
            rest = parent.args[i + 1 :]
            if outer == "run_in_executor":
                kind = "passed"
            return list(rest), list(parent.keywords), kind
        return [], [], "reference"

    def _wrapper_call(self, node: ast.Attribute) -> bool:
        """``kube.<method>(...)`` on a REST wrapper: run the method on a recorder."""
        parent = self.parents.get(node)
        if not (isinstance(parent, ast.Call) and parent.func is node) or not self.program.wrappers:
            return False
        classes = self._receiver_classes(node.value) or set()
        classes = {c for c in classes if c in self.program.wrappers}
        if not classes:
            names = set().union(*self.program.wrapper_methods.values()) | {"request"}
            root = (_dotted(node.value) or "").split(".")[0]
            if (
                node.attr in names - COMMON_METHODS
                and _dotted(node.value) not in ("self", "cls")  # the wrapper's own calls
                and root not in self.scope.imports  # a module's function (kopf.on.create ...)
            ):
                self.d.unknown_receivers.append(
                    f"{self.where(node)}: {ast.unparse(parent)[:80]} (receiver type unknown: "
                    "annotate it with the wrapper class if it is one)"
                )
            return False
        where = self.where(node)
        for cls_name in sorted(classes):
            if node.attr not in self.program.wrapper_methods[cls_name] | {"request"}:
                continue
            cls = self.program.wrappers[cls_name]
            if any(isinstance(a, ast.Starred) for a in parent.args) or any(
                k.arg is None for k in parent.keywords
            ):
                self.d.unresolved.append(f"{where}: {cls_name}.{node.attr}(*args/**kwargs)")
                continue
            params = [
                p for p in inspect.signature(getattr(cls, node.attr)).parameters if p != "self"
            ]
            ev = self.evaluator
            ctx = Ctx(self.module, self.program.enclosing_function(self.module, parent))
            exprs = [*parent.args, *(k.value for k in parent.keywords)]
            roots = ev.roots(exprs, ctx)
            root_values = [ev.values(ast.Name(id=r), ctx, {}) for r in roots]
            recorded: set[tuple[str, str]] = set()
            errors: list[str] = []
            combos = itertools.islice(itertools.product(*root_values), _MAX_COMBOS)
            for combo in combos:
                env = dict(zip(roots, combo, strict=True))
                arg_vals = [ev.values(a, ctx, env) for a in parent.args]
                kw_names = [k.arg for k in parent.keywords]
                kw_vals = [ev.values(k.value, ctx, env) for k in parent.keywords]
                for call in itertools.islice(itertools.product(*arg_vals, *kw_vals), _MAX_COMBOS):
                    args = list(call[: len(arg_vals)])
                    kwargs = dict(zip(kw_names, call[len(arg_vals) :], strict=True))
                    args = [
                        f"{{{params[i] if i < len(params) else i}}}" if v is UNKNOWN else v
                        for i, v in enumerate(args)
                    ]
                    kwargs = {k: f"{{{k}}}" if v is UNKNOWN else v for k, v in kwargs.items()}
                    rec = _recorder(cls)
                    try:
                        getattr(rec, node.attr)(*args, **kwargs)
                    except Exception as e:
                        errors.append(f"{type(e).__name__}: {e}")
                    recorded.update(rec.recorded)
            if errors and not recorded:
                self.d.unresolved.append(
                    f"{where}: {cls_name}.{node.attr}: cannot evaluate the call statically "
                    f"({errors[0]})"
                )
            for http, path in sorted(recorded):
                perm = perm_of_request(http, path)
                if perm is None:
                    continue
                if "{" in perm[0] + perm[1] or "%7B" in perm[0] + perm[1]:
                    self.d.unresolved.append(
                        f"{where}: {cls_name}.{node.attr}: resource not static ({http} {path})"
                    )
                    continue
                self.d.add(perm, f"{where}: {cls_name}.{node.attr} -> {http} {path}")
        return True

    def _api_reference(self, node: ast.Attribute) -> None:
        attr = node.attr
        for suffix in ("_with_http_info", "_without_preload_content"):
            attr = attr.removesuffix(suffix)
        methods = api_index().get(attr)
        if not methods or attr.startswith("_"):
            return
        classes = self._receiver_classes(node.value)
        candidates = [m for m in methods if classes is None or m.cls in classes]
        if not candidates:
            return  # same name on an unrelated object
        args, keywords, kind = self._call_context(node)
        watch = kind == "stream" or any(
            k.arg == "watch" and isinstance(k.value, ast.Constant) and k.value.value is True
            for k in keywords
        )
        for m in candidates:
            group, resource, _, _ = m.parse()
            if resource is None:
                continue  # discovery (get_api_resources, get_api_group)
            verb = m.verb()
            why = f"{self.where(node)}: {m.cls}.{m.name}"
            groups, resources = {group}, {resource}
            if "{" in (group or "") or "{" in resource:
                try:
                    values = self._bind(m, args, keywords)
                except _Unresolved as e:
                    self.d.unresolved.append(f"{why}: cannot resolve argument {e}")
                    continue
                groups = values.get("group", {group}) if group == "{group}" else {group}
                base, _, sub = resource.partition("/")
                key = base.strip("{}")
                plurals = values.get(key) if base.startswith("{") else {base}
                if not plurals or not groups or None in groups:
                    self.d.unresolved.append(f"{why}: group/plural not passed")
                    continue
                resources = {f"{p}/{sub}" if sub else p for p in plurals}
            for g in groups:
                for r in resources:
                    self.d.add((g, r, verb), why)  # type: ignore[arg-type]
                    if watch and verb == "list":
                        self.d.add((g, r, "watch"), why + " (watch)")

    def _bind(
        self, m: ApiMethod, args: list[ast.expr], keywords: list[ast.keyword]
    ) -> dict[str, set[str]]:
        params = _method_params(m)
        wanted = {"group", "plural", "resource_plural"}
        out: dict[str, set[str]] = {}
        for p, a in zip(params, args, strict=False):
            if p in wanted:
                out[p] = self.scope.strings(a)
        for k in keywords:
            if k.arg in wanted:
                out[k.arg] = self.scope.strings(k.value)
            elif k.arg is None:
                raise _Unresolved(f"**{ast.unparse(k.value)}")
        return out

    # -- RBAC rules the operator grants
    def _rule_dict(self, node: ast.Dict) -> None:
        keys = {
            k.value: v
            for k, v in zip(node.keys, node.values, strict=True)
            if isinstance(k, ast.Constant) and isinstance(k.value, str)
        }
        if not {"apiGroups", "resources", "verbs"} <= keys.keys():
            return
        self._rule(node, keys["apiGroups"], keys["resources"], keys["verbs"])

    def _rule_call(self, node: ast.Call) -> None:
        kw = {k.arg: k.value for k in node.keywords}
        if not {"api_groups", "resources", "verbs"} <= kw.keys():
            self.d.unresolved.append(f"{self.where(node)}: V1PolicyRule without keywords")
            return
        self._rule(node, kw["api_groups"], kw["resources"], kw["verbs"])

    def _rule(self, node: ast.AST, groups: ast.expr, resources: ast.expr, verbs: ast.expr) -> None:
        try:
            gs = self.scope.string_list(groups)
            rs = self.scope.string_list(resources)
            vs = self.scope.string_list(verbs)
        except _Unresolved as e:
            self.d.unresolved.append(f"{self.where(node)}: RBAC rule: cannot resolve {e}")
            return
        why = f"{self.where(node)}: granted in a Role the operator creates (escalation check)"
        for g, r, v in itertools.product(gs, rs, vs):
            self.d.add((g, r, v), why)


def _has_status(group: str, plural: str) -> bool:
    from npu_lora.api.v1alpha1 import GROUP, PLURAL

    if (group, plural) == (GROUP, PLURAL):
        return True  # the CRD declares the status subresource (DESIGN §2)
    return any(
        m.parse()[:2] == (group, f"{plural}/status") for ms in api_index().values() for m in ms
    )


def _resolve_selector(sel: object) -> tuple[str, str] | None:
    """kopf Selector → (group, plural) among the client's resources and the MoEFinetune CRD."""
    from npu_lora.api.v1alpha1 import GROUP, KIND, PLURAL, SHORT_NAME, SINGULAR

    group = getattr(sel, "group", None)
    names = {
        n
        for n in (
            getattr(sel, "plural", None),
            getattr(sel, "any_name", None),
            getattr(sel, "kind", None),
            getattr(sel, "singular", None),
            getattr(sel, "shortcut", None),
        )
        if isinstance(n, str)
    }
    if not names:
        return None
    ours = {PLURAL, KIND, SINGULAR, SHORT_NAME, KIND.lower()}
    if names & ours and group in (None, GROUP):
        return GROUP, PLURAL
    matches = set()
    for g, r in known_resources():
        if group is not None and g != group:
            continue
        for n in names:
            low = n.lower()
            if r in (n, low, low + "s", low + "es") or (
                low.endswith("y") and r == low[:-1] + "ies"
            ):
                matches.add((g, r))
    if len(matches) == 1:
        return matches.pop()
    if group is None:
        core = {m for m in matches if m[0] == ""}
        if len(core) == 1:
            return core.pop()
    return None


def derive(modules: Iterable[str] | None = None) -> Derivation:
    """Scan the operator's modules (default: see :func:`operator_modules`)."""
    d = Derivation()
    if modules is None:
        mods, entry, found = operator_modules()
        d.entry_module, d.entry_found = entry, found
    else:
        mods = list(modules)
        d.entry_found = True
    d.modules = mods
    program = Program()
    for name in mods:
        if program.load(name) is None:
            d.unresolved.append(f"{name}: module not found")
    found = [m for m in mods if m in program.modules]
    program.find_wrappers(found)
    for name in found:
        _Scanner(d, program, name).scan()
    _add_kopf_fixed(d)
    return d


def _add_kopf_fixed(d: Derivation) -> None:
    """kopf's own needs (see the module docstring, item 4)."""
    if not d.uses_kopf:
        return
    why = "kopf (framework)"
    d.add(("", "events", "create"), why + ": posts handler events")
    if d.kopf_scanning_disabled:
        return  # settings.scanning.disabled: kopf neither observes CRDs nor namespaces
    for verb in ("list", "watch"):
        d.add(
            ("apiextensions.k8s.io", "customresourcedefinitions", verb),
            why + ": runtime resource scanning",
        )
        d.add(
            ("", "namespaces", verb),
            why + ": namespace observation (not cluster-wide)",
            namespaced_mode_only=True,
        )


def derive_source(source: str, path: Path) -> Derivation:
    """Scan one piece of source text as if it were the whole operator (the scanner's own tests).

    The text is written to ``path`` (a fresh ``*.py`` in a temporary directory) and imported from
    there under that file's stem, so the REST-wrapper recorder can run its methods."""
    import sys

    global FOLLOW_PACKAGES
    path.write_text(source)
    name = path.stem
    sys.path.insert(0, str(path.parent))
    saved = FOLLOW_PACKAGES
    FOLLOW_PACKAGES = (*saved, name)
    try:
        importlib.invalidate_caches()
        sys.modules.pop(name, None)
        return derive([name])
    finally:
        FOLLOW_PACKAGES = saved
        sys.path.remove(str(path.parent))
        sys.modules.pop(name, None)


# ---------------------------------------------------------------------------------------------
# REST wrappers: classes of the operator that send raw requests (e.g. ``kube.Kube``)
#
# A class whose methods call ``call_api`` is a REST wrapper. A call ``kube.<method>(args)`` on an
# instance is resolved by *running the real method* on a recording subclass (its ``request``
# records ``(HTTP method, path)`` instead of sending), with the call's arguments evaluated
# statically (see :class:`Evaluator`); the recorded path is mapped to (group, resource, verb)
# like the typed client's paths.

UNKNOWN = object()  # a value the static evaluator cannot know
_MAX_COMBOS = 512


class Program:
    """Parsed modules of the operator (and, on demand, any module of FOLLOW_PACKAGES)."""

    def __init__(self) -> None:
        self.modules: dict[str, tuple[Path, ast.Module, ModuleScope]] = {}
        self.wrappers: dict[str, type] = {}  # class name → class object
        self.wrapper_methods: dict[str, set[str]] = {}
        self.wrapper_modules: set[str] = set()
        self._parents: dict[str, dict[ast.AST, ast.AST]] = {}
        self._calls: dict[str, list[ast.Call]] = {}
        self._callers: dict[tuple[str, str, int], list[tuple[str, ast.Call]]] = {}

    def load(self, name: str) -> tuple[Path, ast.Module, ModuleScope] | None:
        if name not in self.modules:
            path = _module_file(name)
            if path is None:
                return None
            tree = ast.parse(path.read_text(), str(path))
            self.modules[name] = (path, tree, ModuleScope(name, tree))
        return self.modules[name]

    def parents(self, module: str) -> dict[ast.AST, ast.AST]:
        if module not in self._parents:
            tree = self.modules[module][1]
            par: dict[ast.AST, ast.AST] = {}
            for node in ast.walk(tree):
                for child in ast.iter_child_nodes(node):
                    par[child] = node
            self._parents[module] = par
        return self._parents[module]

    def enclosing_function(self, module: str, node: ast.AST) -> ast.AST | None:
        par = self.parents(module)
        cur = par.get(node)
        while cur is not None and not isinstance(cur, ast.FunctionDef | ast.AsyncFunctionDef):
            cur = par.get(cur)
        return cur

    def find_wrappers(self, names: Iterable[str]) -> None:
        for name in names:
            loaded = self.load(name)
            if loaded is None:
                continue
            _, tree, _ = loaded
            for node in tree.body:
                if not isinstance(node, ast.ClassDef):
                    continue
                calls_api = any(
                    isinstance(n, ast.Attribute) and n.attr == "call_api" for n in ast.walk(node)
                )
                if not calls_api:
                    continue
                cls = getattr(importlib.import_module(name), node.name)
                self.wrappers[node.name] = cls
                self.wrapper_modules.add(name)
                self.wrapper_methods[node.name] = {
                    f.name
                    for f in node.body
                    if isinstance(f, ast.FunctionDef)
                    and not f.name.startswith("_")
                    and not any(_dotted(d) == "property" for d in f.decorator_list)
                }

    def function(self, module: str, name: str) -> tuple[str, ast.FunctionDef] | None:
        """A module-level function ``name`` visible in ``module`` (defined or imported)."""
        loaded = self.load(module)
        if loaded is None:
            return None
        _, tree, scope = loaded
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                return module, node  # type: ignore[return-value]
        if name in scope.imports:
            mod, attr = scope.imports[name]
            if attr and _follow(mod):
                return self.function(mod, attr)
        return None

    def calls(self, module: str) -> list[ast.Call]:
        if module not in self._calls:
            tree = self.modules[module][1]
            self._calls[module] = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        return self._calls[module]

    def callers(self, module: str, fn: ast.FunctionDef) -> list[tuple[str, ast.Call]]:
        """Calls of module-level function ``fn`` from every loaded module."""
        key = (module, fn.name, len(self.modules))
        if key in self._callers:
            return self._callers[key]
        out = []
        for mod, (_, _tree, scope) in list(self.modules.items()):
            for node in self.calls(mod):
                f = node.func
                if isinstance(f, ast.Name) and f.id == fn.name:
                    if mod == module or scope.imports.get(fn.name) == (module, fn.name):
                        out.append((mod, node))
                elif isinstance(f, ast.Attribute) and f.attr == fn.name:
                    base = _dotted(f.value)
                    if base and scope.imports.get(base, (None, None)) in (
                        (module, None),
                        (module.rpartition(".")[0], module.rpartition(".")[2]),
                    ):
                        out.append((mod, node))
        self._callers[key] = out
        return out


@dataclass(frozen=True)
class Ctx:
    module: str
    fn: ast.AST | None  # enclosing FunctionDef, or None at module level


class Evaluator:
    """Possible values of an expression: a small, conservative static evaluator.

    Lists are flattened into their elements (iterating a list yields each element); dict
    literals with ``apiVersion`` and ``kind`` become placeholder objects carrying those two (and a
    ``metadata`` with ``{name}``/``{namespace}`` placeholders); a function parameter takes the
    values of the arguments at every call site; a call to a module-level function of the
    operator runs it for real when every argument is a known string/number/None, and otherwise
    yields the values of its ``return`` expressions. Anything else is :data:`UNKNOWN`.
    """

    def __init__(self, program: Program):
        self.p = program
        self._stack: set[tuple[int, tuple]] = set()
        self._locals_cache: dict[tuple[int, str], list[tuple[str, ast.AST]]] = {}

    # -- helpers
    def _locals(self, ctx: Ctx, name: str) -> list[tuple[str, ast.AST]]:
        """Bindings of ``name`` inside ctx.fn: ('assign' | 'for', expr)."""
        if ctx.fn is None:
            return []
        key = (id(ctx.fn), name)
        if key not in self._locals_cache:
            self._locals_cache[key] = self._find_locals(ctx.fn, name)
        return self._locals_cache[key]

    def _find_locals(self, fn: ast.AST, name: str) -> list[tuple[str, ast.AST]]:
        out: list[tuple[str, ast.AST]] = []
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                if any(name in _target_names(t) for t in node.targets):
                    out.append(("assign", node.value))
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                if name in _target_names(node.target):
                    out.append(("assign", node.value))
            elif isinstance(node, ast.AugAssign) and name in _target_names(node.target):
                out.append(("assign", node.value))
            elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
                if name in _target_names(node.target):
                    out.append(("for", node.iter))
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                if name in _target_names(node.optional_vars):
                    out.append(("assign", node.context_expr))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == name
                and node.func.attr in ("append", "extend", "insert")
                and node.args
            ):
                out.append(("assign", node.args[-1]))
        return out

    def _params(self, fn: ast.AST | None) -> list[str]:
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            return []
        a = fn.args
        return [x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]]

    def roots(self, exprs: Iterable[ast.AST], ctx: Ctx) -> list[str]:
        """Names the expressions depend on that vary per binding (params and loop targets)."""
        seen: set[str] = set()
        out: list[str] = []
        todo = [n.id for e in exprs for n in ast.walk(e) if isinstance(n, ast.Name)]
        params = set(self._params(ctx.fn))
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            binds = self._locals(ctx, name)
            if name in params or any(kind == "for" for kind, _ in binds):
                out.append(name)
            for _, e in binds:
                todo.extend(n.id for n in ast.walk(e) if isinstance(n, ast.Name))
        return sorted(out)

    # -- evaluation
    def values(self, node: ast.AST, ctx: Ctx, env: dict[str, object]) -> list[object]:
        key = (id(node), tuple(sorted((k, id(v)) for k, v in env.items())))
        if key in self._stack or len(self._stack) > 60:
            return [UNKNOWN]
        self._stack.add(key)
        try:
            out = self._values(node, ctx, env)
        finally:
            self._stack.discard(key)
        uniq: list[object] = []
        for v in out:
            if not any(v is u or (type(v) is type(u) and v == u) for u in uniq):
                uniq.append(v)
        return uniq or [UNKNOWN]

    def _values(self, node: ast.AST, ctx: Ctx, env: dict[str, object]) -> list[object]:
        scope = self.p.modules[ctx.module][2]
        if isinstance(node, ast.Constant):
            return [node.value]
        if isinstance(node, ast.JoinedStr | ast.BinOp):
            try:
                return sorted(scope.strings(node))  # type: ignore[arg-type]
            except _Unresolved:
                pass
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
                out = []
                for a in self.values(node.left, ctx, env):
                    for b in self.values(node.right, ctx, env):
                        try:
                            out.append(a + b)  # type: ignore[operator]
                        except TypeError:
                            out.append(UNKNOWN)
                return out
            return [UNKNOWN]
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            out = []
            for e in node.elts:
                out.extend(self.values(e.value if isinstance(e, ast.Starred) else e, ctx, env))
            return out
        if isinstance(node, ast.Dict):
            return self._dict(node, ctx, env)
        if isinstance(node, ast.IfExp):
            return self.values(node.body, ctx, env) + self.values(node.orelse, ctx, env)
        if isinstance(node, ast.BoolOp):
            return [v for e in node.values for v in self.values(e, ctx, env)]
        if isinstance(node, ast.Name):
            return self._name(node.id, ctx, env)
        if isinstance(node, ast.Subscript):
            out = []
            keys = self.values(node.slice, ctx, env)
            for base in self.values(node.value, ctx, env):
                for k in keys:
                    if isinstance(base, dict) and not isinstance(k, dict) and k in base:
                        out.append(base[k])
                    else:
                        out.append(UNKNOWN)
            return out
        if isinstance(node, ast.Attribute):
            try:
                value = scope._py_value(node)
                if isinstance(value, str | int | float | type(None)):
                    return [value]
            except _Unresolved:
                pass
            return [UNKNOWN]
        if isinstance(node, ast.Call):
            return self._call(node, ctx, env)
        return [UNKNOWN]

    def _dict(self, node: ast.Dict, ctx: Ctx, env: dict[str, object]) -> list[object]:
        keys = {
            k.value: v
            for k, v in zip(node.keys, node.values, strict=True)
            if isinstance(k, ast.Constant) and isinstance(k.value, str)
        }
        if "apiVersion" in keys and "kind" in keys:
            out = []
            for av in self.values(keys["apiVersion"], ctx, env):
                for kind in self.values(keys["kind"], ctx, env):
                    out.append(_placeholder_object(av, kind))
            return out
        return [{}]

    def _name(self, name: str, ctx: Ctx, env: dict[str, object]) -> list[object]:
        if name in env:
            return [env[name]]
        binds = self._locals(ctx, name)
        if binds:
            return [v for _, e in binds for v in self.values(e, ctx, env)]
        if name in self._params(ctx.fn):
            return self._param(name, ctx)
        scope = self.p.modules[ctx.module][2]
        try:
            return sorted(scope.strings(ast.Name(id=name)))
        except _Unresolved:
            pass
        if name in scope.assigns:
            mctx = Ctx(ctx.module, None)
            return [v for e in scope.assigns[name] for v in self.values(e, mctx, {})]
        return [UNKNOWN]

    def _param(self, name: str, ctx: Ctx) -> list[object]:
        fn = ctx.fn
        assert isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        params = [x.arg for x in [*fn.args.posonlyargs, *fn.args.args]]
        out: list[object] = []
        callers = self.p.callers(ctx.module, fn)  # type: ignore[arg-type]
        if not callers:
            return [UNKNOWN]
        for mod, call in callers:
            cctx = Ctx(mod, self.p.enclosing_function(mod, call))
            arg = None
            if name in params and params.index(name) < len(call.args):
                arg = call.args[params.index(name)]
            for k in call.keywords:
                if k.arg == name:
                    arg = k.value
            if arg is None:
                default = _default_of(fn, name)
                out.extend(self.values(default, ctx, {}) if default is not None else [UNKNOWN])
            else:
                out.extend(self.values(arg, cctx, {}))
        return out

    def _call(self, node: ast.Call, ctx: Ctx, env: dict[str, object]) -> list[object]:
        target = None
        if isinstance(node.func, ast.Name):
            target = self.p.function(ctx.module, node.func.id)
        elif isinstance(node.func, ast.Attribute):
            base = _dotted(node.func.value)
            scope = self.p.modules[ctx.module][2]
            if base in scope.imports:
                mod, attr = scope.imports[base]
                full = f"{mod}.{attr}" if attr else mod
                if _follow(full) and self.p.load(full):
                    target = self.p.function(full, node.func.attr)
        if target is None:
            return [UNKNOWN]
        mod, fn = target
        arg_values = [self.values(a, ctx, env) for a in node.args]
        kw_values = {k.arg: self.values(k.value, ctx, env) for k in node.keywords if k.arg}
        simple = (str, int, float, bool, type(None))
        if all(isinstance(v, simple) for vs in [*arg_values, *kw_values.values()] for v in vs):
            out = []
            func = getattr(importlib.import_module(mod), fn.name)
            for combo in itertools.islice(
                itertools.product(*arg_values, *kw_values.values()), _MAX_COMBOS
            ):
                args = combo[: len(arg_values)]
                kwargs = dict(zip(kw_values, combo[len(arg_values) :], strict=True))
                try:
                    out.extend(_normalise(func(*args, **kwargs)))
                except Exception:
                    out.append(UNKNOWN)
            return out
        # abstract: the callee's return expressions, its parameters bound to these arguments
        params = [x.arg for x in [*fn.args.posonlyargs, *fn.args.args]]
        fctx = Ctx(mod, fn)
        out = []
        binds: dict[str, list[object]] = {}
        for p_name, vs in zip(params, arg_values, strict=False):
            binds[p_name] = vs
        for k, vs in kw_values.items():
            binds[k] = vs
        names = list(binds)
        for combo in itertools.islice(itertools.product(*binds.values()), _MAX_COMBOS):
            cenv = dict(zip(names, combo, strict=True))
            for ret in ast.walk(fn):
                if (
                    isinstance(ret, ast.Return)
                    and ret.value is not None
                    and self.p.enclosing_function(mod, ret) is fn
                ):
                    out.extend(self.values(ret.value, fctx, cenv))
        return out


def _placeholder_object(api_version: object, kind: object) -> dict[str, object]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": "{name}", "namespace": "{namespace}"},
    }


def _normalise(value: object) -> list[object]:
    """A real function's result as evaluator values: lists flattened, objects as placeholders."""
    if isinstance(value, list | tuple | set | frozenset):
        return [v for item in value for v in _normalise(item)]
    if isinstance(value, dict) and "apiVersion" in value and "kind" in value:
        return [_placeholder_object(value["apiVersion"], value["kind"])]
    return [value]


def _default_of(fn: ast.FunctionDef, name: str) -> ast.expr | None:
    a = fn.args
    pos = [*a.posonlyargs, *a.args]
    for i, d in enumerate(reversed(a.defaults)):
        if pos[len(pos) - 1 - i].arg == name:
            return d
    for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        if arg.arg == name:
            return d
    return None


def _recorder(cls: type) -> object:
    class Recorder(cls):  # type: ignore[misc, valid-type]
        def request(self, method, path, body=None, **_kw):
            self.recorded.append((str(method).upper(), path))
            return {"items": []} if str(method).upper() == "GET" else {}

    rec = Recorder.__new__(Recorder)
    rec.recorded = []
    return rec


def perm_of_request(http: str, path: str) -> Perm | None:
    """(group, resource, verb) of a request path, or None for non-resource paths."""
    m = ApiMethod("raw", "raw", http, path)
    group, resource, _, _ = m.parse()
    if group is None or resource is None or http not in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        return None
    return group, resource, m.verb()
