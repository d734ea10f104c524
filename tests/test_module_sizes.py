"""Rooms at their size (docs/design.md §1, "Conventions"): no module of the packages or tools over 600 lines, no
function over 100, and at most ten over 60 in all. One that grows past a limit is split by responsibility, its
public names re-exported where other code imports them; a long function becomes named steps."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("common", "decode", "train", "data", "recipes", "tools")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 100
LONG_FUNCTION_LINES = 60
MAX_LONG_FUNCTIONS = 10
MODULES = sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def function_lengths(path: Path, root: Path = ROOT) -> list[tuple[str, int]]:
    """``(name, lines)`` of every function and method in ``path``, decorators excluded."""
    tree = ast.parse(path.read_text())
    return [
        (f"{path.relative_to(root)}:{node.name}", node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None
    ]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_and_its_functions_stay_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, (
        f"{path.relative_to(ROOT)}: {lines} lines (at most {MAX_MODULE_LINES}): split it"
    )
    long = [f"{name} ({n} lines)" for name, n in function_lengths(path) if n > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_few_functions_run_past_sixty_lines():
    long = sorted(
        ((n, name) for p in MODULES for name, n in function_lengths(p) if n > LONG_FUNCTION_LINES),
        reverse=True,
    )
    assert len(long) <= MAX_LONG_FUNCTIONS, (
        f"{len(long)} functions over {LONG_FUNCTION_LINES} lines (at most {MAX_LONG_FUNCTIONS}): {long}"
    )


def test_every_package_is_measured():
    names = {str(p.relative_to(ROOT)) for p in MODULES}
    assert {
        "train/mars_step.py",
        "decode/engine/loop.py",
        "common/checkpoint.py",
        "tools/bench_mars_step.py",
    } <= names


def test_the_measure_counts_a_function_from_def_to_its_last_line(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "@decorator\ndef f():\n    x = 1\n\n    return x\n\n\nclass C:\n    def g(self):\n        pass\n"
    )
    assert function_lengths(src, tmp_path) == [("m.py:f", 4), ("m.py:g", 2)]
