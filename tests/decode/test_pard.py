"""Method ``pard`` on the engine: a separate block model (MARS-trained, ``draft=``) drafts K tokens in one pass and
the target verifies them, so the output is the target's greedy output token for token, whatever the draft.

The checks of the checkpoint contract move to the draft: it must have ``<|mask|>`` and a trained block size
(its prove.json), the target needs neither.
"""

from __future__ import annotations

import pytest
import torch
from prove.decode import Decoder
from prove.decode.methods import get_method
from prove.decode.proposers.pard import fit_vocab

from tests.decode.decode_helpers import hf_generate, mask_ids
from tests.decode.test_draft import perturbed

N = 24


def no_eos(dec: Decoder, prompt, n: int = N):
    return dec.generate(prompt, max_new_tokens=n, eos_token_id=[])


@pytest.mark.parametrize("kind", ["equal", "partly", "random"])
def test_pard_equals_the_targets_greedy_output(lm, make_lm, tokenizer, prompts, kind):
    """The target ``lm`` with a drafter that is itself (y_1 always accepted), a perturbed copy, or another random
    model."""
    draft = {"equal": lm, "partly": perturbed(lm, 0.006, seed=8), "random": make_lm(seed=7)}[kind]
    with pytest.warns(UserWarning, match="records no trained block size"):
        dec = Decoder(lm, tokenizer, method="pard", draft=draft, block_size=4)
    for p in prompts:
        out = no_eos(dec, p)
        assert out.token_ids == hf_generate(lm, p, N, suppress=mask_ids(tokenizer))
        s = out.stats
        # a block pass of the draft and a verification of the target a cycle (no block where the budget is spent)
        assert s.model_passes == s.cycles and s.draft_passes in (s.cycles, s.cycles - 1)
        # K = 4 a cycle, fewer only where the token budget ends
        assert len(s.proposed_by_depth) == 4 and s.proposed_by_depth[0] >= s.cycles - 1
        assert s.proposed_by_depth == sorted(s.proposed_by_depth, reverse=True)
        if kind == "equal":  # the model drafting for itself: y_1 is its next-token prediction, always right
            assert s.accepted_by_depth[0] == s.proposed_by_depth[0] and s.tokens_per_cycle >= 2


def test_pard_reads_the_drafts_checkpoint_not_the_targets(checkpoints, prompts):
    """Target = a distill-stage checkpoint (no trained K), draft = the mars checkpoint (K = 4): the block size
    and the mask come from the draft's prove.json and tokenizer."""
    dec = Decoder(checkpoints["verifier"], method="pard", draft=checkpoints["mars"])
    assert dec.params.block_size == 4 and dec.models.mask_token_id == dec.tokenizer.convert_tokens_to_ids(
        "<|mask|>"
    )
    assert not bool(dec.models.allowed[dec.models.mask_token_id])  # the placeholder is never output
    ar = Decoder(checkpoints["verifier"], method="ar")
    for p in prompts[:2]:
        assert no_eos(dec, p).token_ids == no_eos(ar, p).token_ids


def test_pard_refuses_what_its_draft_lacks(checkpoints):
    with pytest.raises(ValueError, match="needs a draft model: pass draft=PATH"):
        Decoder(checkpoints["mars"], method="pard")
    with pytest.raises(ValueError, match=r"has no <\|mask\|> token: train it with `prove-train stage=mars`"):
        Decoder(checkpoints["mars_on_stock"], method="pard", draft=checkpoints["stock"])
    with pytest.raises(
        ValueError, match="block_size=8 exceeds the block size 4 .* pass block_size=4 or less"
    ):
        Decoder(checkpoints["verifier"], method="pard", draft=checkpoints["mars"], block_size=8)
    with pytest.raises(ValueError, match="greedy"):
        Decoder(checkpoints["verifier"], method="pard", draft=checkpoints["mars"], temperature=0.7)


def test_pard_is_registered_as_lossless_block_drafting():
    m = get_method("pard")
    assert m.needs_draft and m.drafts_blocks and not m.needs_mask and not m.can_fuse
    assert m.is_lossless({}) and m.greedy_only and m.uses == ("block_size",)


def test_fit_vocab_cuts_or_pads_a_drafts_rows_to_the_targets():
    logits = torch.arange(12.0).reshape(2, 6)
    assert torch.equal(fit_vocab(logits, 4), logits[:, :4])
    padded = fit_vocab(logits, 8)
    assert padded.shape == (2, 8) and torch.equal(padded[:, :6], logits)
    assert bool(torch.isinf(padded[:, 6:]).all()) and bool((padded[:, 6:] < 0).all())
