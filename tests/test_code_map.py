"""docs/ARCHITECTURE.md names every module of the product packages.

    every .py under the packages of tests/test_layering.py's LAYERS (less __init__.py)
      --named?--> its path from the repository root or from its top-level package
                  (`engine/pipeline/token_budget.py`, `pipeline/token_budget.py`; the `.py`
                  optional), or, for a module directly under a top-level package, its name
                  in backticks in that package's row of the layer table (`records` in the
                  `jobstore/` row)
A module that is in the tree but not on the map fails here, naming the file.
"""

from __future__ import annotations

import re
from pathlib import Path

from test_layering import LAYERS

REPO = Path(__file__).resolve().parents[1]
CODE_MAP = REPO / "docs" / "ARCHITECTURE.md"


def product_modules() -> list[Path]:
    tops = sorted({package.split(".")[0] for layer in LAYERS.values() for package in layer.packages})
    return sorted(path.relative_to(REPO) for top in tops for path in (REPO / top).rglob("*.py")
                  if path.name != "__init__.py")


def package_rows(text: str) -> dict[str, str]:
    """Each layer table row by the top-level package it describes: `| layer | `pkg/` | ...`."""
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) > 3:
            match = re.fullmatch(r"`(\w+)/`(?:, .*)?", cells[2])
            if match:
                rows[match.group(1)] = line
    return rows


def is_named(module: Path, text: str, rows: dict[str, str]) -> bool:
    top, *rest = module.parts
    for path in (module.as_posix(), "/".join(rest)):
        if len(rest) > 1 or path == module.as_posix():
            stem = re.escape(path.removesuffix(".py"))
            if re.search(rf"(?<![\w/]){stem}(\.py)?(?![\w/])", text):
                return True
    return len(rest) == 1 and f"`{module.stem}`" in rows.get(top, "")


def unnamed_modules(text: str) -> list[str]:
    rows = package_rows(text)
    return [module.as_posix() for module in product_modules() if not is_named(module, text, rows)]


def test_every_product_module_is_on_the_code_map():
    missing = unnamed_modules(CODE_MAP.read_text())
    assert not missing, f"docs/ARCHITECTURE.md does not name: {', '.join(missing)}"


def test_a_module_left_off_the_map_is_caught():
    text = CODE_MAP.read_text()
    row = package_rows(text)["jobstore"]
    assert "`records`" in row and "jobstore/records.py" not in text
    without = text.replace(row, row.replace("`records`", "`the records`"))
    assert unnamed_modules(without) == ["jobstore/records.py"]
    assert "engine/pipeline/token_budget.py" in unnamed_modules(text.replace("token_budget", "x"))
