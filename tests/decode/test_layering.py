"""The dependency direction (docs/design.md §3.2): ``prove.decode`` never imports ``prove.train`` (nor the
recipes that drive both); it meets training only through the checkpoint contract."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import prove.decode

DECODE = Path(prove.decode.__file__).parent


def modules() -> list[str]:
    return ["prove.decode"] + [m.name for m in pkgutil.walk_packages(prove.decode.__path__, "prove.decode.")]


def test_the_walk_finds_the_subpackages():
    names = modules()
    assert {"prove.decode.bench.run", "prove.decode.eval.cli", "prove.decode.rules.block"} <= set(names)


def imports_none_of(names: list[str], forbidden: tuple[str, ...]) -> str:
    """Import each of ``names`` in a fresh interpreter; what went wrong ('' if none of ``forbidden`` got loaded)."""
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        f"    bad = sorted(m for m in sys.modules if m.startswith({forbidden!r}))\n"
        "    if bad:\n"
        "        sys.exit(f'{name} imports {bad}')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    return "" if proc.returncode == 0 else proc.stderr[-2000:] or proc.stdout[-2000:]


def import_lines_naming(folder: Path, forbidden: tuple[str, ...]) -> list[str]:
    """Source lines of ``folder`` that import one of ``forbidden``: function-local imports run only when called, so
    the source itself must not name them."""
    starts = tuple(f"{kw} {m}" for m in forbidden for kw in ("import", "from"))
    return [
        f"{p.relative_to(folder.parent)}:{i}"
        for p in sorted(folder.rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if line.lstrip().startswith(starts)
    ]


def test_importing_any_decode_module_never_imports_train():
    assert imports_none_of(modules(), ("prove.train", "prove.recipes")) == ""


def test_no_decode_source_names_train_in_an_import():
    assert import_lines_naming(DECODE, ("prove.train", "prove.recipes")) == []


def test_decode_keeps_at_most_twelve_top_level_modules_and_the_engine_its_own_package():
    """docs/design.md §1: the engine lives in ``decode/engine/``; a new top-level module of ``decode/`` (a second loop, a
    cache beside the engine's) fails here first."""
    top = sorted(p.name for p in DECODE.glob("*.py"))
    assert len(top) <= 12, top
    engine = {p.stem for p in (DECODE / "engine").glob("*.py")}
    assert {
        "loop",
        "runner",
        "cache",
        "device",
        "cycles",
        "graphs",
        "check",
        "fused",
        "tree",
        "pass_cost",
    } <= engine


def test_common_imports_neither_side_nor_the_recipes():
    """``prove.common`` (errors, the config schema helper, the checkpoint contract) sits under both train and decode:
    a helper there that reached into either would tie the two sides together again."""
    import prove.common

    common = Path(prove.common.__file__).parent
    names = ["prove.common"] + [m.name for m in pkgutil.walk_packages(prove.common.__path__, "prove.common.")]
    assert {"prove.common.errors", "prove.common.schema", "prove.common.checkpoint"} <= set(names)
    sides = ("prove.train", "prove.decode", "prove.recipes")
    assert imports_none_of(names, (*sides, "hydra")) == ""
    assert import_lines_naming(common, sides) == []


def test_the_checks_see_an_import_that_crosses():
    assert "imports ['prove.data" in imports_none_of(["prove.common.checkpoint"], ("prove.data",))
    assert import_lines_naming(
        DECODE, ("prove.common",)
    )  # decode does import common: the scan finds such lines
