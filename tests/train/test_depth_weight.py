"""``stage.depth_decay``: the noisy loss weighted by decode depth (a target at depth d weighs decay^(d−2)), on the
trimmed step, against a slow reference over the full 2L logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from prove.train.config import StageConfig
from prove.train.losses import depth_weights
from prove.train.masks import block_attention_bias, block_inputs, noisy_depth

from tests.numerics import assert_losses_match, logit_scale
from tests.train.test_mars_trim import MASK, SHAPES, VOCAB, _batch


def test_noisy_depth_counts_the_placeholders_up_to_the_output():
    # K = 4, P = 6: the output at 5 (last prompt token) is depth 1; block 4..7 counts from P; block 8..11 is whole
    p = torch.arange(4, 12)
    got = noisy_depth(p, torch.full_like(p, 6), 4)
    assert got.tolist() == [1, 1, 2, 3, 2, 3, 4, 5]  # index 4 (a prompt position) has no target: never read
    # P on a block edge: the prompt's last output (P − 1 = 7) is depth 1, the block at P starts at depth 2
    p = torch.tensor([7, 8, 9, 11])
    assert noisy_depth(p, torch.full_like(p, 8), 4).tolist() == [1, 2, 3, 5]


def test_depth_weights_decay_from_depth_two():
    d = torch.tensor([1, 2, 3, 4, 9])
    assert depth_weights(d, 0.5).tolist() == [1.0, 1.0, 0.5, 0.25, 0.5**7]
    assert depth_weights(d, 1.0).tolist() == [1.0] * 5


def _slow_weighted_loss(model, batch, k, decay, ar_weight):
    """Per sequence: Σ w·CE / Σ w over the noisy targets (w = decay^(depth − 2), depth = 1 + the placeholders of the
    block up to the output, counted by hand) + ar_weight × the clean mean; then the mean over sequences."""
    ids, labels = batch["input_ids"], batch["labels"]
    x, pos = block_inputs(ids, labels, MASK)
    length = ids.shape[1]
    logits = model(input_ids=x, position_ids=pos, attention_mask=block_attention_bias(length, k)).logits
    per_seq = []
    for b in range(ids.shape[0]):
        noisy_num = noisy_den = clean_num = clean_den = 0.0
        for j in range(length - 1):
            target = int(labels[b, j + 1])
            if target == -100:
                continue
            s = j // k * k
            masks = sum(int(labels[b, q]) != -100 for q in range(s, j + 1))
            w = decay ** max(masks + 1 - 2, 0)
            noisy_num = noisy_num + w * F.cross_entropy(logits[b, j], torch.tensor(target))
            noisy_den += w
            clean_num = clean_num + F.cross_entropy(logits[b, length + j], torch.tensor(target))
            clean_den += 1
        per_seq.append(noisy_num / noisy_den + ar_weight * clean_num / clean_den)
    return torch.stack(per_seq).mean()


@pytest.mark.parametrize("k", [4, 16])
def test_trainer_depth_weighted_loss_equals_the_slow_reference(qwen2_factory, tmp_path, k):
    from prove.train.trainer import MarsTrainer
    from transformers import TrainingArguments

    model = qwen2_factory(VOCAB, seed=5, attn="sdpa", init_std=0.2)
    batch = dict(_batch(k, SHAPES[k]))
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    trainer = MarsTrainer(
        model=model, args=args, mask_token_id=MASK, block_size=k, ar_weight=0.5, depth_decay=0.6
    )
    got = trainer.compute_loss(model, batch)
    want = _slow_weighted_loss(model, batch, k, 0.6, 0.5)
    assert_losses_match(got, want, model, logit_scale=logit_scale(model, batch["input_ids"]))
    uniform = MarsTrainer(model=model, args=args, mask_token_id=MASK, block_size=k, ar_weight=0.5)
    assert not torch.allclose(uniform.compute_loss(model, batch), got)  # the weighting is applied


def test_depth_decay_must_be_positive():
    with pytest.raises(ValueError, match="stage.depth_decay=0"):
        StageConfig(depth_decay=0.0)
