"""The MARS step's fast paths compute the reference's loss and gradients: the block attention
(:mod:`prove.train.attention`, ``stage.attention=blocks``: the clean stream causal on its own, a mask of the noisy rows
only) against one dense float mask over the whole trimmed input, and the ``<|mask|>`` row's head
(:func:`prove.train.modeling.target_head`) against PEFT's ``TrainableTokensLayer``, whose adapter still saves, reloads
and merges in PEFT's format."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from prove.data.chat import IGNORE_INDEX
from prove.train import attention
from prove.train.attention import mars_attention_impl, mars_block_attention, noisy_chunks
from prove.train.masks import (
    BLOCK_ATTENTION,
    trimmed_attention_bias,
    trimmed_inputs,
    trimmed_noisy_bias,
    trimmed_targets,
)

from tests.numerics import (
    assert_grads_match,
    assert_losses_match,
    assert_same_function,
    fp32_tol,
    logit_scale,
)

VOCAB, MASK_ID = 300, 299


def _model(lora: bool, seed: int = 0):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, tie_word_embeddings=True, initializer_range=0.2, max_position_embeddings=256,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    if lora:
        from peft import LoraConfig, get_peft_model

        lora_cfg = LoraConfig(
            r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            trainable_token_indices=[MASK_ID], init_lora_weights=False,
        )  # fmt: skip
        torch.manual_seed(seed + 1)  # random LoRA factors: the adapter changes the outputs
        model = get_peft_model(model, lora_cfg)
        emb = model.get_input_embeddings().token_adapter
        with torch.no_grad():  # a trained-looking row, not the base's own
            emb.trainable_tokens_delta["default"].normal_(std=0.3)
    return model


def _batch(block_size: int) -> dict[str, torch.Tensor]:
    """Four rows, right-padded: prompts ending on a block edge (2K, K) and inside a block, answers of every length
    kind (one token, several blocks); the shortest row leaves batch padding."""
    k = block_size
    shapes = [(2 * k, k + 3), (k - 1, 2 * k), (k, 1), (k + 2, k - 1)]  # (prompt, answer)
    lengths = [-(-(p + a) // k) * k for p, a in shapes]  # each a multiple of K (the collator pads with EOS)
    width = max(lengths)
    gen = torch.Generator().manual_seed(k)
    ids = torch.randint(3, MASK_ID, (len(shapes), width), generator=gen)
    labels = ids.clone()
    mask = torch.zeros_like(ids)
    for b, ((p, _), n) in enumerate(zip(shapes, lengths, strict=True)):
        labels[b, :p] = IGNORE_INDEX
        labels[b, n:] = IGNORE_INDEX
        mask[b, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def _trainer(model, block_size: int, attention: str, tmp_path):
    from prove.train.trainer import MarsTrainer
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path / attention), use_cpu=True, report_to=[])
    return MarsTrainer(
        model=model, args=args, mask_token_id=MASK_ID, block_size=block_size, attention=attention
    )


def _reference_loss(model, batch, block_size: int) -> torch.Tensor:
    """The step as it was: one dense float mask over the whole trimmed input under sdpa, PEFT's own head module."""
    from prove.train.losses import mars_loss_terms

    ids, labels = batch["input_ids"], batch["labels"]
    x = trimmed_inputs(ids, labels, batch["attention_mask"], MASK_ID, block_size)
    bias = trimmed_attention_bias(x, block_size)  # (B, 1, T, T)
    t = trimmed_targets(labels, x)
    rows, cols = (t != IGNORE_INDEX).nonzero(as_tuple=True)
    hidden = model(
        input_ids=x.ids, position_ids=x.position_ids, attention_mask=bias, output_hidden_states=True
    )
    h = hidden.hidden_states[-1][rows, cols]  # (n, H) after the final norm
    ce = F.cross_entropy(model.get_output_embeddings()(h), t[rows, cols], reduction="none")
    return mars_loss_terms(ce, rows, cols < x.noisy_len, ids.shape[0]).loss


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("block_size", [4, 16])
def test_block_attention_step_equals_the_dense_mask_reference(block_size, lora, tmp_path, monkeypatch):
    """Loss and every trainable gradient of ``MarsTrainer.compute_loss`` under ``stage.attention=blocks`` (with LoRA:
    its ``<|mask|>`` row through :func:`target_head` too) equal the dense-mask step's with PEFT's own head. The noisy
    rows run one block a chunk (three chunks here), so a chunk's keys are its own block and its clean prefix only.

    Catches: the clean queries reading the noisy keys (a causal pass over all N + L keys), the split between the two
    parts off by a block, a chunk's keys or mask misaligned (a neighbour block, a prefix one block short), the
    ``<|mask|>`` column of the head left at the frozen weight, the row's head gradient dropped or landing on another
    row."""
    monkeypatch.setattr(attention, "CHUNK_ROWS", block_size)
    batch = _batch(block_size)
    ref_model = _model(lora)
    ref = _reference_loss(ref_model, batch, block_size)
    ref.backward()
    want = _grads(ref_model)

    model = _model(lora)
    trainer = _trainer(model, block_size, "blocks", tmp_path)
    assert trainer.attention_impl == BLOCK_ATTENTION and model.config._attn_implementation == BLOCK_ATTENTION
    loss = trainer.compute_loss(model, dict(batch))
    loss.backward()
    got = _grads(model)
    assert_losses_match(loss, ref, model, logit_scale=logit_scale(ref_model, batch["input_ids"]))
    if lora:
        assert any("trainable_tokens_delta" in n for n in got)
    assert_grads_match(got, want, model, tokens=2 * batch["input_ids"].numel())


