"""``train/`` keeps its rooms at their size: no module over 600 lines, no function (or method) over 100 — one that
grows past either is split by responsibility, its public names re-exported where other code imports them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TRAIN = Path(__file__).resolve().parents[2] / "train"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 100
MODULES = sorted(TRAIN.glob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_module_and_its_functions_stay_small(path):
    text = path.read_text()
    lines = len(text.splitlines())
    assert lines <= MAX_MODULE_LINES, (
        f"train/{path.name}: {lines} lines (at most {MAX_MODULE_LINES}): split it"
    )
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"train/{path.name}: functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_every_module_is_checked():
    assert len(MODULES) > 20 and TRAIN / "mars_step.py" in MODULES
