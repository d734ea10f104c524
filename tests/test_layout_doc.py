"""docs/design.md §1 is the map a newcomer reads first: its layout table names every module of every package folder,
and no module that is gone. A module added without a line there, or renamed with the map left behind, fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("common", "decode", "train", "data", "recipes")


def layout_rows() -> dict[str, str]:
    """The layout table's rows, by folder (``decode/`` -> its "holds" cell)."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("## 1. Layout", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].endswith("/`"):
            rows[cells[0].strip("`").rstrip("/")] = cells[2]
    return rows


def modules(folder: str) -> list[str]:
    """``name`` for each module of ``folder``, ``sub/`` for each subpackage and ``sub/name`` for its modules."""
    base = ROOT / folder
    out = [p.stem for p in sorted(base.glob("*.py")) if not p.stem.startswith("__")]
    for sub in sorted(p.parent for p in base.glob("*/__init__.py")):
        names = [p.stem for p in sorted(sub.glob("*.py")) if not p.stem.startswith("__")]
        if names:
            out += [f"{sub.name}/"] + [f"{sub.name}/{n}" for n in names]
    return out


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_layout_names_every_module_of_the_folder(folder):
    rows = layout_rows()
    assert folder in rows, f"docs/design.md §1 has no row for {folder}/"
    cell = rows[folder]
    named = set(re.findall(r"`([^`]+)`", cell))
    missing = []
    for name in modules(folder):
        stem = name.rsplit("/", 1)[-1] or name
        if name.endswith("/"):
            ok = f"{folder}/{name}" in named or name in named
        else:
            ok = stem in named or name in named
        if not ok:
            missing.append(name)
    assert not missing, f"docs/design.md §1's {folder}/ row does not name: {missing}"


def test_the_layout_names_no_module_that_is_gone():
    rows = layout_rows()
    gone = []
    for folder in FOLDERS:
        for name in re.findall(r"`([a-z_]+)`", rows.get(folder, "")):
            hits = list((ROOT / folder).rglob(f"{name}.py")) + list((ROOT / folder).rglob(name))
            if not hits:
                gone.append(f"{folder}: {name}")
    assert not gone, f"docs/design.md §1 names modules that do not exist: {gone}"
