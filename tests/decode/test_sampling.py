"""Random draws happen on the generator's device (a CUDA generator never meets a CPU draw), and the masking
of forbidden ids keeps every other probability exact."""

from __future__ import annotations

import copy

import pytest
import torch
from prove.decode import Decoder
from prove.decode.rules.speculative import nsd_sample, sd_sample
from prove.decode.sampling import pick, restrict

pytestmark = pytest.mark.filterwarnings("ignore:checkpoint .* records no trained block size")


# -- every random draw happens on the generator's device ------------------------------------------------------
#
# With torch's default device set to "meta", a draw that omits ``device=`` lands on "meta" while the generator
# and every tensor are on the CPU: torch refuses it. That is the CUDA crash (a CUDA generator, a draw on the
# default CPU device) reproduced on a CPU-only machine.


def test_rule_draws_use_the_generator_device():
    y = torch.tensor([0, 1])
    q = torch.full((2, 3), 1 / 3)
    p = torch.tensor([[0.2, 0.3, 0.5]] * 3)
    g = torch.Generator().manual_seed(0)
    ref = sd_sample(y, q, p, generator=torch.Generator().manual_seed(0))
    with torch.device("meta"):
        assert sd_sample(y, q, p, generator=g) == ref
        g.manual_seed(0)
        assert nsd_sample(y, q, p, 0.5, generator=g).n >= ref.n
        drawn = pick(p, 1.0, torch.Generator().manual_seed(1))
    assert drawn.device.type == "cpu"


@pytest.mark.parametrize("method", ["ar", "sd", "nsd", "mars"])
def test_sampling_through_the_decoder_draws_on_the_generator_device(lm, tokenizer, prompts, method):
    kw = (
        {"draft": copy.deepcopy(lm)}
        if method in ("sd", "nsd")
        else {"block_size": 4}
        if method == "mars"
        else {}
    )
    dec = Decoder(lm, tokenizer, method=method, temperature=0.8, top_k=20, top_p=0.9, **kw)
    ref = dec.generate(prompts[0], max_new_tokens=8, eos_token_id=[], seed=3).token_ids
    with torch.device("meta"):
        out = dec.generate(prompts[0], max_new_tokens=8, eos_token_id=[], seed=3).token_ids
    assert out == ref


# -- <|mask|> and ids outside a model's vocabulary are never proposed, sampled or committed ---------------------


def test_restrict_blocks_exactly_each_masks_ids_and_keeps_the_dtype():
    """Two masks in turn, twice each, in two dtypes: each call blocks its own mask's ids and leaves every other
    logit as it was (the penalty is built once per mask and dtype and must never serve another)."""
    logits = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    a = torch.tensor([True, False, True, True, True, True])
    b = torch.tensor([True, True, True, False, False, True])
    for allowed in (a, b, a, b):
        for dtype in (torch.float32, torch.bfloat16):
            x = logits.to(dtype)
            out = restrict(x, allowed)
            assert out.dtype == dtype
            assert torch.equal(out[:, allowed], x[:, allowed])
            assert bool((out[:, ~allowed] == float("-inf")).all())
    assert restrict(logits, None) is logits


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method", ["ar", "sd", "nsd", "mars"])
def test_sampling_runs_on_cuda(lm, tokenizer, prompts, method):
    """Where a GPU exists: the generator and every tensor on CUDA, so sampling draws on the device (sd / nsd too)."""
    target = copy.deepcopy(lm).cuda()
    kw = (
        {"draft": copy.deepcopy(lm).cuda()}
        if method in ("sd", "nsd")
        else {"block_size": 4}
        if method == "mars"
        else {}
    )
    dec = Decoder(target, tokenizer, method=method, temperature=0.8, top_k=20, top_p=0.9, **kw)
    assert dec.generator.device.type == "cuda"
    out = dec.generate(prompts[0], max_new_tokens=8, eos_token_id=[], seed=1)
    assert len(out.token_ids) == 8
