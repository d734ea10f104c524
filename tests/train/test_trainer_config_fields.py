"""``TrainerConfig`` (``trainer.*``) copies ``transformers.TrainingArguments`` fields, which
:func:`prove.train.pipeline.training_arguments` passes on by name: each must exist in the installed transformers'
``TrainingArguments`` and take our default (and we its), so that a transformers upgrade that renames, drops or retypes
one fails here rather than at the first ``prove-train`` of a run."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

import pytest
from prove.train.config import TrainerConfig
from prove.train.pipeline import TRAINER_OWN
from transformers import TrainingArguments

OURS = {f.name: f for f in dataclasses.fields(TrainerConfig)}
THEIRS = {f.name: f for f in dataclasses.fields(TrainingArguments)}
PASSED_ON = sorted(set(OURS) - TRAINER_OWN)
# what training_arguments passes besides trainer.*: the run's own settings, and eval.best's
SET_BY_PIPELINE = (
    "use_cpu", "deepspeed", "report_to", "run_name", "remove_unused_columns", "metric_for_best_model",
    "greater_is_better",
)  # fmt: skip


def _hints(cls: type) -> dict[str, Any]:
    """The fields' annotations, resolved (``from __future__ import annotations`` leaves strings)."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # a hint that names something the module lacks at runtime: the raw annotations
        return {f.name: f.type for f in dataclasses.fields(cls)}


OUR_HINTS, THEIR_HINTS = _hints(TrainerConfig), _hints(TrainingArguments)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def accepts(annotation: Any, value: Any) -> bool:
    """Whether a field annotated ``annotation`` takes ``value`` (an int where a float goes; a bool is no number; an
    enum takes its values)."""
    if annotation is Any or annotation is object:
        return True
    if isinstance(annotation, str):  # unresolved: judge by the names it spells
        names = {"None": type(None), "str": str, "int": int, "float": float, "bool": bool, "dict": dict}
        parts = [p.strip().split("[")[0] for p in annotation.split("|")]
        return any(p not in names or accepts(names[p], value) for p in parts)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(accepts(a, value) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if origin is not None:  # list[str], dict[str, Any]: the container's type
        annotation = origin
    if annotation is type(None):
        return value is None
    if isinstance(value, bool) and annotation in (int, float):
        return False
    if annotation is float:
        return isinstance(value, (int, float))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        try:
            annotation(value)
        except ValueError:
            return False
        return True
    return isinstance(value, annotation) if isinstance(annotation, type) else True


def test_accepts_tells_types_apart():
    assert accepts(float, 3) and accepts(float | None, None) and accepts(int | None, 2)
    assert (
        not accepts(int, 0.5) and not accepts(int, True) and not accepts(str, 1) and not accepts(float, "1")
    )
    assert accepts(dict[str, Any], {}) and not accepts(list[str], {})
    assert accepts("float | None", None) and not accepts("int", "x")


@pytest.mark.parametrize("name", PASSED_ON)
def test_each_field_passed_on_is_a_training_argument_of_a_compatible_type(name):
    assert name in THEIRS, (
        f"TrainerConfig.{name} is passed to TrainingArguments, which no longer has it (transformers renamed or "
        "dropped it): map it in prove.train.pipeline.training_arguments (TRAINER_OWN) or rename the field"
    )
    ours, theirs = _default(OURS[name]), _default(THEIRS[name])
    annotation = THEIR_HINTS.get(name, THEIRS[name].type)
    if (
        ours is dataclasses.MISSING or ours == "???"
    ):  # required (output_dir: OmegaConf's MISSING): a value's type
        ours = {str: "x", int: 1, float: 1.0, bool: True}.get(OUR_HINTS[name], ours)
    assert accepts(annotation, ours), (
        f"trainer.{name}: our default {ours!r} does not fit TrainingArguments.{name}: {annotation}"
    )
    if OURS[name].default is not dataclasses.MISSING and OURS[name].default != "???":
        assert theirs is dataclasses.MISSING or accepts(OUR_HINTS[name], theirs), (
            f"TrainingArguments.{name}'s default {theirs!r} does not fit TrainerConfig.{name}: {OUR_HINTS[name]}"
        )


def test_the_fields_mapped_by_name_and_the_pipelines_own_exist():
    """``activation_checkpointing`` and ``group_by_length`` go under the name the installed transformers declares
    (old or new, :func:`prove.train.pipeline.training_arguments`); the arguments the pipeline sets itself exist."""
    ckpt = [n for n in ("activation_checkpointing", "gradient_checkpointing") if n in THEIRS]
    assert ckpt and f"{ckpt[0]}_kwargs" in THEIRS
    assert accepts(THEIR_HINTS.get(ckpt[0], bool), True)
    if "train_sampling_strategy" in THEIRS:
        assert accepts(THEIR_HINTS["train_sampling_strategy"], "group_by_length")
    else:
        assert accepts(THEIR_HINTS["group_by_length"], True)
    missing = [n for n in SET_BY_PIPELINE if n not in THEIRS]
    assert not missing, (
        f"TrainingArguments lacks {missing}: prove.train.pipeline.training_arguments passes them"
    )
    # what the pipeline does not pass on is ours alone, or mapped above: a field added to TrainerConfig under a name
    # TrainingArguments lacks must be listed there (and mapped), or this fails
    assert set(TRAINER_OWN) <= set(OURS)
