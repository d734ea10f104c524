"""README.md is the product page (issue 56): short, opening with the two commands a new user runs, and every
command, key, method and link it shows must exist. Renaming a make target, a CLI key, a console script, a
recipe or a method, or moving a docs page, fails here until the README follows."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TEXT = README.read_text()
MAX_LINES = 150

# The schema behind each console script: (module, dataclass, YAML whose `defaults` groups are keys as well).
SCHEMAS = {
    "prove-decode": ("prove.decode.config", "DecodeConfig", None),
    "prove-bench": ("prove.decode.bench.config", "BenchConfig", None),
    "prove-serve": ("prove.decode.vllm.serve", "ServeConfig", None),
    "prove-eval": ("prove.decode.eval.cli", "EvalConfig", None),
    "prove-train": ("prove.train.config", "TrainConfig", "conf/train.yaml"),
}
# The console script a make target hands its ARGS to (Makefile: `$(VENV)/bin/prove-…  $(ARGS)` / $(TRAIN_LAUNCH)).
MAKE_CLI = {
    "decode": "prove-decode",
    "bench": "prove-bench",
    "bench-real": "prove-bench",
    "serve": "prove-serve",
    "eval": "prove-eval",
    "train": "prove-train",
    "train-proposer": "prove-train",
    "train-verifier": "prove-train",
}


def _fences(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)


def _shell_lines(body: str) -> list[list[str]]:
    """The block's commands as argv lists: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", body)
    return [argv for line in joined.splitlines() if (argv := shlex.split(line, comments=True))]


