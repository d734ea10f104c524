"""The stage registry (prove.train.stages): one unit per stage, each answering the pipeline's questions."""

from __future__ import annotations

import ast
import inspect

import pytest
from prove.train import pipeline
from prove.train.collate import Collator, DistillCollator
from prove.train.config import Stage
from prove.train.stages import STAGES, DistillStage, MarsStage, SftStage, stage_unit

from tests.train.helpers import train_config


class _Tok:
    pad_token_id, eos_token_id = 0, 1


def test_every_stage_has_a_unit():
    assert set(STAGES) == set(Stage)
    assert isinstance(stage_unit("sft"), SftStage)
    assert isinstance(stage_unit(Stage.mars), MarsStage)
    assert isinstance(stage_unit("distill"), DistillStage)


def test_unknown_stage_names_the_choices():
    with pytest.raises(ValueError, match=r"unknown stage 'dpo': use one of \['sft', 'mars', 'distill'\]"):
        stage_unit("dpo")


def test_units_differ_where_the_stages_do(arithmetic_jsonl):
    mars = train_config(
        ["stage=mars", f"data.path={arithmetic_jsonl}", "block_size=8", "stage.ar_weight=0.5"]
    )
    unit = stage_unit(mars.stage.name)
    assert unit.adds_mask_token and unit.lora_trains_mask_token
    assert unit.block_size(mars) == 8 and unit.meta_extra(mars) == {"ar_weight": 0.5, "depth_decay": 1.0}
    assert unit.collator(mars, _Tok()) == Collator(pad_token_id=0, eos_token_id=1, block_size=8)

    sft = train_config(["stage=sft", f"data.path={arithmetic_jsonl}"])
    unit = stage_unit(sft.stage.name)
    assert not unit.adds_mask_token and unit.block_size(sft) is None and unit.meta_extra(sft) == {}
    assert unit.collator(sft, _Tok()) == Collator(pad_token_id=0, eos_token_id=1, block_size=1)

    assert not DistillStage.adds_mask_token and not DistillStage.lora_trains_mask_token
    assert DistillStage().collator(sft, _Tok()) == DistillCollator(pad_token_id=0)


def test_pipeline_run_is_straight_line():
    """The pipeline asks the unit; it never branches on the stage's name."""
    tree = ast.parse(inspect.getsource(pipeline))
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert "Stage" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not {"sft", "mars", "distill"} & names
