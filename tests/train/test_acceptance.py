"""Acceptance simulated from teacher-forced predictions (prove.train.acceptance) on hand-made predictions."""

from __future__ import annotations

import pytest
import torch
from prove.train.acceptance import AcceptanceSums, allowed_argmax, block_acceptance

K, L, P, EOT = 4, 16, 4, 99


def _case(eot_at: int = L - 1, prompt: int = P):
    """Labels with a response from ``prompt`` to ``eot_at`` (the end of turn), EOS padding after it, and a clean
    argmax that is on-policy everywhere (ĝ_j = x_{j+1})."""
    labels = torch.full((1, L), -100)
    resp = torch.arange(prompt, L)
    labels[0, prompt:] = 10 + resp
    labels[0, eot_at:] = EOT  # the end of turn, then its block padding (EOS = the end-of-turn id here)
    clean = torch.zeros(1, L, dtype=torch.long)
    clean[0, :-1] = labels[0, 1:].clamp(min=0)
    return labels, clean


def _sums(labels, clean, noisy, conf=None, tau=0.95):
    conf = torch.zeros(noisy.shape) if conf is None else conf
    return block_acceptance(clean, noisy, conf, labels, K, [EOT], tau).summary()


def test_a_depth_that_always_matches_gives_k_plus_one_but_the_end_of_turn_caps_the_last_block():
    labels, clean = _case()
    out = _sums(labels, clean, clean.clone())
    assert out["blocks"] == 3 and out["offpolicy"] == 0  # blocks at 4, 8, 12; the boundary block 0 is not one
    for k in range(1, K + 1):
        # blocks 4 and 8 commit K′ + 1; block 12 holds 4 tokens up to the end of turn at 15
        assert out[f"tpc_k{k}"] == pytest.approx((2 * (k + 1) + min(k + 1, 4)) / 3)
        assert out[f"accept_d{k}"] == 1.0


def test_a_depth_that_never_matches_commits_the_first_token_and_the_correction():
    labels, clean = _case()
    out = _sums(labels, clean, clean + 1)
    assert all(out[f"tpc_k{k}"] == 2.0 for k in range(1, K + 1))
    assert out["accept_d1"] == 1.0 and out["accept_d2"] == out["accept_d3"] == out["accept_d4"] == 0.0


def test_a_run_broken_at_depth_3_stops_there_although_depth_4_matches():
    labels, clean = _case()
    noisy = clean.clone()
    noisy[0, [5, 9, 13]] += 1  # depth 3 of each block is the noisy argmax at s + 1
    out = _sums(labels, clean, noisy)
    assert [out[f"tpc_k{k}"] for k in range(1, K + 1)] == [2.0, 3.0, 3.0, 3.0]
    assert out["accept_d2"] == 1.0 and out["accept_d3"] == 0.0 and out["accept_d4"] == 0.0


def test_an_off_policy_label_inside_a_run_cuts_it_and_is_counted():
    labels, clean = _case()
    # ĝ_8 is no longer x_9: from depth 3 on, block 8's verification would see another context
    clean[0, 8] += 1
    noisy = clean.clone()  # every proposal matches the clean argmax
    out = _sums(labels, clean, noisy)
    assert out["offpolicy"] == pytest.approx(1 / 3)
    # block 8: depths 1, 2 count (their labels x_8 = ĝ_7 hold), then the label at 9 differs: run 2 → 3 tokens
    assert out["tpc_k4"] == pytest.approx((5 + 3 + 4) / 3)
    assert out["tpc_k2"] == pytest.approx(3.0)


def test_an_off_policy_label_at_the_blocks_last_index_cuts_nothing_and_is_not_counted():
    """Catches counting the label at in-block index K − 1 as off-policy: it precedes no proposal of its block."""
    labels, clean = _case()
    clean[0, 6] += 1  # ĝ_6 ≠ x_7: x_7 is block 4's last token
    out = _sums(labels, clean, clean.clone())
    assert out["offpolicy"] == 0.0 and out["tpc_k4"] == pytest.approx((5 + 5 + 4) / 3)


def test_eos_padding_is_never_counted_and_the_boundary_block_is_left_out():
    labels, clean = _case(eot_at=9, prompt=5)  # P = 5: block 4 holds the prompt's last token
    out = _sums(labels, clean, clean.clone())
    # only block 8 is a cycle (block 12 is EOS padding past the end of turn): 2 tokens up to the end of turn
    assert out["blocks"] == 1 and out["tpc_k4"] == 2.0 and out["tpc_k1"] == 2.0
    assert out["accept_d3"] == 0.0  # depth 3 lies past the end of turn: no block counts it


def test_the_mars_rule_commits_one_plus_the_confident_run_without_a_bonus():
    labels, clean = _case()
    conf = torch.zeros(1, L)
    conf[0, [4, 8, 9, 12, 13, 14]] = 0.99  # block 4: depth 2; block 8: depths 2, 3; block 12: depths 2..4
    out = _sums(labels, clean, clean.clone(), conf)
    assert out["tpc_mars_k4"] == pytest.approx((2 + 3 + 4) / 3)
    assert out["tpc_mars_k1"] == 1.0 and out["tpc_mars_k2"] == 2.0