def _inline_make_commands(text: str) -> list[list[str]]:
    """`make …` in inline code spans of the prose (fenced blocks removed); <placeholders> become one word."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    spans = re.findall(r"`(make [^`]+)`", prose)
    return [shlex.split(re.sub(r"<[^>]*>", "PLACEHOLDER", s.replace("\n", " "))) for s in spans]


def _commands() -> list[list[str]]:
    return [argv for lang, body in _fences(TEXT) if lang == "bash" for argv in _shell_lines(body)]


def _make_commands() -> list[list[str]]:
    return [argv for argv in _commands() + _inline_make_commands(TEXT) if argv[0] == "make"]


def _cli_commands() -> list[list[str]]:
    return [argv for argv in _commands() if argv[0].startswith("prove-")]


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M))


def _schema_keys(cli: str) -> set[str]:
    module, name, yaml_file = SCHEMAS[cli]
    keys = {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), name))}
    if yaml_file:
        for entry in yaml.safe_load((ROOT / yaml_file).read_text())["defaults"]:
            if isinstance(entry, dict):
                keys |= {k for k in entry if not k.startswith("override ")}
    return keys


def _overrides(words: list[str]) -> list[tuple[str, str]]:
    """(key, value) of each Hydra override among words; flags such as ``--cfg job`` are skipped."""
    found = []
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        if word.startswith("-"):
            skip = word in ("--cfg", "-c", "--package", "-p")
            continue
        key, sep, value = word.partition("=")
        assert sep, f"{word!r} is not KEY=value"
        found.append((key.lstrip("+~"), value))
    return found


def _check_overrides(cli: str, overrides: list[tuple[str, str]], where: str) -> None:
    keys = _schema_keys(cli)
    for key, value in overrides:
        top = key.split(".")[0]
        assert top in keys, (
            f"README: {where}: {key}= is not a key of {cli} ({SCHEMAS[cli][1]}, {SCHEMAS[cli][2]})"
        )
        if key == "recipe":
            assert (ROOT / "recipes" / f"{value}.yaml").is_file(), f"README: {where}: no recipes/{value}.yaml"
        if key == "method":
            assert value in _methods(), f"README: {where}: method={value} is not in prove.decode.methods"


def _methods() -> set[str]:
    return set(importlib.import_module("prove.decode.methods").METHODS)


# -- the page --------------------------------------------------------------------------------------------------------


def test_readme_is_short():
    n = len(TEXT.splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines (at most {MAX_LINES}): move detail into docs/"


def test_readme_opens_with_make_demo_and_make_test():
    fences = _fences(TEXT)
    assert fences, "README.md has no fenced block"
    lang, body = fences[0]
    assert lang == "bash"
    assert _shell_lines(body) == [["make", "demo"], ["make", "test"]], (
        "the first block must be make demo / make test"
    )
    before = TEXT[: TEXT.index("```")]
    assert [line for line in before.splitlines() if line.strip()] == ["# prove"], (
        "the two commands come first"
    )


def test_relative_links_point_at_files():
    links = re.findall(r"\]\(([^)\s]+)\)", TEXT)
    assert links, "README.md links to no docs"
    for link in links:
        if re.match(r"[a-z]+:", link) or link.startswith("#"):
            continue
        path = link.split("#")[0]
        assert (README.parent / path).exists(), f"README links to {link}, which does not exist"


# -- the commands ----------------------------------------------------------------------------------------------------


def test_commands_were_found():
    """Guards the parsers below: a README whose blocks they stopped reading would pass every other test."""
    targets = {argv[1] for argv in _make_commands()}
    assert {"demo", "test", "install", "decode", "serve", "bench", "train", "wheelhouse"} <= targets
    assert {argv[0] for argv in _cli_commands()} >= {"prove-decode", "prove-train"}


@pytest.mark.parametrize("argv", _make_commands(), ids=lambda argv: " ".join(argv)[:60])
def test_make_targets_and_variables_exist(argv):
    makefile = (ROOT / "Makefile").read_text()
    targets = _makefile_targets()
    words = argv[1:]
    for word in words:
        if word.startswith("-"):
            continue
        name, sep, value = word.partition("=")
        if not sep:
            assert name in targets, f"README runs `make {name}`: no such target in the Makefile"
            continue
        assert re.search(rf"\$\({name}\)|^{name}\s*[?:]?=", makefile, re.M), (
            f"the Makefile never reads {name}="
        )
        if name == "RECIPE":
            assert (ROOT / "recipes" / f"{value}.yaml").is_file(), (
                f"README: make … RECIPE={value}: no such recipe"
            )
        if name == "ARGS":
            goals = [w for w in words if "=" not in w and not w.startswith("-")]
            assert len(goals) == 1 and goals[0] in MAKE_CLI, (
                f"which CLI reads ARGS of `make {' '.join(goals)}`?"
            )
            _check_overrides(MAKE_CLI[goals[0]], _overrides(shlex.split(value)), " ".join(argv))


@pytest.mark.parametrize("argv", _cli_commands(), ids=lambda argv: " ".join(argv)[:60])
def test_console_scripts_and_their_keys_exist(argv):
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert argv[0] in scripts, f"README runs {argv[0]}: not in pyproject.toml's [project.scripts]"
    assert argv[0] in SCHEMAS, f"add {argv[0]}'s schema to SCHEMAS"
    _check_overrides(argv[0], _overrides(argv[1:]), " ".join(argv))


def test_methods_table_is_the_registry():
    section = TEXT[TEXT.index("## Methods") :]
    rows = re.findall(r"^\| `([\w-]+)` \|", section[: section.index("\n## ")], re.M)
    assert sorted(rows) == sorted(_methods()), (
        "README's methods table and prove.decode.methods.METHODS differ"
    )


def test_python_example_uses_real_names():
    """The Python block parses, imports what exists and passes Decoder only arguments it takes."""
    from prove.decode.config import DecodeParams

    blocks = [body for lang, body in _fences(TEXT) if lang == "python"]
    assert blocks, "README shows no Python"
    for body in blocks:
        tree = ast.parse(body)
        objects = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), (
                        f"README imports {alias.name} from {node.module}: missing"
                    )
                    objects[alias.asname or alias.name] = getattr(module, alias.name)
        params = {f.name for f in dataclasses.fields(DecodeParams)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if isinstance(owner, ast.Name) and owner.id in objects:
                    function = getattr(objects[owner.id], node.func.attr)
                    assert callable(function), f"README calls {owner.id}.{node.func.attr}: not callable"
                    taken = set(inspect.signature(objects[owner.id]).parameters) | params
                    for keyword in node.keywords:
                        assert keyword.arg in taken, (
                            f"README passes {keyword.arg}= to {owner.id}: not a parameter"
                        )
