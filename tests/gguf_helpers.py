"""Tiny GGUF files written in-process with the ``gguf`` package's writer: a random Llama (SmolLM2's architecture)
and a byte-level BPE, laid out as llama.cpp lays them out, so transformers' GGUF reader reads them back.

Written here, never downloaded. What transformers needs from the file: the ``llama.*`` hyper-parameters, the
tensors under llama.cpp's names in float32 (``output.weight`` absent = tied embeddings), the query and key
projections with each head's two rotary halves interleaved row by row (the reader undoes that), and the
tokenizer in the metadata (``tokenizer.ggml.*``: the byte-level vocabulary, merges, token types, special ids,
and the chat template).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.conftest import redraw


def tiny_llama(tokenizer: Any, *, layers: int = 2, hidden: int = 32, heads: int = 4, kv_heads: int = 2,
               intermediate: int = 64, tie: bool = True, seed: int = 0, init_std: float = 0.3):  # fmt: skip
    """A random LlamaForCausalLM for ``tokenizer`` (fp32, eval mode); ``init_std`` re-draws the matrices so that
    greedy output varies (at the default init a random model repeats one token)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=tie,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config).eval()
    redraw(model, init_std, seed)
    return model


def _interleave_rotary_halves(w: torch.Tensor, n_head: int) -> np.ndarray:
    """HF keeps each head's rotary halves as two blocks of rows; llama.cpp interleaves them, row pairs (i, i + d/2)."""
    d = w.shape[0] // n_head
    return w.reshape(n_head, 2, d // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).numpy()


_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _gguf_tensors(model: Any) -> dict[str, np.ndarray]:
    c = model.config
    out: dict[str, np.ndarray] = {}
    for name, t in model.state_dict().items():
        t = t.detach().float().cpu()
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = t.numpy()
        elif name == "model.norm.weight":
            out["output_norm.weight"] = t.numpy()
        elif name == "lm_head.weight":
            if not c.tie_word_embeddings:
                out["output.weight"] = t.numpy()
        else:
            _, _, i, rest = name.split(".", 3)  # model.layers.<i>.<module>.weight
            module = rest.removesuffix(".weight")
            key = f"blk.{i}.{_LAYER_NAMES[module]}.weight"
            if module == "self_attn.q_proj":
                out[key] = _interleave_rotary_halves(t, c.num_attention_heads)
            elif module == "self_attn.k_proj":
                out[key] = _interleave_rotary_halves(t, c.num_key_value_heads)
            else:
                out[key] = t.numpy()
    return out


def write_tiny_gguf(path: str | Path, model: Any, tokenizer: Any) -> Path:
    """``model`` (a LlamaForCausalLM) and ``tokenizer`` (a byte-level BPE fast tokenizer) as one GGUF file."""
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    by_id = sorted(
        tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1]
    )
    assert [i for _, i in by_id] == list(range(len(by_id))), "token ids must be contiguous"
    special = {t["content"] for t in backend["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in backend["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")  # the split pattern the test tokenizer was trained with
    w.add_token_list([t for t, _ in by_id])
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t, _ in by_id])
    w.add_token_merges(merges)
    w.add_eos_token_id(tokenizer.eos_token_id)
    w.add_pad_token_id(tokenizer.pad_token_id)
    w.add_add_bos_token(False)
    if tokenizer.chat_template:
        w.add_chat_template(tokenizer.chat_template)
    for name, array in _gguf_tensors(model).items():
        w.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
