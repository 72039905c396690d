"""The package's import graph in numbers: modules, imports, top-level packages, layers, circles.

    python dev/import_graph.py [SRC]     # SRC: the dir holding loopscale/ (default: this checkout's src/)

Reads the sources with ``tests/test_imports.py``'s graph (every import counts: lazy ones, a package's lazy
table, and those under ``if TYPE_CHECKING:``). Layers: the longest chain of top-level packages each importing
the next (undefined while a circle remains). Used for the before/after of a refactor (docs/extending.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import test_imports as graphs  # noqa: E402


def main() -> None:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "src"
    graphs.SRC = src / "loopscale"
    modules = graphs.import_graph()
    packages = graphs.package_graph(modules)
    print(f"modules: {len(modules)}, imports between them: {sum(map(len, modules.values()))}")
    print(f"module circles: {graphs._cycles(modules) or 'none'}")
    print(f"top-level modules and packages: {len(packages)}, imports between them: {sum(map(len, packages.values()))}")
    circles = graphs._cycles(packages)
    print(f"package circles: {circles or 'none'}")
    if not circles:
        depth: dict[str, int] = {}

        def layer(p: str) -> int:
            if p not in depth:
                depth[p] = 1 + max((layer(q) for q in packages.get(p, ()) if q in packages), default=0)
            return depth[p]

        print(f"layers: {max(map(layer, packages))}")


if __name__ == "__main__":
    main()
