"""The package's import graph: no circle among loopscale's modules, and nothing below the CLI imports it.

Read with ``ast`` from the sources (no import runs). Every import counts, the ones inside functions too
(a lazy import is still a dependency), so does a dict value that names a loopscale module exactly (a
package's lazy ``__getattr__`` table), and so do the imports under ``if TYPE_CHECKING:``: a type names the
module it lives in, and a circle that only type checkers walk still says two modules cannot be read apart.
"""

import ast
from pathlib import Path

import loopscale

SRC = Path(loopscale.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the loopscale modules it imports (``from pkg import name`` is ``pkg.name`` when a module)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                graph[mod].update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    if target in mods or base in mods:
                        graph[mod].add(target if target in mods else base)
            elif isinstance(node, ast.Dict):  # a lazy table {name: "loopscale.x"} (a package's __getattr__)
                graph[mod].update(
                    v.value
                    for v in node.values
                    if isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value in mods
                )
        graph[mod].discard(mod)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_plain_relative_and_lazy_imports() -> None:
    graph = import_graph()
    assert len(graph) > 50
    assert "loopscale.sweep.store" in graph["loopscale.sweep.attempt"]  # top-level ``from x import name``
    assert "loopscale.train.loop" in graph["loopscale.train"]  # inside a function
    assert "loopscale.sweep.runspec" in graph["loopscale.sweep.local"]  # only under TYPE_CHECKING: counted too
    assert "loopscale.fit.pipeline" in graph["loopscale.fit"]  # by name, in the package's lazy table


def test_no_module_of_loopscale_imports_itself_in_a_circle() -> None:
    graph = import_graph()
    assert _cycles(graph) == []
    # the sweep's records sit below what reads them: one planned run (runspec), the store, the executors' registry
    assert "loopscale.sweep.spec" not in graph["loopscale.sweep.store"]  # the plan's order: spec.plan_order
    assert not {"loopscale.sweep.spec", "loopscale.sweep.store"} & graph["loopscale.sweep.runspec"]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between loopscale's top-level packages and modules (``loopscale.fit.law.joint`` is ``fit``)."""

    def top(mod: str) -> str:
        return ".".join(mod.split(".")[:2])

    out: dict[str, set[str]] = {}
    for mod, targets in graph.items():
        out.setdefault(top(mod), set()).update(top(t) for t in targets if top(t) not in (top(mod), "loopscale"))
    return out


def test_the_packages_are_layered_without_a_circle() -> None:
    """No circle between packages either (each one sits above what it imports): e.g. ``config`` holds the data-only
    configs below ``accounting``, and the training config that computes through accounting is ``train``'s."""
    packages = package_graph(import_graph())
    assert _cycles(packages) == []
    assert "loopscale.accounting" not in packages["loopscale.config"]
    assert not packages["loopscale.record"]
    assert "loopscale.train" not in packages["loopscale.memory"]  # a run's micro-batches: train.microbatch
    forbidden = {"loopscale.sweep", "loopscale.train", "loopscale.model", "loopscale.eval", "loopscale.report"}
    assert not packages["loopscale.fit"] & forbidden  # the fit: tables and numbers, below what produces them


def test_no_import_runs_up_into_the_cli() -> None:
    graph = import_graph()
    up = sorted(
        f"{mod} -> {target}"
        for mod, targets in graph.items()
        for target in targets
        if (target == "loopscale.cli" or target.startswith("loopscale.cli."))
        and not (mod == "loopscale.cli" or mod.startswith("loopscale.cli.") or mod == "loopscale.__main__")
    )
    assert up == []


def test_the_model_imports_nothing_above_it() -> None:
    """The model owns its sizes (``loopscale.model.chunks``): ``loopscale.memory`` reads them, never the reverse;
    no module of the model imports the memory model, the trainer or what runs sweeps and fits."""
    above = (
        "loopscale.memory",
        "loopscale.train",
        "loopscale.sweep",
        "loopscale.fit",
        "loopscale.report",
        "loopscale.eval",
        "loopscale.export",
    )
    graph = import_graph()
    up = sorted(
        f"{mod} -> {target}"
        for mod, targets in graph.items()
        for target in targets
        if (mod == "loopscale.model" or mod.startswith("loopscale.model."))
        and any(target == a or target.startswith(a + ".") for a in above)
    )
    assert up == []
    assert "loopscale.model.chunks" in graph["loopscale.memory"]


def test_a_circle_or_an_upward_import_would_be_seen() -> None:
    """The checks themselves: a made-up circle is found."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    made_up = {"loopscale.x.a": {"loopscale.y.b"}, "loopscale.y.b": {"loopscale.y.c"}, "loopscale.y.c": {"loopscale.x"}}
    assert _cycles(package_graph(made_up)) == [["loopscale.x", "loopscale.y"]]


def test_no_module_imports_another_modules_private_names() -> None:
    """A name another module needs is public (``from loopscale.x import _y`` hides an API); relative
    imports inside one package resolve to absolute names first."""
    found = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
            if not module or not module.startswith("loopscale") or module == name:
                continue
            found += [
                f"{name}: from {module} import {a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
    assert not found, found
