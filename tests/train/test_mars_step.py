"""The MARS training step is composed once (:class:`prove.train.mars_step.MarsStep`) and run by three callers: the
trainer (``MarsTrainer.compute_loss``), the step benchmark (``tools/bench_mars_step.py``'s ``mars`` variant) and the
GPU check (``prove.recipes.gpu_check.training``). On the same weights and batch, in fp32, the three give the same loss
(within 1e-6), each through ``MarsStep.loss``: a caller that goes back to a step of its own, or one whose settings
drift from the trainer's, fails here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from prove.train import mars_step as step_module
from prove.train.mars_step import MarsStep

from tests.tools_helpers import load_tool

bench = load_tool("bench_mars_step")
TOL = 1e-6


def _trainer(model, tmp_path, mask_id: int, block_size: int, **kwargs):
    from prove.train.trainer import MarsTrainer
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path / "trainer"), use_cpu=True, report_to=[])
    return MarsTrainer(model=model, args=args, mask_token_id=mask_id, block_size=block_size, **kwargs)


def _bench_cfg(
    block_size: int, attention: str, ar_weight: float, ce_chunk_rows: int | None, depth_decay: float
):
    """The part of the composed recipe the benchmark's ``mars`` step reads."""
    stage = SimpleNamespace(
        block_size=block_size, attention=attention, ar_weight=ar_weight, ce_chunk_rows=ce_chunk_rows,
        depth_decay=depth_decay,
    )  # fmt: skip
    return SimpleNamespace(stage=stage)


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    """Each ``MarsStep.loss`` call, by the attention its mask was built for."""
    seen: list[str] = []
    original = MarsStep.loss

    def spy(self, model, unwrapped, batch):
        seen.append(str(self.impl))
        return original(self, model, unwrapped, batch)

    monkeypatch.setattr(MarsStep, "loss", spy)
    return seen


def test_trainer_benchmark_and_gpu_check_compute_one_loss(tmp_path, calls):
    """The GPU check's --tiny training (its own random model, batches and loop: the first loss is before any update)
    against the trainer's ``compute_loss`` and the benchmark's step on the same model and batch, all three on the dense
    mask of ``stage.attention=mask``; and that loss is the full 2L reference's (the benchmark's ``mars-full``)."""
    from prove.decode.random_models import random_model, shape_config
    from prove.recipes.gpu_check import training
    from prove.recipes.gpu_check.config import SHAPES, tiny_config

    cfg = tiny_config(train_steps=1)
    assert cfg.train_dtype == "float32"
    vocab = SHAPES[cfg.train_shape]["vocab_size"]
    mask_id = vocab - 1  # as run_train picks it
    batches = training.train_batches(cfg, vocab, mask_id, cfg.device)
    gpu = training.train_one(cfg, cfg.dense_attn, batches, mask_id)
    assert calls == [cfg.dense_attn] and gpu["grads_finite"]

    # the GPU check's model, built again: the same shape, dtype and seed
    config = shape_config(SHAPES[cfg.train_shape], attn=cfg.dense_attn, pad_token_id=0)
    model = random_model(config, cfg.device, torch.float32, seed=cfg.seed).train()
    ids, labels = batches[0]
    batch = {"input_ids": ids, "labels": labels}
    trainer = _trainer(
        model, tmp_path, mask_id, cfg.block_size, attention="mask", ce_chunk_rows=training.CE_CHUNK_ROWS
    )
    assert trainer.step.impl == cfg.dense_attn  # the dense mask, as the GPU check's
    bench_cfg = _bench_cfg(cfg.block_size, "mask", 1.0, training.CE_CHUNK_ROWS, 1.0)
    with torch.no_grad():
        trainer_loss = float(trainer.compute_loss(model, dict(batch)))
        bench_loss, fed, targets = bench.mars_loss_now(model, batch, bench_cfg, mask_id)
        full_loss = float(bench.mars_loss_full(model, batch, bench_cfg, mask_id)[0])
    assert calls == [cfg.dense_attn] * 3
    assert gpu["losses"][0] == pytest.approx(trainer_loss, abs=TOL, rel=0)
    assert float(bench_loss) == pytest.approx(trainer_loss, abs=TOL, rel=0)
    assert full_loss == pytest.approx(trainer_loss, rel=1e-5)
    # both streams' targets: every labelled position but each row's last, twice
    assert targets == 2 * int((labels[:, 1:] != -100).sum()) and fed > ids.numel()


def _lora_model(vocab: int, mask_id: int):
    """A tiny Llama under sdpa, LoRA on the attention with a trained-looking ``<|mask|>`` row (PEFT's
    trainable-token layer: the step's own head and input embedding replace PEFT's calls)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, tie_word_embeddings=True, initializer_range=0.2, max_position_embeddings=128,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    lora = LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
        trainable_token_indices=[mask_id], init_lora_weights=False,
    )  # fmt: skip
    model = get_peft_model(model, lora)
    with torch.no_grad():
        model.get_input_embeddings().token_adapter.trainable_tokens_delta["default"].normal_(std=0.3)
    return model


def test_trainer_and_benchmark_agree_on_the_recipes_step(tmp_path, calls):
    """The recipe's settings, which the GPU check does not use: the block attention ``stage.attention=auto`` picks
    under sdpa, LoRA with the trainable ``<|mask|>`` row, CE chunks, λ ≠ 1 and depth-weighted noisy targets, on
    right-padded rows of several lengths; the trainer's cached mask gives its first loss again."""
    from prove.train.collate import Collator
    from prove.train.masks import BLOCK_ATTENTION

    vocab, mask_id, k = 120, 119, 4
    gen = torch.Generator().manual_seed(1)
    rows = []
    for prompt, answer in [(5, 6), (8, 3), (3, 10)]:
        ids = torch.randint(3, mask_id, (prompt + answer,), generator=gen).tolist()
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    batch = dict(Collator(pad_token_id=0, eos_token_id=2, block_size=k)(rows))
    assert int(batch["attention_mask"].sum()) < batch["attention_mask"].numel()  # batch padding

    model = _lora_model(vocab, mask_id)
    settings = {"ar_weight": 0.5, "ce_chunk_rows": 5, "depth_decay": 0.6}
    trainer = _trainer(model, tmp_path, mask_id, k, attention="auto", **settings)
    assert trainer.step.impl == BLOCK_ATTENTION
    assert step_module.target_head(model.get_output_embeddings()) is not model.get_output_embeddings()
    bench_cfg = _bench_cfg(k, "auto", **settings)
    with torch.no_grad():
        first = float(trainer.compute_loss(model, dict(batch)))
        again = float(trainer.compute_loss(model, dict(batch)))  # the mask from the trainer's cache
        bench_loss = float(bench.mars_loss_now(model, batch, bench_cfg, mask_id)[0])
    assert calls == [BLOCK_ATTENTION] * 3
    assert again == first
    assert bench_loss == pytest.approx(first, abs=TOL, rel=0)
