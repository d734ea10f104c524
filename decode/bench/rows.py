"""What a bench row is: a method at one point of the parameter sweep (:class:`RowSpec`, :func:`expand_rows`),
which rows must reproduce AR (:func:`is_lossless`), and transformers' own ``generate`` rows (greedy, assisted)
that run beside ours."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prove.decode.bench.metrics import PromptRun

REFERENCE = "ar"


SYMBOLS = {
    "theta": "θ",
    "tau": "τ",
    "block_size": "K",
    "k": "k",
    "budget": "B",
    "gate": "g",
    "max_mismatches": "m",
    "fuse_groups": "J",
    "draft_threshold": "cut",
    "temperature": "T",
    "top_p": "top-p",
    "top_k": "top-k",
}


SAMPLING = ("temperature", "top_p", "top_k")
"""The sampling ``DecodeParams`` a bench row takes (every method reads them; ``seed`` is the bench's own, per prompt).
A row with ``temperature`` > 0 samples; a greedy-only method (``Method.greedy_only``) gets no such row from a sweep."""

ALWAYS_NAMED = ("temperature",)
"""Parameters a row's name carries whenever set, swept or not: a sampled row is never named as a greedy one."""


ONLY_WITH = {"fuse_groups": "fuse", "top_p": "temperature", "top_k": "temperature"}
"""Parameters read only when another is true: a row with ``fuse=false`` drops ``fuse_groups`` (one unfused
row, not one per J); a greedy row (``temperature`` 0) drops ``top_p`` and ``top_k``."""


HF_ROWS = ("hf-greedy", "hf-assisted", "hf-assisted-confidence")
"""transformers' ``generate``: greedy, and assisted generation under its two draft-length policies (``HFRow``)."""


@dataclass(frozen=True)
class RowSpec:
    """One row of the bench: a method at one point of the sweep."""

    name: str
    method: str
    params: dict[str, Any] = field(default_factory=dict)
    """``DecodeParams`` given to the Decoder (only those the method reads)."""


def as_values(value: Any) -> list[Any]:
    """A sweep value as a list: ``None`` → ``[None]`` (the method's default), a scalar → ``[x]``."""
    if value is None:
        return [None]
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("an empty sweep list: give at least one value, or null for the method's default")
        return list(value)
    return [value]


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def param_label(key: str, value: Any) -> str:
    if key == "fuse":
        return "fused" if value else "unfused"
    if key == "fast" and isinstance(value, bool):
        return "fast" if value else "reference"
    if key == "compile" and isinstance(value, bool):
        return "compiled" if value else "eager cycle"
    if key == "adaptive":  # transformers' confidence cut-off: adapted during a call, or fixed
        return "adaptive" if value else "fixed"
    return f"{SYMBOLS.get(key, key)}={_fmt(value)}"


def expand_rows(
    methods: Sequence[str],
    sweeps: Mapping[str, Any],
    uses: Mapping[str, Sequence[str]],
    method_params: Mapping[str, Mapping[str, Any]] | None = None,
    greedy_only: Collection[str] = (),
) -> list[RowSpec]:
    """One row per method × point of the sweeps it reads (``uses[method]``); AR first, once.

    ``sweeps`` maps a ``DecodeParams`` name to ``None``, a value, or a list of values, for every method
    that reads it; ``method_params[method]`` overrides or adds values for that method alone (θ is ProVe's
    threshold and NSD's nucleus mass: sweep one of them with ``method_params={prove: {theta: [...]}}``).
    A row's name is the method plus the swept values it was given (``prove θ=0.1``), and its temperature
    whenever it samples (``sd T=0.7``). A shared ``temperature`` sweep gives the ``greedy_only`` methods their
    greedy row alone (:func:`greedy_only_skips` says which rows were not made); AR always has its greedy row,
    the reference, named plain ``ar`` (the first greedy point where AR's own sweep labels its rows).
    """
    ordered = [REFERENCE] + [m for m in dict.fromkeys(methods) if m != REFERENCE]
    method_params = method_params or {}
    for m, given in method_params.items():
        if m not in ordered:
            raise ValueError(f"method_params names method {m!r}, which is not in methods={list(methods)}")
        unread = set(given) - set(uses.get(m, ()))
        if unread:
            raise ValueError(f"method {m} does not read {sorted(unread)}; it reads {list(uses.get(m, ()))}")
    rows: list[RowSpec] = []
    for m in ordered:
        merged = _merged(m, sweeps, method_params.get(m, {}), m in greedy_only)
        keys = [k for k in merged if k in uses.get(m, ())]
        grids = [as_values(merged[k]) for k in keys]
        swept = [k for k, g in zip(keys, grids, strict=True) if len(g) > 1]
        for point in itertools.product(*grids):
            params = {k: v for k, v in zip(keys, point, strict=True) if v is not None}
            if "temperature" in params and not params["temperature"]:
                del params["temperature"]  # T = 0 is greedy: the row the method has without it
            dropped = [k for k, parent in ONLY_WITH.items() if k in params and not params.get(parent)]
            for k in dropped:
                del params[k]
            named = [k for k in keys if k in params and (k in swept or k in ALWAYS_NAMED)]
            label = " ".join(param_label(k, params[k]) for k in named)
            row = RowSpec(f"{m} {label}".strip(), m, params)
            if dropped and row in rows:  # e.g. fuse=false once, whatever fuse_groups sweeps
                continue
            rows.append(row)
    rows = _name_the_reference(rows)
    names = [r.name for r in rows]
    if len(set(names)) != len(names):
        raise ValueError(f"the sweep repeats a row ({names}): give each value once")
    return rows


def _name_the_reference(rows: list[RowSpec]) -> list[RowSpec]:
    """The first greedy AR row is the reference every other row is timed against and compared with, under the name
    ``ar``: a sweep AR reads (``fast=[false,true]``) labels its points (``ar reference``, ``ar fast``), and without
    this no row would answer to the reference's name. Its parameters stay in its spec (bench.json's row)."""
    if any(r.name == REFERENCE for r in rows):
        return rows
    first = next(
        (i for i, r in enumerate(rows) if r.method == REFERENCE and "temperature" not in r.params), None
    )
    if first is None:
        return rows
    rows[first] = RowSpec(REFERENCE, REFERENCE, rows[first].params)
    return rows


def _merged(method: str, sweeps: Mapping[str, Any], own: Mapping[str, Any], greedy: bool) -> dict[str, Any]:
    """A method's values: its own over the shared sweeps; a greedy-only method drops the shared temperature, and
    AR keeps its greedy point (the reference) whatever the temperatures."""
    merged = {**sweeps, **own}
    if greedy and "temperature" not in own:
        merged.pop("temperature", None)
    if method == REFERENCE and "temperature" in merged:
        values = as_values(merged["temperature"])
        if all(values):
            merged["temperature"] = [None, *values]
    return merged


def greedy_only_skips(
    methods: Sequence[str],
    sweeps: Mapping[str, Any],
    greedy_only: Collection[str],
    method_params: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, list[float]]:
    """The temperatures > 0 of the shared sweep that each greedy-only method of ``methods`` got no row for
    (bench.md says so once: "prove-lossless: greedy only, no T=0.7 row")."""
    temps = [t for t in as_values(sweeps.get("temperature")) if t]
    own = method_params or {}
    return {
        m: temps
        for m in dict.fromkeys(methods)
        if m in greedy_only and temps and "temperature" not in own.get(m, {})
    }


def is_lossless(method: str, params: Mapping[str, Any]) -> bool:
    """Whether a greedy row must reproduce AR token for token: transformers' rows, and the methods whose
    registry entry says so for these parameters (``Method.is_lossless``: AR, ProVe-lossless, greedy SD,
    ASD with a zero budget, gate or mismatch count)."""
    if method in HF_ROWS:
        return True
    from prove.decode.methods import get_method

    return get_method(method).is_lossless(params)


class PassCounter:
    """Counts forward calls of a module while active (transformers' rows: passes are not in its output)."""

    def __init__(self, module: Any) -> None:
        self.module, self.n, self._handle = module, 0, None

    def __enter__(self) -> PassCounter:
        self.n = 0

        def hook(*_: Any) -> None:
            self.n += 1

        self._handle = self.module.register_forward_hook(hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._handle is not None
        self._handle.remove()


class HFRow:
    """transformers' ``generate``: greedy, or assisted generation with ``draft``: k tokens a cycle (constant
    schedule), and with ``threshold`` > 0 transformers' confidence cut-off (``assistant_confidence_threshold``:
    drafting stops after a token the draft gave a probability under it; 0.4 is transformers' default, which it
    also adapts during a call when scikit-learn is installed). Same prompt ids, EOS and stop strings as ours."""

    def __init__(
        self, model: Any, tokenizer: Any, draft: Any = None, k: int = 5, threshold: float = 0.0
    ) -> None:
        self.model, self.tokenizer, self.draft, self.k = model, tokenizer, draft, k
        self.threshold = threshold

    @property
    def params(self) -> dict[str, Any]:
        """The draft-length policy this row ran, for bench.json (in our rows' names: ``k``, ``draft_threshold``)."""
        if self.draft is None:
            return {}
        from transformers.utils import is_sklearn_available

        out: dict[str, Any] = {"k": self.k, "draft_threshold": self.threshold}
        if self.threshold:
            out["adaptive"] = bool(is_sklearn_available())
        return out

    def _kwargs(self, x: Any, max_new_tokens: int, eos: list[int], stop: list[str]) -> dict[str, Any]:
        """``generate``'s arguments: greedy, our EOS and stop strings, and ``<|mask|>`` suppressed as our Decoder
        never outputs it."""
        import torch

        kw: dict[str, Any] = {
            "attention_mask": torch.ones_like(x),
            "max_new_tokens": max_new_tokens,
            "do_sample": False,
            "eos_token_id": eos or None,
            "pad_token_id": (eos or [0])[0]
            if getattr(self.tokenizer, "pad_token_id", None) is None
            else self.tokenizer.pad_token_id,
        }
        if stop:
            kw.update(stop_strings=list(stop), tokenizer=self.tokenizer)
        from prove.common.checkpoint import MASK_TOKEN

        mask = None if self.tokenizer is None else self.tokenizer.get_vocab().get(MASK_TOKEN)
        if mask is not None:  # our Decoder never outputs <|mask|>; transformers' rows suppress it alike
            kw["suppress_tokens"] = [mask]
        return kw

    def _run(self, x: Any, kw: Mapping[str, Any]) -> tuple[Any, int, int]:
        """(output ids, target passes, draft passes) of one ``generate``, the draft's assistant settings set for the
        call (transformers reads them from the assistant's generation_config) and restored after."""
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # assisted generation warns about its own internal generation_config
        gc = None if self.draft is None else self.draft.generation_config
        fields = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
        saved = None if gc is None else [getattr(gc, f) for f in fields]
        try:
            with PassCounter(self.model) as target:
                if gc is None:
                    return self.model.generate(x, **kw), target.n, 0
                for f, v in zip(fields, (self.k, "constant", self.threshold), strict=True):
                    setattr(gc, f, v)
                with PassCounter(self.draft) as d:
                    out = self.model.generate(x, assistant_model=self.draft, **kw)
                return out, target.n, d.n
        finally:
            hf_logging.set_verbosity(verbosity)
            if gc is not None and saved is not None:
                for f, v in zip(fields, saved, strict=True):
                    setattr(gc, f, v)

    def generate(self, ids: list[int], max_new_tokens: int, eos: list[int], stop: list[str]) -> PromptRun:
        import torch

        device = next(self.model.parameters()).device
        x = torch.tensor([ids], device=device)
        out, target_passes, draft_passes = self._run(x, self._kwargs(x, max_new_tokens, eos, stop))
        new = out[0, len(ids) :].tolist()
        # generate pads a finished batch of one with nothing, but strip pad after EOS defensively.
        for i, t in enumerate(new):
            if t in eos:
                new = new[: i + 1]
                break
        return PromptRun(
            id=None,
            token_ids=new,
            text="" if self.tokenizer is None else self.tokenizer.decode(new, skip_special_tokens=True),
            wall_s=0.0,
            cycles=target_passes,
            model_passes=target_passes,
            draft_passes=draft_passes,
        )
