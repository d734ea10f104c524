"""Helpers shared by the decode tests (imported as a sibling module, like tests/train/train_helpers.py)."""

from __future__ import annotations

import math

import torch


def mask_ids(tokenizer) -> list[int]:
    """The ``<|mask|>`` id of ``tokenizer`` as a list (empty without one): what the Decoder never outputs."""
    from prove.common.checkpoint import MASK_TOKEN

    vocab = tokenizer.get_vocab()
    return [vocab[MASK_TOKEN]] if MASK_TOKEN in vocab else []


def hf_generate(
    model,
    ids: list[int],
    n: int,
    eos: int | None = None,
    assistant=None,
    assistant_tokens: int = 5,
    *,
    suppress: list[int] | None = None,
) -> list[int]:
    """transformers' own greedy continuation of ``ids`` (``n`` new tokens at most): the reference every
    lossless method must reproduce. With ``assistant``: assisted generation, ``assistant_tokens`` per round
    on a constant schedule with the confidence cut-off off (our greedy SD's configuration). ``suppress``
    (``mask_ids(tokenizer)``): ids never generated, transformers' ``suppress_tokens``; the Decoder never
    outputs ``<|mask|>``, which a random test model's greedy argmax does pick now and then."""
    kw: dict = {"suppress_tokens": suppress} if suppress else {}
    if assistant is not None:
        gc = assistant.generation_config
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = assistant_tokens, "constant"
        gc.assistant_confidence_threshold = 0.0
        kw["assistant_model"] = assistant
    out = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
        **kw,
    )
    return out[0, len(ids) :].tolist()


class BigramLM(torch.nn.Module):
    """A toy causal LM for Monte-Carlo tests through the real Decoder: the next-token logits are a row of a
    (V, V) table picked by the last token, so exact distributions are one table lookup and a forward pass
    costs microseconds. It speaks the interfaces both engines use: ``DynamicCache``, ``position_ids`` and
    ``logits_to_keep`` (the reference loop), and the fast path's ``SlotCache`` with its float 4D mask over every
    slot. It writes one dummy KV entry per token (so cache cropping and slot writes are exercised) and checks
    that a given mask has one row per token and one column per key the cache returns."""

    def __init__(self, table: torch.Tensor) -> None:
        from transformers import Qwen2Config

        super().__init__()
        V = table.shape[0]
        self.config = Qwen2Config(
            vocab_size=V, hidden_size=4, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
            intermediate_size=4, max_position_embeddings=4096,
        )  # fmt: skip
        self.table = torch.nn.Parameter(table.float(), requires_grad=False)
        self.lm_head = torch.nn.Linear(1, V, bias=False)

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.lm_head

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.lm_head

    def forward(self, input_ids, past_key_values=None, position_ids=None, attention_mask=None, use_cache=True,
                logits_to_keep=0):  # fmt: skip
        from types import SimpleNamespace

        L = input_ids.shape[1]
        if past_key_values is not None:
            kv = torch.zeros(1, 1, L, 1)
            keys, _ = past_key_values.update(kv, kv, 0)
            if attention_mask is not None and attention_mask.dim() == 4:
                assert attention_mask.shape[-2:] == (L, keys.shape[2]), (attention_mask.shape, keys.shape)
                assert attention_mask.is_floating_point(), "a 4D mask must be float (additive)"
        logits = self.table[input_ids]  # (1, L, V)
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)


# -- bench reports made by hand (tests/decode/bench, test_fused) --------------------------------------------


def table_row(name, agreement, lossless, **kw):
    row = {
        "name": name, "method": name, "params": {"theta": 0.1}, "swept": {}, "lossless": lossless,
        "tokens_per_cycle": 3.25, "model_passes_per_token": 0.31, "verifier_passes_per_token": 0.0,
        "draft_passes_per_token": math.nan, "tokens_per_s": 120.0, "speedup_median": 2.0, "speedup_total": 1.9,
        "agreement": agreement, "mean_first_divergence": None if agreement == 1 else 4.5, "accuracy": 0.9,
    }  # fmt: skip
    row.update(kw)
    return row


def hand_report() -> dict:
    curve = {"bin_size": 4, "start": [0, 4, 8], "mean": [3.0, 2.5, 2.0], "cycles": [2, 2, 2]}
    rows = [
        table_row("ar", 1.0, True, method="ar", accuracy=0.8, speedup_total=1.0, acceptance_by_depth=[],
                  tokens_per_cycle_by_position={**curve, "mean": [1.0, 1.0, 1.0]}),
        table_row("prove θ=0.1", 0.9, False, method="prove", swept={"theta": 0.1}, accuracy=0.8,
                  acceptance_by_depth=[1.0, 0.7, 0.4, 0.2], tokens_per_cycle_by_position=curve),
        table_row("prove θ=0.3", 1.0, False, method="prove", swept={"theta": 0.3}, accuracy=0.85,
                  speedup_total=1.4, acceptance_by_depth=[1.0, 0.5, 0.2, 0.1], tokens_per_cycle_by_position=curve),
        table_row("hf-greedy", 1.0, True, method="hf-greedy", speedup_total=None, acceptance_by_depth=[],
                  tokens_per_cycle_by_position={"bin_size": 4, "start": [], "mean": [], "cycles": []}),
    ]  # fmt: skip
    from prove.decode.bench.metrics import auc, roc_curve

    fpr, tpr, _ = roc_curve([0.9, 0.8, 0.4, 0.3, 0.2], [True, True, False, True, False])
    roc = {"auc": auc(fpr, tpr), "fpr": fpr.tolist(), "tpr": tpr.tolist()}
    trace = {"block_size": 4, "positions": 5, "match_by_depth": [1.0, 0.8, 0.6, 0.5], "roc": {"p_tilde": roc}}
    return {"rows": rows, "trace": trace, "prompts": {"n": 2, "with_answers": 2}}
