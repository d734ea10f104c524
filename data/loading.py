"""Loading a checkpoint and the checks of the train → decode contract, shared by training and decoding.

One home for what both sides of the checkpoint contract need (docs/design.md §2.2): the placeholder token
``MASK_TOKEN``, the dtype names and what ``dtype="auto"`` means, the "no checkpoint there" check, the tokenizer
and model loaders, and the vocabulary comparison that decides whether two models can verify each other.

A source is a checkpoint folder, a hub id, or a GGUF file (a path ending in ``.gguf``): :func:`model_folder`
turns the file into its converted Hugging Face folder (:mod:`prove.data.gguf`, once per file, cached), so every
loader here, and through them every entry point, takes one.
It imports neither ``prove.train`` nor ``prove.decode`` (data ← train → decode; data ← decode).

``dtype``: ``float32`` | ``bfloat16`` | ``float16`` | ``auto``. ``auto`` is the checkpoint's own dtype on an
accelerator and ``float32`` on the CPU (bf16/fp16 matmuls on the CPU are slow or unsupported).

torch and transformers are imported inside the loaders: ``prove.train.config`` imports this module for
``MASK_TOKEN`` / ``DTYPES`` at CLI start-up, which must not pay for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prove.data import gguf

MASK_TOKEN = "<|mask|>"
"""The placeholder MARS training adds to the tokenizer; the proposer fills K of them per forward pass."""

DTYPES = ("auto", "float32", "bfloat16", "float16")
"""Weight dtypes a checkpoint can be loaded in (``auto``: see the module docstring)."""


def check_dtype(name: str | None, key: str, allow_none: bool = False) -> None:
    """``ValueError`` naming ``key`` unless ``name`` is one of :data:`DTYPES` (or ``None`` when allowed)."""
    if name is None and allow_none:
        return
    if name not in DTYPES:
        choices = ", ".join(("null", *DTYPES) if allow_none else DTYPES)
        raise ValueError(f"{key}={name!r}: use one of {choices}")


def torch_dtype(name: str, device: Any = None) -> Any:
    """The ``from_pretrained(dtype=...)`` value for ``name`` on ``device`` (``None``: cuda when available)."""
    import torch

    check_dtype(name, "dtype")
    if name != "auto":
        return getattr(torch, name)
    on_cpu = (not torch.cuda.is_available()) if device is None else torch.device(device).type == "cpu"
    return torch.float32 if on_cpu else "auto"


def missing_local_path(source: str) -> bool:
    """True if ``source`` looks like a local path (not a hub id ``org/name``) and nothing is there: a user
    error to report as such, rather than a hub lookup that fails with a confusing message (or hangs)."""
    looks_local = (
        source.startswith((".", "/", "~"))
        or source.count("/") != 1
        or Path(source).parent.is_dir()
        or gguf.is_gguf(source)
    )
    return looks_local and not Path(source).expanduser().exists()


def check_source(source: str, fix: str) -> None:
    """``ValueError("no model at <source>: <fix>")`` when ``source`` names a local path that does not exist."""
    if missing_local_path(source):
        raise ValueError(f"no model at {source!r}: {fix}")


def model_folder(source: str) -> str:
    """What ``from_pretrained`` reads for ``source``: a GGUF file's converted folder (converted on first use,
    :func:`prove.data.gguf.hf_folder`), else ``source`` itself (a folder or hub id)."""
    return str(gguf.hf_folder(source)) if gguf.is_gguf(source) else source


def load_tokenizer(source: str, trust_remote_code: bool = False) -> Any:
    """The checkpoint's tokenizer; it must have an EOS token, and pads with it when it has no pad token."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_folder(source), trust_remote_code=trust_remote_code)
    if tok.eos_token_id is None:
        raise ValueError(
            f"the tokenizer of {source!r} has no eos_token: set one (e.g. <|im_end|> for ChatML models)"
        )
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(
    source: str,
    dtype: str = "auto",
    device: Any = None,
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
    num_layers: int | None = None,
) -> Any:
    """A causal LM from a checkpoint directory, hub id or GGUF file.

    ``device=None`` leaves placement to the caller (training: the Trainer, or ZeRO-3, which loads the weights
    partitioned when ``TrainingArguments`` exist first). With a device the weights load straight onto it
    (no full copy in host memory) and the model is returned in eval mode. ``num_layers`` keeps only the first N
    decoder layers, with the model's own final norm and head (a small verifier cut from its base): the config
    says N layers and only their weights load, so it works under ZeRO-3 too.
    """
    from transformers import AutoModelForCausalLM

    folder = model_folder(source)
    kwargs: dict[str, Any] = {"dtype": torch_dtype(dtype, device), "trust_remote_code": trust_remote_code}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if device is not None and str(device) != "cpu":
        kwargs["device_map"] = {"": device}
    if num_layers is not None:
        kwargs.update(_first_layers(source, folder, num_layers, trust_remote_code))
    model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    return model if device is None else model.eval()


def _first_layers(source: str, folder: str, n: int, trust_remote_code: bool) -> dict[str, Any]:
    """The config overrides that keep the first ``n`` decoder layers of ``folder``'s model (checked: a larger
    ``n`` would silently add randomly initialised layers)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    total = getattr(config, "num_hidden_layers", None)
    if not isinstance(total, int):
        raise ValueError(f"num_layers={n}: the config of {source!r} has no num_hidden_layers to cut")
    if not 1 <= n <= total:
        raise ValueError(f"num_layers={n}: {source!r} has {total} decoder layers; keep between 1 and {total}")
    out: dict[str, Any] = {"num_hidden_layers": n}
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, list) and len(layer_types) == total:  # per-layer attention kinds (Qwen2, ...)
        out["layer_types"] = layer_types[:n]
    return out


def vocab_difference(tokenizer: Any, other: Any) -> int:
    """How many (token, id) entries differ between two tokenizers' vocabularies, ``<|mask|>`` aside: a stock
    verifier or draft lacks only the placeholder that MARS training added. 0 = they can verify each other."""
    a = {t: i for t, i in tokenizer.get_vocab().items() if t != MASK_TOKEN}
    b = {t: i for t, i in other.get_vocab().items() if t != MASK_TOKEN}
    return len(set(a.items()) ^ set(b.items()))
