"""Every training default is written once, in the schema (prove.train.config): a YAML of conf/train.yaml or of
its groups keeps only what selects a group or differs from the schema's default."""

from __future__ import annotations

import dataclasses
import typing
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from omegaconf import MISSING, OmegaConf
from prove.train import config as schema
from prove.train.config import TrainConfig

CONF = Path(__file__).resolve().parents[2] / "conf"
GROUPS = ("model", "data", "stage", "trainer", "peft", "logger")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return MISSING


def _dataclass_of(kind: Any) -> type | None:
    """The dataclass inside ``kind`` (``X``, ``X | None``), else None."""
    for arg in (kind, *typing.get_args(kind)):
        if dataclasses.is_dataclass(arg):
            return arg  # type: ignore[return-value]
    return None


def _same(value: Any, default: Any) -> bool:
    if isinstance(value, bool) or isinstance(default, bool):  # true is not 1
        return type(value) is type(default) and value == default
    return value == default


def restated_defaults(node: dict[str, Any], cls: type, path: str = "") -> list[str]:
    """Keys of ``node`` whose value equals ``cls``'s default (recursing into nested dataclass nodes)."""
    hints = typing.get_type_hints(cls, vars(schema))
    fields = {f.name: f for f in dataclasses.fields(cls)}
    found = []
    for key, value in node.items():
        if key not in fields:
            continue  # a typo fails at composition (tests/train/test_train_config.py)
        nested = _dataclass_of(hints[key])
        if isinstance(value, dict) and nested is not None:
            found += restated_defaults(value, nested, f"{path}{key}.")
            continue
        default = _default(fields[key])
        if isinstance(default, Enum):
            default = default.value
        if default is not MISSING and _same(value, default):
            found.append(f"{path}{key}={value!r}")
    return found


def _yaml_files() -> list[tuple[str, Path]]:
    files = [("", CONF / "train.yaml")]
    for group in GROUPS:
        files += [(group, p) for p in sorted((CONF / group).glob("*.yaml"))]
    return files


@pytest.mark.parametrize(("group", "path"), _yaml_files(), ids=lambda x: x if isinstance(x, str) else x.name)
def test_yaml_restates_no_schema_default(group: str, path: Path):
    text = path.read_text()
    node = OmegaConf.to_container(OmegaConf.create(text), resolve=False)
    node.pop("defaults", None)
    node.pop("hydra", None)
    assert isinstance(node, dict)
    if group and "@package _global_" not in text.splitlines()[0]:
        node = {group: node}
    assert restated_defaults(node, TrainConfig) == [], (
        f"{path.relative_to(CONF.parent)} restates schema defaults: delete them (the default lives in "
        "prove.train.config) or change them on purpose"
    )


def test_the_check_sees_a_restated_default():
    assert restated_defaults(
        {"trainer": {"seed": 42, "learning_rate": "${lr}"}, "lr": 5e-6}, TrainConfig
    ) == ["trainer.seed=42", "lr=5e-06"]
    assert restated_defaults({"model": {"scratch": {"layers": 4, "hidden": 64}}}, TrainConfig) == [
        "model.scratch.layers=4"
    ]


def _scalar_defaults(cls: type, path: str = "") -> dict[str, Any]:
    """Every field of ``cls`` (recursing into nested dataclasses) whose default is a number or a non-empty string."""
    hints = typing.get_type_hints(cls, vars(schema))
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        nested = _dataclass_of(hints[f.name])
        if nested is not None:
            out.update(_scalar_defaults(nested, f"{path}{f.name}."))
            continue
        default = _default(f)
        default = default.value if isinstance(default, Enum) else default
        if isinstance(default, (int, float, str)) and not isinstance(default, bool) and default != "":
            out[f"{path}{f.name}"] = default
    return out


def comment_restatements(text: str, defaults: dict[str, Any]) -> list[str]:
    """Comment lines that give a schema field's default value beside its name (``ar_weight: 1.0``, ``r 16``)."""
    import re

    found = []
    for line in text.splitlines():
        comment = line.split("#", 1)[1] if "#" in line else ""
        for key, value in defaults.items():
            name = re.escape(key.rsplit(".", 1)[-1])
            if re.search(rf"\b{name}\b\s*[:=]?\s*{re.escape(str(value))}(?![\w.])", comment):
                found.append(f"{key} = {value!r} in: {line.strip()}")
    return found


@pytest.mark.parametrize(("group", "path"), _yaml_files(), ids=lambda x: x if isinstance(x, str) else x.name)
def test_yaml_comments_restate_no_schema_default(group: str, path: Path):
    """A comment that says a default drifts from the schema the day the default changes: name the schema instead."""
    assert comment_restatements(path.read_text(), _scalar_defaults(TrainConfig)) == []


def test_the_comment_check_sees_a_restated_default():
    defaults = _scalar_defaults(TrainConfig)
    assert defaults["peft.r"] == 16 and defaults["stage.ar_weight"] == 1.0
    text = "# Defaults (r 16, alpha 32): the schema\nr: 32  # not a comment restatement\n# ar_weight: 1.0 by default"
    assert comment_restatements(text, {k: defaults[k] for k in ("peft.r", "stage.ar_weight")}) == [
        "peft.r = 16 in: # Defaults (r 16, alpha 32): the schema",
        "stage.ar_weight = 1.0 in: # ar_weight: 1.0 by default",
    ]
