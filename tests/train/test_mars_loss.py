"""The 2L MARS loss equals the loss computed the slow way, one plain causal forward per target (docs/design.md §2.1)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from prove.train.collate import Collator
from prove.train.losses import mars_loss
from prove.train.masks import block_attention_bias, block_inputs

from tests.numerics import assert_losses_match, logit_scale, needs_vector_isa

VOCAB, MASK, EOS, PAD = 40, 39, 2, 0


def _rows():
    g = torch.Generator().manual_seed(0)
    rows = []
    for length, prompt in [(11, 4), (7, 3), (16, 5)]:
        ids = torch.randint(3, MASK, (length,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return rows


def slow_loss(model, ids: torch.Tensor, labels: torch.Tensor, k: int, ar_weight: float) -> torch.Tensor:
    """Per sequence: for each noisy target, a causal forward over [clean before its block, noisy block up to it]."""
    per_seq = []
    for b in range(ids.shape[0]):
        x, y = ids[b], labels[b]
        noisy = torch.where(y != -100, torch.full_like(x, MASK), x)
        n_terms, c_terms = [], []
        for j in range(len(x) - 1):
            target = y[j + 1]
            if target == -100:
                continue
            start = (j // k) * k
            ctx = torch.cat([x[:start], noisy[start : j + 1]])[None]
            n_terms.append(F.cross_entropy(model(input_ids=ctx).logits[0, -1], target))
            c_terms.append(F.cross_entropy(model(input_ids=x[None, : j + 1]).logits[0, -1], target))
        if n_terms:
            per_seq.append(torch.stack(n_terms).mean() + ar_weight * torch.stack(c_terms).mean())
    return torch.stack(per_seq).mean()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("k,ar_weight", [(4, 1.0), (3, 0.5), (1, 1.0)])
def test_mars_loss_equals_slow_way(qwen2_factory, attn, k, ar_weight):
    model = qwen2_factory(VOCAB, attn=attn, seed=1)
    batch = Collator(pad_token_id=PAD, eos_token_id=EOS, block_size=k)(_rows())
    ids, labels = batch["input_ids"], batch["labels"]
    x, pos = block_inputs(ids, labels, MASK)
    bias = block_attention_bias(ids.shape[1], k)
    with torch.no_grad():
        logits = model(input_ids=x, position_ids=pos, attention_mask=bias).logits  # (B, 2L, V)
        fast = mars_loss(logits, labels, ar_weight=ar_weight)
        # the slow way sees each example unpadded by the batch (its own block padding kept)
        slow = slow_loss(model, ids, labels, k, ar_weight)
    # one 2L pass under the block mask against one plain pass per example: other widths, other kernels
    assert_losses_match(fast.loss, slow, model, logit_scale=float(logits.abs().max()))


def test_clean_term_is_plain_causal_lm_loss(qwen2_factory):
    """The AR term of one sequence is the ordinary shifted CE that SFT minimizes."""
    model = qwen2_factory(VOCAB, seed=2)
    batch = Collator(pad_token_id=PAD, eos_token_id=EOS, block_size=4)(_rows()[:1])
    ids, labels = batch["input_ids"], batch["labels"]
    x, pos = block_inputs(ids, labels, MASK)
    with torch.no_grad():
        out = mars_loss(
            model(input_ids=x, position_ids=pos, attention_mask=block_attention_bias(ids.shape[1], 4)).logits,
            labels,
        )
        ref = model(input_ids=ids, labels=labels).loss
    assert_losses_match(out.clean, ref, model, logit_scale=logit_scale(model, ids))


def test_loss_gradients_flow_and_empty_rows_are_ignored():
    logits = torch.randn(2, 8, 5, requires_grad=True)
    labels = torch.tensor([[-100, -100, 1, 2], [-100, -100, -100, -100]])
    out = mars_loss(logits, labels)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert logits.grad[1].abs().sum() == 0 and logits.grad[0].abs().sum() > 0


def _trainer_loss(model, batch, k, tmp_path):
    from prove.train.trainer import MarsTrainer
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    trainer = MarsTrainer(model=model, args=args, mask_token_id=MASK, block_size=k)
    with torch.no_grad():
        loss = trainer.compute_loss(model, dict(batch))
    (mask,) = trainer.step._masks.values()  # the masks the step kept for this batch layout
    return loss, type(mask).__name__


@pytest.mark.slow
@needs_vector_isa
def test_trainer_flex_attention_block_mask_matches_dense_mask(qwen2_factory, tmp_path):
    """MarsTrainer's FlexAttention path (a sparse BlockMask from block_mask_mod) gives the dense-mask loss."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    # compile from a clean cache: after another test's shapes torch recompiles flex_attention with dynamic shapes,
    # and inductor's dynamic CPU template fails on a mask_mod that reads a captured tensor (torch 2.13; the GPU
    # path is Triton's)
    torch._dynamo.reset()
    batch = Collator(pad_token_id=PAD, eos_token_id=EOS, block_size=4)(_rows())
    model = qwen2_factory(VOCAB, attn="sdpa", seed=4)
    dense, dense_kind = _trainer_loss(model, batch, 4, tmp_path)
    flex, flex_kind = _trainer_loss(qwen2_factory(VOCAB, attn="flex_attention", seed=4), batch, 4, tmp_path)
    assert (dense_kind, flex_kind) == ("Tensor", "BlockMask")
    assert_losses_match(flex, dense, model, logit_scale=logit_scale(model, batch["input_ids"]))