def _layer_inputs(block_size: int):
    """A layer's q/k/v ``(B, H, T, d)`` over a trimmed batch and its noisy-rows mask."""
    batch = _batch(block_size)
    x = trimmed_inputs(batch["input_ids"], batch["labels"], batch["attention_mask"], MASK_ID, block_size)
    b, t = x.ids.shape
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(b, 2, t, 8, generator=gen) for _ in range(3))
    return x, q, k, v


def _assert_attention_match(got: torch.Tensor, want: torch.Tensor, msg: str = "") -> None:
    """One attention layer computed two ways (other chunks, other kernels): q·k over the head dim, then the
    weighted sum over the keys — two reductions, the longest of them the row of keys (tests/numerics.py)."""
    assert_same_function(
        got, want, reduction=max(got.shape[-1], got.shape[1]), depth=2, argmax=False, msg=msg
    )


class _Layer(torch.nn.Module):
    num_key_value_groups = 1
    is_causal = True


@pytest.mark.parametrize("block_size", [4, 16])
def test_block_attention_function_equals_sdpa_under_the_whole_mask(block_size):
    """One layer: :func:`mars_block_attention` with the noisy rows equals sdpa under the whole trimmed mask, and masks
    with a named mistake do not — a clean prefix that includes the query's own block, blocks shifted by one, a noisy
    block reading the clean stream's future — so the equality above can fail on each."""
    x, q, k, v = _layer_inputs(block_size)
    layer = _Layer()
    full = F.scaled_dot_product_attention(q, k, v, attn_mask=trimmed_attention_bias(x, block_size)).transpose(
        1, 2
    )
    noisy = trimmed_noisy_bias(x, block_size)  # (B, 1, N, T)
    assert noisy.shape == (x.ids.shape[0], 1, x.noisy_len, x.ids.shape[1])
    got, _ = mars_block_attention(layer, q, k, v, noisy, scaling=None)
    _assert_attention_match(got, full)

    n, kk = x.noisy_len, block_size
    p = x.stream_index  # (B, T)
    pq, pk = p[:, :n, None], p[:, None, :]
    key_noisy = (torch.arange(p.shape[1]) < n)[None, None, :]

    def bias(allowed: torch.Tensor) -> torch.Tensor:
        return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)[:, None]

    own = key_noisy & (pk <= pq) & (pk // kk == pq // kk)
    mistakes = {
        "clean prefix includes its own block": own | (~key_noisy & (pk // kk <= pq // kk)),
        "block boundary off by one": (key_noisy & (pk <= pq) & ((pk + 1) // kk == (pq + 1) // kk))
        | (~key_noisy & ((pk + 1) // kk < (pq + 1) // kk)),
        "noisy reads the clean stream causally": own | (~key_noisy & (pk < pq)),
    }
    for what, allowed in mistakes.items():
        wrong, _ = mars_block_attention(layer, q, k, v, bias(allowed), scaling=None)
        bound = fp32_tol(full, reduction=max(full.shape[-1], full.shape[1]), depth=2)
        assert float((wrong - full).abs().max()) > 100 * bound, what  # far outside what kernels alone move


@pytest.mark.parametrize("block_size", [4, 16])
def test_noisy_chunks_read_only_their_own_blocks_and_clean_prefix(block_size, monkeypatch):
    """One block a chunk: each chunk's keys are exactly its own block's noisy columns and the clean prefix before that
    block (the longest over the batch: ``max(start) + q0``), never a neighbour block or the clean stream past it; a
    chunk size off the block edge grows to the next edge; the output equals sdpa under the whole mask for every chunk
    size. Catches: a chunk reading the whole noisy part or the whole clean stream (correct but the cost this removes),
    a prefix one block short or long (wrong output), a chunk cut inside a block (a query missing its block's keys)."""
    x, q, k, v = _layer_inputs(block_size)
    kk, n = block_size, x.noisy_len
    layer = _Layer()
    full = F.scaled_dot_product_attention(q, k, v, attn_mask=trimmed_attention_bias(x, kk)).transpose(1, 2)
    cut = noisy_chunks(trimmed_noisy_bias(x, kk), kk)
    assert len(cut) == n // kk > 1
    far = int(x.starts.max())
    for c in cut:
        assert (c.q0, c.q1, c.a, c.b) == (c.q0, c.q0 + kk, c.q0, c.q0 + kk)
        assert c.clean == far + c.q0
        assert c.mask.shape == (x.ids.shape[0], 1, kk, kk + c.clean)
    visited = sum((c.q1 - c.q0) * (c.b - c.a + c.clean) for c in cut)
    assert visited < n * x.ids.shape[1]
    grown = noisy_chunks(trimmed_noisy_bias(x, kk), kk + 1)
    assert [c.q1 - c.q0 for c in grown][:-1] == [2 * kk] * (len(grown) - 1)
    for rows in (1, kk - 1, kk, 2 * kk + 1, 10 * n):
        monkeypatch.setattr(attention, "CHUNK_ROWS", rows)
        got, _ = mars_block_attention(layer, q, k, v, trimmed_noisy_bias(x, kk), scaling=None)
        _assert_attention_match(got, full, msg=f"chunk rows {rows}")


def test_every_other_mask_is_plain_sdpa_and_the_choice_resolves():
    """Masks transformers builds (one row per query, or none) go to sdpa unchanged: a model switched to the block
    attention decodes as under sdpa. ``stage.attention``: auto picks blocks under sdpa and keeps FlexAttention's
    BlockMask and eager's dense mask; a typo is refused."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    _, q, k, v = _layer_inputs(4)
    layer = _Layer()
    t = q.shape[2]
    pad = torch.zeros(q.shape[0], 1, t, t).masked_fill(torch.rand(q.shape[0], 1, t, t) < 0.3, -1e9)
    for mask in (None, pad):
        got, _ = mars_block_attention(layer, q, k, v, mask)
        want, _ = sdpa_attention_forward(layer, q, k, v, mask)
        _assert_attention_match(got, want)
    assert mars_attention_impl("auto", "sdpa") == BLOCK_ATTENTION
    assert mars_attention_impl("auto", "flex_attention") == "flex_attention"
    assert mars_attention_impl("auto", "eager") == "eager"
    assert mars_attention_impl("blocks", "eager") == BLOCK_ATTENTION
    assert mars_attention_impl("mask", "sdpa") == "sdpa"
    assert mars_attention_impl("mask", BLOCK_ATTENTION) == "sdpa"
    with pytest.raises(ValueError, match="stage.attention=block: use auto, blocks or mask"):
        mars_attention_impl("block", "sdpa")


def test_mask_row_head_equals_peft_and_the_adapter_saves_merges_and_decodes(tmp_path):
    """:func:`target_head` gives PEFT's logits and gradients (hidden states and the ``<|mask|>`` row; none for the
    frozen weight), touching no other row; :func:`target_embedding` PEFT's input vectors and the row's gradient. After a training step through it the adapter saves in PEFT's format
    (``trainable_tokens_delta``), reloads onto a fresh base, merges, and decodes the same greedy tokens as the trained
    model. Catches: the row's column left at the frozen weight, its gradient dropped, the rows at the wrong index, a
    saved adapter without the trained row."""
    from peft import PeftModel
    from prove.train.modeling import target_embedding, target_head
    from safetensors.torch import load_file

    model = _model(lora=True)
    head = model.get_output_embeddings()
    fast = target_head(head)
    assert fast is not head
    delta = model.get_input_embeddings().token_adapter.trainable_tokens_delta[
        "default"
    ]  # tied: one row for both
    hidden = torch.randn(12, 64, generator=torch.Generator().manual_seed(2))
    targets = torch.tensor([MASK_ID, 5, 7, MASK_ID, 9, 11, 13, 15, 17, 19, 21, 23])
    out = {}
    for name, fn in (("peft", head), ("fast", fast)):
        h = hidden.clone().requires_grad_(True)
        delta.grad = None
        logits = fn(h)
        F.cross_entropy(logits, targets).backward()
        out[name] = (logits.detach(), h.grad, delta.grad.clone())
        assert head.token_adapter.get_base_layer().weight.grad is None
    for a, b in zip(out["peft"], out["fast"], strict=True):  # logits, the hidden's and the row's gradients
        assert_same_function(b, a, reduction=64, depth=3, argmax=False)
    assert out["fast"][2].abs().sum() > 0
    plain = torch.nn.Linear(4, 3, bias=False)
    assert target_head(plain) is plain  # no adapter: unchanged

    # the input side: the trained row where its id is, its gradient the row's own
    emb = model.get_input_embeddings()
    fast_emb = target_embedding(emb)
    assert fast_emb is not None and target_embedding(torch.nn.Embedding(4, 3)) is None
    ids = torch.tensor([[5, MASK_ID, 7, MASK_ID], [MASK_ID, 1, 2, 3]])
    weights = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(3))
    got = {}
    for name, fn in (("peft", emb), ("fast", fast_emb)):
        delta.grad = None
        vectors = fn(ids)  # (2, 4, H)
        (vectors * weights).sum().backward()
        got[name] = (vectors.detach(), delta.grad.clone())
    for a, b in zip(got["peft"], got["fast"], strict=True):  # the vectors and the row's gradient (a sum of 5)
        assert_same_function(b, a, reduction=64, depth=2, argmax=False)

    # one optimizer step of the block step, then save / reload / merge / decode
    delta.grad = None
    before = delta.detach().clone()
    trainer = _trainer(model, 4, "blocks", tmp_path)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    trainer.compute_loss(model, _batch(4)).backward()
    opt.step()
    assert not torch.equal(delta.detach(), before)
    model.save_pretrained(tmp_path / "adapter")
    saved = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    rows = [v for key, v in saved.items() if "trainable_tokens_delta" in key]
    assert len(rows) == 1
    torch.testing.assert_close(rows[0], delta.detach())

    reloaded = PeftModel.from_pretrained(_model(lora=False), tmp_path / "adapter").merge_and_unload()
    merged = model.merge_and_unload()
    torch.testing.assert_close(reloaded.get_input_embeddings().weight[MASK_ID], delta.detach()[0])
    prompt = torch.tensor([[5, 17, 42, 8, MASK_ID, MASK_ID, MASK_ID]])
    kw = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        assert torch.equal(reloaded.generate(prompt, **kw), merged.generate(prompt, **kw))


@pytest.mark.parametrize(("choice", "impl"), [("auto", BLOCK_ATTENTION), ("mask", "sdpa")])
def test_stage_attention_reaches_the_trainer(choice, impl, tmp_path, arithmetic_jsonl):
    """``stage.attention`` composes from the config (a typo fails at start) and stage mars's trainer runs what it
    says. Catches: the stage not passing the key on (the trainer's own default, auto, would run either way)."""
    from prove.train.config import Stage
    from prove.train.stages import stage_unit
    from transformers import TrainingArguments

    from tests.train.helpers import tiny_overrides, train_config

    over = tiny_overrides(
        tmp_path / "run", arithmetic_jsonl, stage="mars", **{"model.attn_implementation": "sdpa"}
    )
    cfg = train_config([*over, f"stage.attention={choice}"])
    assert str(cfg.stage.attention) == choice
    model = _model(lora=False)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[])
    trainer = stage_unit(Stage.mars).trainer(cfg, MASK_ID, model=model, args=args)
    assert trainer.attention_impl == impl
    assert model.config._attn_implementation == (BLOCK_ATTENTION if choice == "auto" else "sdpa")
    with pytest.raises(Exception, match="attention"):
        train_config([*over, "stage.attention=block"])
