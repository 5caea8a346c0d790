"""Prompt packs on disk: load them into a registry, write a fitted calibration back.

    packs/*.yaml --load_pack--> Pack --PackRegistry (official + --packs DIR...)
    PackCalibration --write_calibration--> the pack file's `calibration` section (rest kept)

Turning a pack into queries and its answers into decisions: prompt_packs/apply.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from prompt_packs.format import Pack, PackCalibration

OFFICIAL_PACKS_DIR = Path(__file__).resolve().parents[1] / "packs"
PACK_SUFFIXES = (".yaml", ".yml", ".json")
QUERY_ID_SEPARATOR = ":"
_WRITTEN_BY = "# Written by `spinf-jobs calibrate`"


class PackError(ValueError):
    """A pack file that cannot be loaded; the message names the file and the field."""


class UnknownPackError(KeyError):
    """A request named a pack id that no loaded folder holds."""

    def __init__(self, pack_id: str, known: list[str]):
        super().__init__(pack_id)
        self.pack_id = pack_id
        self.message = f"unknown pack {pack_id!r}; loaded packs: {sorted(known)}"

    def __str__(self) -> str:
        return self.message


# ---- loading ---------------------------------------------------------------------------


def read_pack_data(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as error:
        raise PackError(f"{path}: cannot be read as {path.suffix[1:]}: {error}") from None
    if not isinstance(data, dict):
        raise PackError(f"{path}: a pack file holds one mapping (id, version, questions, ...)")
    return data


def _field_name(loc: tuple, data: dict[str, Any]) -> str:
    """'questions[3] (id=threat).options' from pydantic's ('questions', 3, 'options')."""
    parts: list[str] = []
    node: Any = data
    for item in loc:
        if isinstance(item, int):
            node = node[item] if isinstance(node, list) and item < len(node) else None
            label = f"[{item}]"
            if isinstance(node, dict) and "id" in node:
                label += f" (id={node['id']})"
            parts.append(label)
        else:
            node = node.get(item) if isinstance(node, dict) else None
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


def load_pack(path: str | Path) -> Pack:
    path = Path(path)
    data = read_pack_data(path)
    try:
        return Pack.model_validate(data)
    except ValidationError as error:
        lines = [f"{_field_name(e['loc'], data)}: {e['msg']}" for e in error.errors()]
        raise PackError(f"{path}: invalid pack: " + "; ".join(lines)) from None


def pack_files(folder: Path) -> list[Path]:
    """The pack files directly inside a folder (sub-folders hold data and reports)."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in PACK_SUFFIXES)


class PackRegistry:
    """Packs by id: the official folder first, then each extra folder in order."""

    def __init__(self, packs: dict[str, Pack], sources: dict[str, Path]):
        self._packs = packs
        self.sources = sources  # pack id -> the file it came from

    @classmethod
    def load(cls, folders: list[str | Path] = (), *, include_official: bool = True) -> PackRegistry:
        packs: dict[str, Pack] = {}
        sources: dict[str, Path] = {}
        roots = ([OFFICIAL_PACKS_DIR] if include_official else []) + [Path(f) for f in folders]
        for folder in roots:
            if not folder.is_dir():
                raise PackError(f"{folder}: not a folder of pack files")
            for path in pack_files(folder):
                pack = load_pack(path)
                if pack.id in packs:
                    raise PackError(f"{path}: id {pack.id!r} is already loaded from {sources[pack.id]}")
                packs[pack.id], sources[pack.id] = pack, path
        return cls(packs, sources)

    def get(self, pack_id: str) -> Pack:
        if pack_id not in self._packs:
            raise UnknownPackError(pack_id, list(self._packs))
        return self._packs[pack_id]

    def ids(self) -> list[str]:
        return sorted(self._packs)

    def summaries(self) -> list[dict[str, Any]]:
        """What `GET /v1/packs` lists."""
        return [
            {"id": p.id, "version": p.version, "description": p.description,
             "questions": [q.id for q in p.questions], "categories": [c.id for c in p.categories],
             "decisions": [d.id for d in p.decisions],
             "calibrated": sorted(p.calibration.questions) + sorted(p.calibration.categories)}
            for p in (self._packs[i] for i in self.ids())
        ]


# ---- writing a fit back ----------------------------------------------------------------


def write_calibration(path: str | Path, calibration: PackCalibration) -> Pack:
    """Replace the pack file's `calibration` section, keeping the hand-written part (and
    its comments) byte for byte: in YAML the section is the last top-level key."""
    path = Path(path)
    section = calibration.model_dump(mode="json", exclude_none=True)
    if path.suffix == ".json":
        data = read_pack_data(path)
        data["calibration"] = section
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    else:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        cut = next((i for i, line in enumerate(lines) if line.startswith("calibration:")), len(lines))
        if cut > 0 and lines[cut - 1].startswith(_WRITTEN_BY):
            cut -= 1
        head = "".join(lines[:cut]).rstrip("\n") + "\n\n"
        body = yaml.safe_dump({"calibration": section}, sort_keys=False, allow_unicode=True, width=100)
        path.write_text(head + _WRITTEN_BY + "; edit above this line.\n" + body, encoding="utf-8")
    return load_pack(path)