def test_sums_add_up_over_batches_and_the_argmax_skips_disallowed_ids():
    labels, clean = _case()
    a = block_acceptance(clean, clean, torch.zeros(1, L), labels, K, [EOT])
    both = block_acceptance(
        clean.repeat(2, 1), clean.repeat(2, 1), torch.zeros(2, L), labels.repeat(2, 1), K, [EOT]
    )
    assert torch.equal((a + a).as_tensor(), both.as_tensor())
    assert AcceptanceSums.from_tensor(both.as_tensor()).summary() == both.summary()
    logits = torch.tensor([[0.0, 5.0, 1.0, 9.0]])  # id 3: <|mask|> or a spare row
    idx, conf = allowed_argmax(logits, torch.tensor([True, True, True, False]))
    assert idx.item() == 1 and conf.item() == pytest.approx(torch.softmax(logits[0, :3], -1)[1].item())


def test_training_and_decoding_end_an_answer_on_the_same_tokens(tmp_path, qwen2_factory, tokenizer):
    """Catches the decoder and the simulated acceptance disagreeing on where an answer ends: a generation config that
    names ``<|endoftext|>`` while the tokenizer's EOS is ``<|im_end|>`` (the decoder once stopped on the first only,
    stage mars's eval on both)."""
    from prove.decode import Decoder
    from prove.train.trainer import MarsTrainer
    from transformers import TrainingArguments

    from tests.train.helpers import write_checkpoint

    end = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert end != tokenizer.eos_token_id
    model = qwen2_factory(len(tokenizer), seed=0, init_std=0.3)
    model.generation_config.eos_token_id = [end]
    ckpt = write_checkpoint(tmp_path / "m", model, tokenizer, block_size=K)
    dec = Decoder.from_pretrained(str(ckpt), method="ar")
    trainer = MarsTrainer(
        model=model,
        args=TrainingArguments(output_dir=str(tmp_path / "t"), use_cpu=True, report_to=[]),
        processing_class=tokenizer,
        mask_token_id=tokenizer.convert_tokens_to_ids("<|mask|>"),
        block_size=K,
    )
    assert dec.eos_ids() == trainer._stop_ids() == sorted({end, tokenizer.eos_token_id})


def _walk(noisy_ok: list[bool], start: int, eot: int, k: int) -> tuple[int, int, list[int]]:
    """The decoder's walk on position-only predictions: each cycle starts where the last one ended and commits
    1 + the run of depths 2..k whose proposal (the noisy argmax at s + d − 2) holds, up to the end of turn:
    ``(tokens, cycles, accepted count by depth)``."""
    s, cycles, hits = start, 0, [0] * k
    while s <= eot:
        run = 1
        while run < k and noisy_ok[s + run - 1]:
            run += 1
        n = min(run + 1, eot - s + 1)
        for d in range(min(run, n)):
            hits[d] += 1
        s, cycles = s + n, cycles + 1
    return eot - start + 1, cycles, hits


def test_the_walk_estimate_tracks_a_decode_that_spends_more_cycles_where_blocks_commit_little():
    """Catches reporting the aligned mean (3.6) for a decode that commits 3.0 tokens per cycle: an easy stretch
    (every proposal right) then a hard one (none right), which a walk crosses in 7 cycles and 13 cycles."""
    n, easy_until = 64, 36
    labels = torch.full((1, n), -100)
    labels[0, P:] = 10 + torch.arange(P, n)
    labels[0, n - 1] = EOT
    clean = torch.zeros(1, n, dtype=torch.long)
    clean[0, :-1] = labels[0, 1:]
    noisy = clean.clone()
    noisy[0, easy_until:] += 1
    sums = block_acceptance(clean, noisy, torch.zeros(1, n), labels, K, [EOT])
    out = sums.summary()
    tokens, cycles, hits = _walk([j < easy_until for j in range(n)], P, n - 1, K)
    assert tokens / cycles == 3.0 and out["tpc_k4"] == pytest.approx(54 / 15)  # 8 blocks of 5, 7 of 2
    assert out["tpc_walk_k4"] == pytest.approx(15 / (8 / 5 + 7 / 2))
    assert abs(out["tpc_walk_k4"] / (tokens / cycles) - 1) < 0.03 < abs(out["tpc_k4"] / (tokens / cycles) - 1)
    assert out["tpc_walk_k1"] == 2.0  # K′ = 1: every block commits 2 — the harmonic and the plain mean agree
    walk = sums.walk_accept_by_depth()
    assert walk[0] == 1.0
    assert walk[1] == pytest.approx(hits[1] / cycles, abs=0.05)  # 7 / 20 decoded, 0.31 walked, 0.53 aligned
    assert AcceptanceSums.from_tensor(sums.as_tensor()).walk_accept_by_depth() == walk
