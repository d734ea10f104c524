"""Training computes the head and the CE only where a target is, on ``[noisy blocks from (P − 1) // K on | clean]``
(docs/design.md §2.1): its masks follow the full 2L rule, its loss and gradients equal the full 2L forward's."""

from __future__ import annotations

import pytest
import torch
from prove.train.collate import Collator
from prove.train.losses import head_cross_entropy, mars_loss
from prove.train.masks import (
    block_attention_allowed,
    block_attention_bias,
    block_inputs,
    trimmed_attention_allowed,
    trimmed_inputs,
    trimmed_mask_mod,
    trimmed_targets,
)

from tests.numerics import assert_grads_match, assert_losses_match, assert_same_function, logit_scale

VOCAB, MASK, EOS, PAD = 40, 39, 2, 0


def _batch(k: int, shapes: list[tuple[int, int]]):
    """Rows of (length, prompt length), random tokens, collated with block padding to K."""
    g = torch.Generator().manual_seed(k)
    rows = []
    for length, prompt in shapes:
        ids = torch.randint(3, MASK, (length,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return Collator(pad_token_id=PAD, eos_token_id=EOS, block_size=k)(rows)


# prompts ending on a block edge (P a multiple of K: the prompt's last block is kept) and off it
SHAPES = {4: [(11, 4), (7, 3), (19, 8), (13, 6)], 16: [(40, 17), (21, 16), (30, 20), (18, 9)]}


@pytest.mark.parametrize("k", [4, 16])
def test_trimmed_mask_and_targets_are_the_full_rule_on_the_kept_positions(k):
    batch = _batch(k, SHAPES[k])
    ids, labels, am = batch["input_ids"], batch["labels"], batch["attention_mask"]
    x = trimmed_inputs(ids, labels, am, MASK, k)
    length, n = ids.shape[1], x.noisy_len
    assert n < length  # something was dropped
    full = block_attention_allowed(length, k)  # (2L, 2L)
    full_ids, full_pos = block_inputs(ids, labels, MASK)
    full_t = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1).repeat(1, 2)  # (B, 2L)
    got = trimmed_attention_allowed(x, k)
    t = trimmed_targets(labels, x)
    for b in range(ids.shape[0]):
        p_first = int((labels[b] != -100).nonzero()[0])
        assert int(x.starts[b]) == (p_first - 1) // k * k
        own = int(am[b].sum())
        real = [c for c in range(n) if int(x.stream_index[b, c]) < own] + list(range(n, n + length))
        src = [int(x.stream_index[b, c]) if c < n else length + c - n for c in real]  # index in the 2L input
        sub = torch.tensor(real)
        assert torch.equal(got[b][sub][:, sub], full[src][:, src])
        assert torch.equal(x.ids[b, sub], full_ids[b, src]) and torch.equal(
            x.position_ids[b, sub], full_pos[b, src]
        )
        assert torch.equal(t[b, sub], full_t[b, src])
        # every target of the full input is kept, and no real query attends a noisy padding column
        assert int((full_t[b] != -100).sum()) == int((t[b] != -100).sum())
        pad = torch.tensor([c for c in range(n) if c not in real], dtype=torch.long)
        if pad.numel():
            assert not got[b][sub][:, pad].any() and (t[b, pad] == -100).all()
    q = torch.arange(got.shape[1])[:, None]
    mod = trimmed_mask_mod(x, k)
    for b in range(ids.shape[0]):
        assert torch.equal(mod(b, 0, q, q.T), got[b])


def _full_loss(model, batch, k, ar_weight=1.0):
    ids, labels = batch["input_ids"], batch["labels"]
    x, pos = block_inputs(ids, labels, MASK)
    logits = model(input_ids=x, position_ids=pos, attention_mask=block_attention_bias(ids.shape[1], k)).logits
    return mars_loss(logits, labels, ar_weight).loss


def _grads(model, loss):
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.autograd.grad(loss, params)


def _lora(model):
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
    )
    return get_peft_model(model, cfg)


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("k", [4, 16])
def test_trainer_loss_and_gradients_equal_the_full_2l_forward(qwen2_factory, tmp_path, k, lora):
    from prove.train.trainer import MarsTrainer
    from transformers import TrainingArguments

    model = qwen2_factory(VOCAB, seed=3, attn="sdpa", init_std=0.2)
    model = _lora(model) if lora else model
    model.train()
    batch = dict(_batch(k, SHAPES[k]))
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    trainer = MarsTrainer(
        model=model, args=args, mask_token_id=MASK, block_size=k, ar_weight=0.5, ce_chunk_rows=7
    )
    trimmed = trainer.compute_loss(model, batch)
    full = _full_loss(model, batch, k, ar_weight=0.5)
    assert_losses_match(trimmed, full, model, logit_scale=logit_scale(model, batch["input_ids"]))
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    got = dict(zip(names, _grads(model, trimmed), strict=True))
    want = dict(zip(names, _grads(model, full), strict=True))
    assert_grads_match(got, want, model, tokens=2 * batch["input_ids"].numel())


def test_chunked_head_cross_entropy_equals_one_chunk_with_its_gradients():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=False)
    hidden = torch.randn(23, 8, requires_grad=True)
    targets = torch.randint(0, 11, (23,))
    one = head_cross_entropy(head, hidden, targets)
    chunked = head_cross_entropy(head, hidden, targets, chunk_rows=5)
    # chunks change the head GEMM's shape (other kernels): the fp32 bound of one 8-long reduction, and of the
    # weight gradient's 23-row sum behind it (tests/numerics.py)
    assert_same_function(chunked, one, reduction=8, depth=2, argmax=False)
    g1 = torch.autograd.grad(one.sum(), [hidden, head.weight])
    g2 = torch.autograd.grad(chunked.sum(), [hidden, head.weight])
    for a, b in zip(g1, g2, strict=True):
        assert_same_function(a, b, reduction=23, depth=3, argmax=False)
