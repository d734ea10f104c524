"""A few steps of each stage on a tiny model: loss finite and falling, every parameter changed, checkpoint contract."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from prove.train.pipeline import train

from tests.train.helpers import losses, tiny_overrides, train_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stages(tmp_path_factory, arithmetic_jsonl):
    """sft from scratch, then mars from its output (the conventional runs/<name>/{sft,mars} layout)."""
    run_dir = tmp_path_factory.mktemp("run")
    sft = train(train_config(tiny_overrides(run_dir, arithmetic_jsonl, **{"stage": "sft"})))
    mars = train(train_config(tiny_overrides(run_dir, arithmetic_jsonl, **{"stage": "mars", "lr": 1e-3})))
    return run_dir, sft, mars


def _state(path: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return dict(AutoModelForCausalLM.from_pretrained(path).named_parameters())


def _assert_falling(history):
    ls = losses(history)
    assert len(ls) >= 6 and all(math.isfinite(x) for x in ls)
    assert sum(ls[-3:]) / 3 < sum(ls[:3]) / 3, ls


def test_sft_loss_falls_and_every_parameter_changes(stages):
    from prove.train.modeling import scratch_model
    from transformers import AutoTokenizer

    run_dir, sft, _ = stages
    assert sft.output_dir == run_dir / "sft" and sft.global_step == 8
    _assert_falling(sft.log_history)
    cfg = train_config(tiny_overrides(run_dir, Path("unused"), stage="sft"))
    init = dict(
        scratch_model(
            cfg.model.scratch, AutoTokenizer.from_pretrained(run_dir / "tokenizer"), cfg.model, 0
        ).named_parameters()
    )
    after = _state(sft.output_dir)
    assert init.keys() == after.keys()
    unchanged = [n for n in init if torch.equal(init[n], after[n])]
    assert unchanged == []


def test_mars_loss_falls_and_every_parameter_and_the_mask_row_change(stages):
    run_dir, sft, mars = stages
    assert mars.output_dir == run_dir / "mars" and mars.global_step == 8
    _assert_falling(mars.log_history)
    assert all("loss_noisy" in h and "loss_clean" in h for h in mars.log_history if "loss" in h)
    before, after = _state(sft.output_dir), _state(mars.output_dir)
    unchanged = [n for n in before if torch.equal(before[n], after[n])]
    assert unchanged == []
    mask_id = json.loads((mars.output_dir / "prove.json").read_text())["mask_token_id"]
    emb = "model.embed_tokens.weight"
    assert not torch.equal(before[emb][mask_id], after[emb][mask_id])


def test_checkpoint_contract(stages):
    from prove.common.checkpoint import config_mask_id, read_prove_json
    from transformers import AutoTokenizer

    run_dir, sft, mars = stages
    meta = read_prove_json(mars.output_dir)
    assert meta is not None
    tok = AutoTokenizer.from_pretrained(mars.output_dir)
    assert meta.stage == "mars" and meta.block_size == 4 and meta.mask_token == "<|mask|>"
    assert meta.mask_token_id == tok.convert_tokens_to_ids("<|mask|>")
    assert config_mask_id(mars.output_dir) == meta.mask_token_id  # where vLLM's parallel drafting reads it
    assert config_mask_id(sft.output_dir) is None  # not a block proposer
    assert meta.base_model == read_prove_json(sft.output_dir).base_model == "scratch:qwen2-2l-32h"
    assert meta.extra["init_from"] == str(run_dir / "sft")
    assert meta.extra["training_config"]["stage"]["name"] == "mars"
    assert meta.extra["stopped_early"] is None and mars.stopped_early is None  # every step ran
    assert (
        read_prove_json(sft.output_dir).stage == "sft" and read_prove_json(sft.output_dir).block_size is None
    )
    for name in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"):
        assert (mars.output_dir / name).is_file(), name


def test_saved_checkpoint_generates_with_transformers(stages):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, _, mars = stages
    tok = AutoTokenizer.from_pretrained(mars.output_dir)
    model = AutoModelForCausalLM.from_pretrained(mars.output_dir).eval()
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Ana has 3 pens."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    out = model.generate(ids, max_new_tokens=5, do_sample=False)
    from prove.decode import Decoder

    ours = Decoder(str(mars.output_dir), method="ar").generate(ids[0].tolist(), max_new_tokens=5)
    assert len(ours.token_ids) > 0 and out[0, ids.shape[1] :].tolist() == ours.token_ids


def test_saved_checkpoint_decodes_in_prove_decode(stages):
    from prove.decode import Decoder

    _, _, mars = stages
    prompt = [
        {"role": "user", "content": "Ana has 3 pens. Ben gives Ana 2 more. How many pens does Ana have?"}
    ]
    ar = Decoder(str(mars.output_dir), method="ar").generate(prompt, max_new_tokens=12)
    lossless = Decoder(str(mars.output_dir), method="prove-lossless").generate(prompt, max_new_tokens=12)
    assert len(ar.token_ids) > 0
    assert lossless.token_ids == ar.token_ids


def test_resume_continues_from_the_last_checkpoint(tmp_path, arithmetic_jsonl):
    """A run that stopped after step 4 (its checkpoint-4 saved) restarts there, not at step 0."""
    over = dict(stage="sft", max_steps=6, **{"trainer.save_steps": 4, "trainer.save_total_limit": 3})
    first = train(
        train_config(tiny_overrides(tmp_path, arithmetic_jsonl, **over, **{"trainer.max_steps": 4}))
    )
    state_file = first.output_dir / "checkpoint-4" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    assert state["global_step"] == 4
    # Plant a marker in the checkpoint's history: only a real resume carries it into the second run.
    next(h for h in state["log_history"] if "loss" in h)["loss"] = 123.0
    state_file.write_text(json.dumps(state))
    # the first run finished (prove.json) with fewer steps: another config, continued only when asked (resume=true)
    second = train(train_config(tiny_overrides(tmp_path, arithmetic_jsonl, **over, resume="true")))
    assert second.global_step == 6
    logged = [h for h in second.log_history if "loss" in h]
    assert [h["step"] for h in logged] == [1, 2, 3, 4, 5, 6] and logged[0]["loss"] == 123.0
    with pytest.raises(ValueError, match="has no complete checkpoint"):
        train(train_config(tiny_overrides(tmp_path / "fresh", arithmetic_jsonl, stage="sft", resume="true")))


def test_wall_clock_cap_stops_saves_and_says_so(tmp_path, arithmetic_jsonl):
    with pytest.warns(
        UserWarning,
        match=r"wall-clock cap .* at step \d+ of 50: the checkpoint is under-trained. Raise trainer.max_minutes",
    ):
        res = train(
            train_config(
                tiny_overrides(
                    tmp_path, arithmetic_jsonl, stage="sft", max_steps=50, **{"trainer.max_minutes": 1e-4}
                )
            )
        )
    assert res.stopped_by_wall_clock and res.global_step < 50
    assert (res.output_dir / "model.safetensors").is_file()
    # the result and the checkpoint's prove.json both say the stage was cut short, and where
    expect = {
        "reason": "max_minutes",
        "step": res.global_step,
        "max_steps": 50,
        "max_minutes": 1e-4,
        "setting": "trainer.max_minutes",
    }
    assert res.stopped_early == expect
    assert json.loads((res.output_dir / "prove.json").read_text())["stopped_early"] == expect


def test_the_cap_at_the_last_step_is_no_early_stop():
    """``stopped_early`` is for a run the cap cut short: one it stops at its last step ran all its steps."""
    from types import SimpleNamespace

    from prove.train.trainer import WallClockCallback

    for step, early in ((3, True), (10, False)):
        cb = WallClockCallback(0.0)
        cb.on_train_begin(None, None, None)
        state = SimpleNamespace(global_step=step, max_steps=10, is_world_process_zero=False)
        control = cb.on_step_end(None, state, SimpleNamespace(should_training_stop=False, should_save=False))
        assert control.should_training_stop and cb.stopped_at_step == step
        assert (cb.stopped_early is not None) is early
        if early:
            assert cb.stopped_early["step"] == 3 and cb.stopped_early["max_steps"] == 10


def test_the_cap_warning_names_the_recipe_knob_that_sets_it():
    from prove.train.pipeline import max_minutes_setting

    cfg = train_config(["recipe=tiny", "stage=sft", "stage.role=verifier"])
    assert max_minutes_setting(cfg) == "stages.verifier.sft.max_minutes" and cfg.trainer.max_minutes == 2.5
    assert (
        max_minutes_setting(train_config(["recipe=tiny", "stage=mars"])) == "stages.proposer.mars.max_minutes"
    )
    assert max_minutes_setting(train_config(["stage=sft"])) == "trainer.max_minutes"
