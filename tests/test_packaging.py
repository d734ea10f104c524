"""The wheel layout of docs/design.md §1: every package folder is listed in pyproject and is importable as prove.*."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPING = {
    "common": "prove.common",
    "decode": "prove.decode",
    "train": "prove.train",
    "data": "prove.data",
    "conf": "prove.conf",
    "recipes": "prove.recipes",
}


def _package_folders() -> dict[str, Path]:
    found = {}
    for folder, pkg in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            name = ".".join([pkg, *rel.parts]) if rel.parts else pkg
            found[name] = init.parent
    return found


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set(_package_folders())
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - found == set(), "these are listed in pyproject.toml but have no __init__.py"


def test_yaml_folders_are_packages():
    """Hydra's pkg:// search needs an __init__.py in every folder that holds configs."""
    for top in ("conf", "recipes"):
        for yaml in (ROOT / top).rglob("*.yaml"):
            assert (yaml.parent / "__init__.py").is_file(), f"{yaml.parent} needs an __init__.py"


def test_packages_import():
    for name in _package_folders():
        importlib.import_module(name)


def test_every_test_folder_is_a_package():
    """tests/ is packages all the way down (``tests.decode.decode_helpers``, ``tests.train.helpers``): a folder
    of tests without an ``__init__.py`` would have its modules imported under their bare names, where two
    ``conftest.py`` or helper files of the same name clash."""
    folders = {p.parent for p in (ROOT / "tests").rglob("*.py") if "__pycache__" not in p.parts}
    assert sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file()) == []


def test_pre_commit_runs_what_make_lint_runs():
    """The pre-commit hooks and ``make lint`` check the same folders with the venv's ruff (the pinned one): fails
    when a folder joins one and not the other, or a hook runs some other ruff."""
    import re

    import yaml

    make = (ROOT / "Makefile").read_text()
    lint = re.findall(r"\$\(VENV\)/bin/ruff (check|format --check) ([a-z ]+)\n", make)
    assert {kind for kind, _ in lint} == {"check", "format --check"}
    folders = {frozenset(dirs.split()) for _, dirs in lint}
    assert len(folders) == 1
    (dirs,) = folders
    hooks = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"]
    assert {h["id"] for h in hooks} == {"ruff-check", "ruff-format"}
    for hook in hooks:
        assert hook["entry"].startswith(".venv/bin/ruff "), hook["entry"]
        covered = re.fullmatch(r"\^\((.*)\)/", hook["files"])
        assert covered is not None and set(covered.group(1).split("|")) == dirs, hook["files"]


def test_ci_runs_lint_typecheck_and_the_readme_test_command():
    steps = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line and not line.startswith(("#", "set", "cd"))
    ]
    assert steps == ["make lint", "make typecheck", "make test"]
