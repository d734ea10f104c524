"""``prove.decode.Decoder``: the Python front door of decoding (docs/design.md §3.1).

>>> dec = Decoder.from_pretrained("ckpt/mars", method="prove", verifier="ckpt/verifier", theta=0.1)
>>> out = dec.generate([{"role": "user", "content": "2 + 3?"}], max_new_tokens=64)
>>> out.text, out.stats.tokens_per_cycle

Every check of the checkpoint contract (docs/design.md §2.2) happens here, at construction, so a bad
combination is a ``ValueError`` that says what to change, never a crash inside a forward pass.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from prove.common.checkpoint import (
    MASK_TOKEN,
    ProveMeta,
    find_mask_token_id,
    read_prove_json,
    resolve_block_size,
    vocab_difference,
)
from prove.data import loading
from prove.decode import engine
from prove.decode.config import DecodeParams
from prove.decode.engine import CycleEvent, ModelRunner, Models, Stats, Stopper
from prove.decode.methods import Method, resolve_params
from prove.decode.proposers import PROPOSERS
from prove.decode.verifiers import ModelVerifier, build_verifier

Prompt = str | list[dict[str, str]] | list[int] | torch.Tensor


@dataclass(frozen=True)
class GenerationResult:
    token_ids: list[int]
    """The new tokens only (EOS included when generation ended on it)."""
    text: str
    """Their decoding with special tokens skipped ("" without a tokenizer)."""
    stats: Stats


def check_source(path: str, role: str) -> None:
    """A clear error for ``role=path`` when it names a local directory that does not exist."""
    loading.check_source(
        path, f"pass {role}=<a Hugging Face model directory, e.g. runs/tiny/mars> or a hub id"
    )


def load_model(path: str, device: str | torch.device, dtype: str) -> Any:
    """A causal LM from a checkpoint directory or hub id, on ``device``, in eval mode (``prove.data.loading``,
    the loader training uses too: ``dtype=auto`` is float32 on the CPU, the checkpoint's dtype elsewhere)."""
    return loading.load_model(path, dtype, device=device)


load_tokenizer = loading.load_tokenizer


def _name(model: Any) -> str:
    if isinstance(model, str):
        return model
    return str(getattr(model, "name_or_path", "") or type(model).__name__)


def _meta(path: str) -> ProveMeta | None:
    return read_prove_json(path) if Path(path).is_dir() else None


class Decoder:
    """Decode with one method: ``ar``, ``mars``, ``prove``, ``prove-lossless``, ``sd``, ``nsd``, ``asd``
    (``prove.decode.methods``).

    ``model`` (the model being accelerated), ``verifier`` (ProVe's small scorer) and ``draft`` (the SD
    family's small proposer) are loaded Hugging Face causal LMs or checkpoint paths. ``tokenizer``
    defaults to the one saved with ``model`` when it is a path. ``params`` are ``DecodeParams`` fields
    (theta, tau, block_size, k, temperature, top_p, top_k, seed); ``None`` takes the method's default,
    and ``block_size`` the trained one. Greedy by default.

    ``proposer`` (``block`` or ``draft``) runs the method's rule on another proposer: ``method="nsd",
    proposer="block"`` is NSD's nucleus gate on the MARS block proposer, verified by the model itself.

    ``fuse=True`` (block proposals the model verifies itself) makes each cycle one model pass: the
    verification pass also drafts the next block (``prove.decode.engine.fused``; ``fuse_groups="auto"``, "all" or m).

    Every decode runs through one loop (``prove.decode.engine.run``) on slot caches, by one of two kinds of cycle: the
    composed cycle (the method's proposer, verifier and pure rule; every method and setting) or the device cycle
    (``prove.decode.engine.device``: the rule's sync-free twin, CUDA graphs on CUDA), for the methods whose registry
    entry names a twin — ``ar``, ``prove-lossless`` (unfused, or fused with ``fuse_groups="all"``), ``sd`` (greedy or
    sampled), greedy ``prove``, ``pard`` and greedy ``asd``. ``fast`` (``True``, ``False``, ``"auto"``; default auto)
    picks: auto takes the device cycle on CUDA where it applies, True wherever it applies (an error naming why not
    elsewhere), False never. Every model is checked against its own cacheless pass when the Decoder is built (once per
    machine and version). The device cycle's cache starts at min(max_position_embeddings, 4096) slots and grows when
    a request needs more; ``cache_len`` fixes it (a request it cannot hold then takes the composed cycle under auto,
    and is refused under ``fast=True``). A pass attends only the slots in use, whatever the allocation. Greedy tokens
    are the same either way; sampled ones follow the same distribution from other draws.

    ``compile=True`` (with the device cycle) runs its regular cycle through ``torch.compile`` (inductor) before the CUDA
    graph is captured: fewer, fused kernels a pass, for a compile when the Decoder first decodes.

    ``pad_widths="auto"`` (composed cycle; default off) times each model's linear pass by width once and runs a
    pass wider wherever a wider one costs this device less (``prove.decode.engine.padding``).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        method: str | Method = "prove-lossless",
        proposer: str | None = None,
        verifier: Any = None,
        draft: Any = None,
        device: str | torch.device | None = None,
        dtype: str = "float32",
        mask_token_id: int | None = None,
        trace: bool = False,
        cache_len: int | None = None,
        **params: Any,
    ) -> None:
        loading.check_dtype(dtype, "dtype")
        self.method, self.params = self._resolve(method, proposer, params)
        self.trace = trace
        if device is None:
            device = "cpu" if isinstance(model, str) else next(model.parameters()).device
        self.device = torch.device(device)
        target, model_meta = self._load_target(model, tokenizer, verifier, draft, dtype)
        verifier, draft = self._used_models(verifier, draft)
        mask_id = (
            self._check_mask(target, model_meta, mask_token_id) if self.method.needs_mask else mask_token_id
        )
        if self.method.needs_mask:
            self.params = dataclasses.replace(self.params, block_size=self._check_block_size(model_meta))
        aux = self._load_aux(verifier, draft, dtype)
        if self.method.drafts_blocks:  # pard: the draft's blocks, its own <|mask|> and trained K
            mask_id = self._check_draft_blocks(draft, aux["draft"], mask_token_id)
        self._check_slot_cache(target, aux)
        fast_on = self._fast_applies(target, aux)
        self._assemble(target, aux, model_meta, mask_id)
        self.fast_engine = self._build_fast(target, mask_id, cache_len) if fast_on else None
        self.pad_plans: dict[str, Any] = {}
        """``pad_widths=auto``: each model's ``padding.PadPlan`` (by runner name: model, verifier, draft)."""
        if self.params.pad_widths == "auto" and not fast_on:
            self._plan_padding()

    # -- the steps of __init__: resolve, load, check, assemble --------------------------------------------------

    @staticmethod
    def _resolve(
        method: str | Method, proposer: str | None, params: dict[str, Any]
    ) -> tuple[Method, DecodeParams]:
        """The method and its complete parameters (every check that needs no model); warns about given
        parameters the method does not read."""
        resolved, full = resolve_params(method, proposer, **params)
        ignored = resolved.unread({k: v for k, v in params.items() if v is not None})
        if ignored:
            warnings.warn(f"method {resolved.name} does not read {ignored}; ignoring", stacklevel=3)
        return resolved, full

    def _load_target(
        self, model: Any, tokenizer: Any, verifier: Any, draft: Any, dtype: str
    ) -> tuple[Any, ProveMeta | None]:
        """Check every path given, then load the model being accelerated, its tokenizer and its prove.json."""
        self.model_name = _name(model)
        self.verifier_name = None if verifier is None else _name(verifier)
        self.draft_name = None if draft is None else _name(draft)
        for role, source in (("model", model), ("verifier", verifier), ("draft", draft)):
            if isinstance(source, str):
                check_source(source, role)
        model_meta = _meta(model) if isinstance(model, str) else None
        if model_meta is None and not isinstance(model, str) and bool(getattr(model, "name_or_path", "")):
            model_meta = _meta(model.name_or_path)
        if tokenizer is None and isinstance(model, str):
            tokenizer = load_tokenizer(model)
        self.tokenizer = tokenizer
        target = load_model(model, self.device, dtype) if isinstance(model, str) else model.eval()
        return target, model_meta

    def _used_models(self, verifier: Any, draft: Any) -> tuple[Any, Any]:
        """The verifier and draft the method needs (an error naming the missing one); others are dropped with
        a warning (a verifier stays as the trace's probe)."""
        needs_verifier, needs_draft = self.method.needs_verifier, self.method.needs_draft
        if needs_verifier and verifier is None:
            raise ValueError(
                f"method={self.method.name} needs a verifier: pass verifier=PATH (ProVe's small scorer)"
            )
        if needs_draft and draft is None:
            raise ValueError(
                f"method={self.method.name} needs a draft model: pass draft=PATH (a small AR model)"
            )
        if verifier is not None and not needs_verifier and not self.trace:
            warnings.warn(
                f"method {self.method.name} does not use the verifier (with trace=True it is recorded as a probe); "
                "ignoring it",
                stacklevel=3,
            )
            verifier = None
        if draft is not None and not needs_draft:
            warnings.warn(
                f"method {self.method.name} does not use the draft model; ignoring it", stacklevel=3
            )
            draft = None
        return verifier, draft

    def _load_aux(self, verifier: Any, draft: Any, dtype: str) -> dict[str, ModelRunner]:
        """The verifier / draft as runners, each checked to share the model's vocabulary."""
        aux = {}
        for role, other, other_name in (
            ("verifier", verifier, self.verifier_name),
            ("draft", draft, self.draft_name),
        ):
            if other is None:
                continue
            if isinstance(other, str):
                self._check_same_vocab(role, load_tokenizer(other), other_name)
                other = load_model(other, self.device, dtype)
            self._check_vocab_rows(role, other, other_name)
            aux[role] = ModelRunner(other.eval(), role)
        return aux

    def _assemble(
        self, target: Any, aux: dict[str, ModelRunner], meta: ProveMeta | None, mask_id: int | None
    ) -> None:
        """The models, the generator, the method's proposer and verifier (fused when ``fuse``) and the probe."""
        target_runner = ModelRunner(target, "model")
        self.models = Models(
            target=target_runner,
            verifier=aux.get("verifier"),
            draft=aux.get("draft"),
            mask_token_id=mask_id,
            allowed=self._allowed_ids(target_runner, aux.values(), meta, mask_id),
        )
        self.generator = torch.Generator(device=self.device).manual_seed(self.params.seed)
        if self.params.fuse:  # one pass a cycle: the verifier drafts the proposer's next block
            from prove.decode.engine.fused import build_fused

            self.proposer, self.verifier = build_fused(
                self.models, self.params, self.generator, branch=self.method.branches
            )
        else:
            factory = (
                self.method.proposer if callable(self.method.proposer) else PROPOSERS[self.method.proposer]
            )
            self.proposer = factory(self.models, self.params, self.generator)
            self.verifier = build_verifier(self.method.verifier, self.models)
        probe_wanted = self.trace and self.models.verifier is not None and not self.method.needs_verifier
        self.probe = ModelVerifier(self.models.verifier, is_target=False) if probe_wanted else None

    def _plan_padding(self) -> None:
        """``pad_widths=auto``: each model's linear passes padded where this device runs a wider one faster
        (``prove.decode.engine.padding``; measured once per model)."""
        from prove.decode.engine.padding import pad_widths_needed, plan_for

        widths = pad_widths_needed(self.params.block_size, self.params.k)
        for runner in {id(r): r for r in self.models.runners()}.values():
            plan = plan_for(runner.model, widths)
            runner.pad_to = dict(plan.pad_to)
            self.pad_plans[runner.name] = plan

    def _fast_applies(self, target: Any, aux: dict[str, ModelRunner]) -> bool:
        """Whether the device cycle runs this decode: ``fast`` true, or auto on CUDA, and a method, setting and model
        it serves. ``fast=true`` on what it cannot serve is a clear error; auto falls back with one line when the
        slot cache's self-check against ``DynamicCache`` fails on this model."""
        from prove.decode.engine import device as fast

        want = self.params.fast if self.params.fast is not None else "auto"
        if want == "auto" and self.device.type != "cuda" and self.params.compile:
            raise ValueError(
                f"compile=true compiles the device cycle's cycle, which fast=auto runs on CUDA only (this decode is on "
                f"{self.device.type}): pass fast=true to compile it here, or compile=false"
            )
        if want is False or (want == "auto" and self.device.type != "cuda"):
            return False
        second = aux.get("verifier" if self.method.needs_verifier else "draft")
        second_model = None if second is None else second.model
        reason = fast.why_not(self.method, self.params, target, second_model)
        if reason is None and self.trace:
            reason = "it records no trace (trace=false)"
        if reason is not None:
            if want is True:
                raise ValueError(
                    f"fast=true cannot serve this decode: {reason}; pass fast=auto or fast=false"
                )
            if self.params.compile:
                warnings.warn(
                    f"device cycle off: {reason}; decoding on the composed cycle (compile=true has nothing to "
                    "compile)",
                    stacklevel=4,
                )
            return False
        return True

    def _check_slot_cache(self, target: Any, aux: dict[str, ModelRunner]) -> None:
        """Every model runs on the slot cache (``prove.decode.engine.cache``): one it cannot serve is refused here with
        the reason, and each is checked against its own cacheless pass once per machine and version
        (``fast.checked``)."""
        from prove.decode.engine.cache import unsupported_reason
        from prove.decode.engine.check import checked

        for role, model in (("model", target), *((r, runner.model) for r, runner in aux.items())):
            reason = unsupported_reason(model.config) or checked(model)
            if reason is not None:
                raise ValueError(f"the {role} cannot decode on this engine's slot cache: {reason}")

    def _build_fast(self, target: Any, mask_id: int | None, cache_len: int | None) -> Any:
        """The device cycle's engine (``_fast_applies`` said yes), its cache of ``cache_len`` slots allocated."""
        from prove.decode.engine import device as fast

        limit = getattr(target.config, "max_position_embeddings", None) or fast.DEFAULT_CACHE_LEN
        capacity = cache_len if cache_len is not None else min(limit, fast.DEFAULT_CACHE_LEN)
        if capacity < 2:
            raise ValueError(f"cache_len={capacity} must be ≥ 2 (a prompt token and a new one)")
        m, p = self.method, self.params
        block = {"block": p.block_size, "draft-block": p.block_size, "draft": p.k}.get(str(m.proposer), 0)
        draft, verifier = self.models.draft, self.models.verifier
        return fast.FastEngine(
            target,
            draft=draft.model if m.needs_draft and draft is not None else None,
            block_draft=m.drafts_blocks,
            verifier=verifier.model if m.needs_verifier and verifier is not None else None,
            theta=p.theta if m.twin == "prove" else 0.0,
            temperature=p.temperature,
            top_k=p.top_k,
            top_p=p.top_p,
            generator=self.generator,
            asd={"budget": p.budget, "gate": p.gate, "max_mismatches": p.max_mismatches}
            if m.twin == "asd"
            else None,
            block_size=int(block or 0),
            mask_token_id=mask_id,
            allowed=self.models.allowed,
            capacity=capacity,
            growable=cache_len is None,
            fused=bool(self.params.fuse),
            compile=bool(self.params.compile),
        )

    @property
    def model(self) -> Any:
        """The model being accelerated (``model=``)."""
        return self.models.target.model

    @classmethod
    def from_pretrained(cls, path: str, **kwargs: Any) -> Decoder:
        return cls(path, **kwargs)

    # -- the checkpoint contract (docs/design.md §2.2) ---------------------------------------------------------------

    def _check_mask(
        self,
        model: Any,
        meta: ProveMeta | None,
        mask_token_id: int | None,
        tokenizer: Any = None,
        name: str | None = None,
    ) -> int:
        """The block proposer's ``<|mask|>`` id (``model``'s: the target's, or pard's draft's with its
        ``tokenizer`` and ``name``), checked to have an embedding row."""
        name = name or self.model_name
        tokenizer = self.tokenizer if tokenizer is None else tokenizer
        mask_token_id = find_mask_token_id(name, tokenizer, meta, mask_token_id)
        rows = model.get_input_embeddings().weight.shape[0]
        if not 0 <= mask_token_id < rows:
            raise ValueError(
                f"checkpoint {name}: {MASK_TOKEN} id {mask_token_id} has no embedding row (the model has "
                f"{rows}); re-save the checkpoint with `prove-train stage=mars`, which resizes the embeddings"
            )
        return mask_token_id

    def _check_block_size(self, meta: ProveMeta | None, name: str | None = None) -> int:
        return resolve_block_size(name or self.model_name, meta, self.params.block_size, stacklevel=4)

    def _check_draft_blocks(self, draft: Any, runner: ModelRunner, mask_token_id: int | None) -> int:
        """pard: the draft model proposes blocks, so the draft is the checkpoint with ``<|mask|>`` and a trained
        block size (its prove.json); returns its mask id and sets ``block_size`` from it."""
        source = draft if isinstance(draft, str) else str(getattr(draft, "name_or_path", "") or "")
        meta = _meta(source) if source else None
        tokenizer = load_tokenizer(draft) if isinstance(draft, str) else self.tokenizer
        mask_id = self._check_mask(runner.model, meta, mask_token_id, tokenizer, self.draft_name)
        self.params = dataclasses.replace(
            self.params, block_size=self._check_block_size(meta, self.draft_name)
        )
        return mask_id

    def _check_same_vocab(self, role: str, other_tokenizer: Any, other_name: str | None) -> None:
        if self.tokenizer is not None:
            check_same_vocab(self.tokenizer, other_tokenizer, role, other_name, self.model_name)

    def _tokenizer_mask_id(self) -> int | None:
        vocab = self.tokenizer.get_vocab() if self.tokenizer is not None else {}
        return vocab.get(MASK_TOKEN)

    def _allowed_ids(
        self, target: ModelRunner, aux: Any, meta: ProveMeta | None, mask_id: int | None
    ) -> torch.Tensor | None:
        """The ids any proposer may propose and any rule may commit (``Models.allowed``): not ``<|mask|>`` (a
        placeholder, never text; wherever its id is), not an id some model has no row for (a stock verifier
        or draft lacks the mask row), not an id past the tokenizer's vocabulary (padding rows)."""
        V = target.vocab_size
        masks = [mask_id, None if meta is None else meta.mask_token_id]
        limit, excluded = allowed_ids([V, *(runner.vocab_size for runner in aux)], self.tokenizer, masks)
        allowed = torch.zeros(V, dtype=torch.bool, device=self.device)
        allowed[:limit] = True
        for m in excluded:
            allowed[m] = False
        return None if bool(allowed.all()) else allowed

    def _check_vocab_rows(self, role: str, other: Any, other_name: str | None) -> None:
        if self.tokenizer is None:
            return
        rows = other.get_output_embeddings().weight.shape[0]
        # every id of the tokenizer but <|mask|> needs a row; the mask may sit anywhere (not only last)
        ids = set(self.tokenizer.get_vocab().values()) - {self._tokenizer_mask_id()}
        needed = max(ids) + 1
        if rows < needed:
            raise ValueError(
                f"the {role} {other_name} scores {rows} tokens but model {self.model_name}'s tokenizer has "
                f"{needed}: pick a {role} of the same model family"
            )

    # -- generation ---------------------------------------------------------------------------------------------

    def encode(self, prompt: Prompt, *, chat: bool = False) -> list[int]:
        """Token ids of a prompt: raw text (tokenized as given), chat messages (chat template + generation
        prompt), or ids. ``chat=True`` wraps raw text as one user turn of the chat template."""
        return encode_prompt(self.tokenizer, prompt, chat=chat, name=self.model_name)

    def check_length(self, prompt_len: int, max_new_tokens: int) -> None:
        """A clear error when a request could run past a model's ``max_position_embeddings``
        (:func:`check_positions`)."""
        limits = [
            (r.name, getattr(r.model.config, "max_position_embeddings", None)) for r in self.models.runners()
        ]
        check_positions(prompt_len, max_new_tokens, limits)

    def eos_ids(self, eos_token_id: int | Sequence[int] | None = None) -> list[int]:
        """The ids that end a request: ``eos_token_id`` when given, else :func:`prove.decode.engine.end_of_turn_ids`
        (the target's generation config's EOS and the tokenizer's)."""
        if eos_token_id is not None:
            return [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(t) for t in eos_token_id]
        generation = getattr(
            getattr(self.models.target.model, "generation_config", None), "eos_token_id", None
        )
        return engine.end_of_turn_ids(generation, getattr(self.tokenizer, "eos_token_id", None))

    def generate(
        self,
        prompt: Prompt,
        max_new_tokens: int = 256,
        stop: Sequence[str] | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        *,
        chat: bool = False,
        seed: int | None = None,
        on_cycle: Callable[[CycleEvent], None] | None = None,
    ) -> GenerationResult:
        """Decode one prompt: raw text (as given), chat messages (through the chat template) or token ids;
        ``chat=True`` wraps raw text as one user turn. ``stop`` strings and EOS end the output exactly where AR decoding would (the
        stopping token included); ``seed`` reseeds sampling for this request; ``on_cycle`` is called
        after every cycle (a debugging hook: caches are synced to the committed sequence by then)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be ≥ 1")
        ids = self.encode(prompt, chat=chat)
        self.check_length(len(ids), max_new_tokens)
        if seed is not None:
            self.generator.manual_seed(seed)
        tok = self.tokenizer
        decode = None if tok is None else (lambda t: tok.decode(t, skip_special_tokens=False))
        stopper = Stopper(max_new_tokens, self.eos_ids(eos_token_id), list(stop or ()), decode)
        if self.fast_engine is not None and on_cycle is not None and self.params.fast is True:
            raise ValueError(
                "on_cycle reads the composed cycle's proposal and logits: pass fast=false (or auto) to the Decoder "
                "to use it"
            )
        cycle: engine.Cycle = engine.ComposedCycle(
            self.models,
            self.method,
            self.proposer,
            self.verifier,
            params=self.params,  # read per request: a caller may replace them between requests
            generator=self.generator,
            probe=self.probe,
        )
        fast = self.fast_engine
        # the device cycle, unless the hook watches proposals, or (under auto) a cache_len fixed too short for this
        # request, or sd's draft lacks the two prompt tokens its first pass re-feeds: then the composed cycle
        fits = fast is not None and (fast.fits(len(ids), max_new_tokens) or self.params.fast is True)
        if fast is not None and fits and on_cycle is None and fast.serves(len(ids)):
            cycle = fast
        new, stats = engine.run(
            ids,
            cycle=cycle,
            stopper=stopper,
            trace=self.trace,
            on_cycle=on_cycle,
            models=self.models,
            name=self.method.name,
        )
        text = "" if tok is None else tok.decode(new, skip_special_tokens=True)
        return GenerationResult(token_ids=new, text=text, stats=stats)


def encode_prompt(
    tokenizer: Any, prompt: Prompt, *, chat: bool = False, name: str = "the model"
) -> list[int]:
    """Token ids of a prompt: raw text (tokenized as given), chat messages (``tokenizer``'s chat template +
    generation prompt), or ids; ``chat=True`` wraps raw text as one user turn. Both backends encode with it."""
    if isinstance(prompt, str) and chat:
        prompt = [{"role": "user", "content": prompt}]
    if isinstance(prompt, torch.Tensor):
        return [int(t) for t in prompt.reshape(-1).tolist()]
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return list(cast(list[int], prompt))
    if tokenizer is None:
        raise ValueError("text and chat prompts need a tokenizer: pass tokenizer= to the Decoder")
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"the tokenizer of {name} has no chat template: give raw text (and chat=false) instead"
            )
        text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    raise ValueError("a prompt is a string, a list of chat messages ({'role', 'content'}), or token ids")


def check_positions(prompt_len: int, max_new_tokens: int, limits: Sequence[tuple[str, int | None]]) -> None:
    """A clear error when a request could run past a model's ``max_position_embeddings`` (``limits``: each model's
    name and limit).

    The last position any method feeds is ``prompt_len + max_new_tokens − 1``: ProVe's verifier scoring the
    last token of a block that ends at ``max_new_tokens``. A block's placeholders never reach beyond it,
    since every proposal is capped by the tokens the request may still take. So every method needs
    ``prompt_len + max_new_tokens ≤ max_position_embeddings`` of every model it runs (target, verifier,
    draft). No truncation: the output would silently be something else. An empty prompt (nothing to condition
    on) is refused here too, so a prompt file's up-front check catches it with the rest.
    """
    if prompt_len < 1:
        raise ValueError("the prompt is empty (0 tokens): give it at least one token, or leave it out")
    for name, limit in limits:
        if limit is not None and prompt_len + max_new_tokens > limit:
            raise ValueError(
                f"the prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) = "
                f"{prompt_len + max_new_tokens} positions exceed the {name}'s max_position_embeddings "
                f"({limit}): lower max_new_tokens to {max(limit - prompt_len, 0)} or less, or shorten the prompt"
            )


def allowed_ids(rows: Sequence[int], tokenizer: Any, masks: Sequence[int | None]) -> tuple[int, set[int]]:
    """The ids a decode may propose and commit, as (limit, excluded): the ids below ``limit`` but those in
    ``excluded``. ``limit`` is the fewest logit rows of any model it runs (``rows``: the target's first) and the
    tokenizer's size; ``excluded`` every ``<|mask|>`` id below it (``masks``, and the tokenizer's): a placeholder,
    never text. Both backends restrict to these (``Models.allowed``; vLLM's ``allowed_token_ids``)."""
    limit = min(rows)
    vocab = tokenizer.get_vocab() if tokenizer is not None else {}
    if vocab:
        limit = min(limit, max(vocab.values()) + 1)
    excluded = {int(m) for m in (*masks, vocab.get(MASK_TOKEN)) if m is not None and 0 <= m < limit}
    return limit, excluded


def check_same_vocab(tokenizer: Any, other: Any, role: str, other_name: str | None, model_name: str) -> None:
    """A ``ValueError`` unless ``other`` (the verifier's or draft's tokenizer) has ``tokenizer``'s vocabulary, apart
    from ``<|mask|>``."""
    diff = vocab_difference(tokenizer, other)
    if diff:
        raise ValueError(
            f"the {role} {other_name}'s tokenizer differs from model {model_name}'s ({diff} entries differ): "
            f"the {role} must share the model's vocabulary (apart from {MASK_TOKEN}); pick a {role} of the "
            "same model family"
        )
