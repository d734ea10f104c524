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


def test_importing_any_decode_module_never_imports_train():
    code = (
        "import importlib, sys\n"
        f"for name in {modules()!r}:\n"
        "    importlib.import_module(name)\n"
        "    bad = sorted(m for m in sys.modules if m.startswith(('prove.train', 'prove.recipes')))\n"
        "    if bad:\n"
        "        sys.exit(f'{name} imports {bad}')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_no_decode_source_names_train_in_an_import():
    """Function-local imports run only when called: the source itself must not name them."""
    offenders = [
        f"{p.relative_to(DECODE.parent)}:{i}"
        for p in sorted(DECODE.rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if line.lstrip().startswith(
            ("import prove.train", "from prove.train", "import prove.recipes", "from prove.recipes")
        )
    ]
    assert not offenders


def test_decode_keeps_at_most_twelve_top_level_modules_and_the_engine_its_own_package():
    """docs/design.md §1: the engine lives in ``decode/engine/``; a new top-level module of ``decode/`` (a second loop, a
    cache beside the engine's) fails here first."""
    top = sorted(p.name for p in DECODE.glob("*.py"))
    assert len(top) <= 12, top
    engine = {p.stem for p in (DECODE / "engine").glob("*.py")}
    assert {"loop", "runner", "cache", "device", "cycles", "graphs", "check", "fused"} <= engine


def test_common_imports_neither_side_nor_the_recipes():
    """``prove.common`` (errors, the config schema helper, the checkpoint contract) sits under both train and decode:
    a helper there that reached into either would tie the two sides together again."""
    import prove.common

    common = Path(prove.common.__file__).parent
    names = ["prove.common"] + [m.name for m in pkgutil.walk_packages(prove.common.__path__, "prove.common.")]
    assert {"prove.common.errors", "prove.common.schema", "prove.common.checkpoint"} <= set(names)
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('prove.train', 'prove.decode', 'prove.recipes', 'hydra')))\n"
        "sys.exit(f'prove.common imports {bad}' if bad else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    offenders = [
        f"{p.name}:{i}"
        for p in sorted(common.rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if line.lstrip().startswith(
            ("from prove.train", "from prove.decode", "import prove.train", "import prove.decode")
        )
    ]
    assert not offenders
