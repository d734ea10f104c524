"""Acceptance while training (stage mars's eval set): the numbers on a model whose noisy stream is the clean argmax,
eval.best, eval history across a resume, and the bad inputs refused at start."""

from __future__ import annotations

import json

import pytest
import torch
from prove.train.pipeline import train

from tests.train.helpers import tiny_overrides, train_config, write_checkpoint

K, V, MASK, EOT, PAD = 4, 48, 47, 2, 0


def _positional_model():
    """A GPT-2 whose token embeddings are zero: its outputs depend on positions only, and a noisy query sees the
    same positions (clean before its block, noisy in it) as the clean query at its index — so the noisy stream's
    argmax is the clean argmax there, everywhere, while the argmax still varies along the sequence."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=V, n_positions=128, n_embd=32, n_layer=2, n_head=2, tie_word_embeddings=False,
        bos_token_id=EOT, eos_token_id=EOT,
    )  # fmt: skip
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        model.transformer.wte.weight.zero_()
        model.lm_head.weight.normal_(0, 1.0)
        model.lm_head.weight[EOT] -= 100.0  # never the argmax, so only the labels end a turn
    return model


def _greedy(model, length: int) -> list[int]:
    """ĝ_j for j < length (position-only: any input gives it), over the ids decoding allows (not <|mask|>)."""
    with torch.no_grad():
        logits = model(input_ids=torch.zeros(1, length, dtype=torch.long)).logits[0]
    logits[:, MASK] = float("-inf")
    return logits.argmax(-1).tolist()


def test_a_noisy_stream_equal_to_the_clean_argmax_simulates_k_prime_plus_one_per_cycle(tmp_path):
    from prove.train.collate import Collator
    from prove.train.trainer import MarsTrainer
    from transformers import TrainingArguments

    model = _positional_model()
    g = _greedy(model, 64)
    rows, expected = [], {k: [] for k in range(1, K + 1)}
    for prompt, answer in [(5, 14), (8, 9), (4, 20), (11, 6)]:  # prompts ending at and off a block edge
        ids = (
            [7] * prompt + [g[j - 1] for j in range(prompt, prompt + answer)] + [EOT]
        )  # on-policy, then the end
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
        eot = prompt + answer
        for s in range(-(-prompt // K) * K, eot + 1, K):  # response blocks up to the end of turn
            for k in expected:
                expected[k].append(min(k + 1, eot - s + 1))
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    trainer = MarsTrainer(
        model=model, args=args, mask_token_id=MASK, block_size=K, eval_dataset=rows, eval_batch_size=3,
        data_collator=Collator(pad_token_id=PAD, eos_token_id=EOT, block_size=K),
    )  # fmt: skip
    out = trainer.evaluate()
    assert out["eval_blocks"] == len(expected[1])
    for k in range(1, K + 1):
        assert out[f"eval_tpc_k{k}"] == pytest.approx(sum(expected[k]) / len(expected[k]), abs=1e-4), k
    # off-policy: only the blocks holding the end of turn (ĝ never says EOT there), but for the one where it is the
    # block's last token (19 = 4·4 + 3: a label at in-block index K − 1 precedes no proposal)
    assert out["eval_offpolicy"] == pytest.approx(3 / len(expected[1]), abs=1e-4)
    assert trainer.state.log_history[-1]["eval_tpc_k4"] == out["eval_tpc_k4"]  # logged through the Trainer


def test_bad_eval_settings_fail_when_the_config_is_composed(tmp_path, arithmetic_jsonl):
    base = tiny_overrides(tmp_path, arithmetic_jsonl, stage="mars")
    with pytest.raises(
        ValueError, match=r"eval.block_size=5 is above the trained K = 4.*eval.block_size ≤ 4"
    ):
        train_config([*base, "eval.block_size=5"])
    with pytest.raises(ValueError, match=r"eval.steps scores an eval set.*set eval.rows=<N>"):
        train_config([*base, "eval.rows=0", "eval.steps=2"])
    with pytest.raises(ValueError, match=r"eval.best picks among saved checkpoints.*multiple of 2"):
        train_config([*base, "eval.best=true", "eval.rows=8", "eval.steps=3", "trainer.save_steps=2"])
    with pytest.raises(ValueError, match=r"eval.best reloads.*trainer.save_only_model=false"):
        train_config([*base, "eval.best=true", "deepspeed=zero3", "trainer.save_only_model=true"])


def test_eval_rows_beyond_the_data_or_eval_steps_without_an_eval_set_fail_before_training(
    tmp_path, arithmetic_jsonl
):
    over = tiny_overrides(tmp_path, arithmetic_jsonl, stage="mars", **{"stage.init_from": "null"})
    with pytest.raises(
        ValueError, match=r"eval.rows=1000 holds out every one of the stage's 256 rows.*lower"
    ):
        train(train_config([*over, "eval.rows=1000"]))
    # the suite's 256 rows are too few for the automatic eval set: asking for eval.steps says so
    with pytest.raises(
        ValueError, match=r"eval.steps needs an eval set.*the data has 256 rows.*eval.rows=<N>"
    ):
        train(train_config([*over, "eval.steps=2"]))
    assert not (tmp_path / "mars").exists() or not list((tmp_path / "mars").glob("checkpoint-*"))


def _eval_steps(history):
    return [h["step"] for h in history if "eval_blocks" in h]


@pytest.mark.slow
def test_a_resumed_run_keeps_its_eval_history_and_takes_a_new_cadence(tmp_path, arithmetic_jsonl):
    over = tiny_overrides(
        tmp_path, arithmetic_jsonl, stage="mars",
        **{"stage.init_from": "null", "eval.rows": 16, "eval.steps": 2, "trainer.save_steps": 2,
           "trainer.group_by_length": "true"},  # grouped batches exercised too
    )  # fmt: skip
    first = train(train_config([*over, "max_steps=4"]))
    assert _eval_steps(first.log_history) == [2, 4]
    state = json.loads((tmp_path / "mars" / "checkpoint-4" / "trainer_state.json").read_text())
    assert _eval_steps(state["log_history"]) == [2, 4]  # each checkpoint-N keeps the scores so far
    # the resume evaluates and saves on its own cadence, not the one trainer_state.json recorded (transformers'
    # default): with the old one step 5 would have neither a score nor a checkpoint for eval.best to load
    cadence = ["eval.steps=1", "trainer.save_steps=1"]
    second = train(train_config([*over, *cadence, "max_steps=6", "resume=true"]))
    assert _eval_steps(second.log_history) == [2, 4, 5, 6]
    assert (tmp_path / "mars" / "checkpoint-5").is_dir()
    meta = json.loads((tmp_path / "mars" / "prove.json").read_text())["eval"]
    assert [h["step"] for h in meta["history"]] == [2, 4, 5, 6] and meta["output"]["step"] == 6
    assert meta["best"] is None and meta["output"]["eval_blocks"] > 0


def _param_name(saved: str) -> str:
    """A saved adapter key (``base_model.model.….lora_A.weight``) as the live PeftModel names it (``….lora_A.default.weight``)."""
    return saved.replace(".lora_A.weight", ".lora_A.default.weight")


@pytest.mark.slow
def test_eval_best_with_lora_writes_the_best_checkpoints_merged_adapter(
    tmp_path, tokenizer, qwen2_factory, arithmetic_jsonl, monkeypatch
):
    """Scripted scores (step 4 best) over the real eval: the output is checkpoint-4's adapter merged into the base,
    and save_total_limit=1 does not delete checkpoint-4."""
    from prove.train.saving import merge_adapter
    from prove.train.trainer import MarsTrainer
    from safetensors.torch import load_file

    scripted = {2: 3.0, 4: 5.0, 6: 4.0}
    real = MarsTrainer.evaluate

    ended: dict[str, torch.Tensor] = {}

    def scored(self, *args, **kwargs):
        metrics = real(self, *args, **kwargs)
        if self.state.global_step == 6:
            ended.update({n: p.detach().clone() for n, p in self.model.named_parameters() if "lora_A" in n})
        metrics["eval_tpc_k4"] = self.state.log_history[-1]["eval_tpc_k4"] = scripted[self.state.global_step]
        return metrics

    monkeypatch.setattr(MarsTrainer, "evaluate", scored)
    base = write_checkpoint(
        tmp_path / "base",
        qwen2_factory(
            len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
        ),
        tokenizer,
    )
    over = tiny_overrides(
        tmp_path, arithmetic_jsonl, model="hf", stage="mars", peft="lora", max_steps=6, lr=1e-2,
        **{
            "model.name_or_path": str(base), "stage.init_from": str(base), "peft.r": 4, "peft.alpha": 8,
            "peft.dropout": 0.0, "eval.rows": 16, "eval.steps": 2, "trainer.save_steps": 2,
            "trainer.save_total_limit": 1, "eval.best": "true",
        },
    )  # fmt: skip
    res = train(train_config(over))
    mars = tmp_path / "mars"
    # rotation kept checkpoint-4 beside the newest while training; at the end transformers keeps only the best
    assert sorted(p.name for p in mars.glob("checkpoint-*")) == ["checkpoint-4"]
    meta = json.loads((mars / "prove.json").read_text())["eval"]
    assert meta["best"]["step"] == 4 and meta["best"]["value"] == 5.0 and meta["output"]["step"] == 4
    assert _eval_steps(res.log_history) == [2, 4, 6]
    ref = merge_adapter(base, mars / "checkpoint-4", tmp_path / "ref")
    got, want = load_file(mars / "model.safetensors"), load_file(ref / "model.safetensors")
    assert got.keys() == want.keys()
    for name in got:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-6)
    # the adapter written beside it is checkpoint-4's, not the step-6 weights training ended with
    adapter = load_file(mars / "adapter" / "adapter_model.safetensors")
    best = load_file(mars / "checkpoint-4" / "adapter_model.safetensors")
    assert adapter.keys() == best.keys() and all(torch.equal(adapter[n], best[n]) for n in adapter)
    lora_a = sorted(n for n in adapter if "lora_A" in n)[0]
    assert not torch.equal(adapter[lora_a], ended[_param_name(lora_a)])


def test_eval_best_and_group_by_length_reach_the_training_arguments(tmp_path, arithmetic_jsonl):
    from prove.train.pipeline import training_arguments

    over = tiny_overrides(tmp_path, arithmetic_jsonl, stage="mars", block_size=8, max_len=128)
    cfg = train_config(
        [*over, "eval.best=true", "eval.rows=8", "eval.block_size=6", "trainer.group_by_length=true"]
    )
    args = training_arguments(cfg, report_to=[])
    assert args.metric_for_best_model == "eval_tpc_k6" and args.greater_is_better is True
    # transformers 5.24's train_sampling_strategy; older ones' group_by_length
    assert getattr(args, "train_sampling_strategy", None) == "group_by_length" or vars(args).get(
        "group_by_length"
    )
    plain = training_arguments(train_config(over), report_to=[])
    assert plain.metric_for_best_model is None
    assert getattr(plain, "train_sampling_strategy", "random") == "random"
