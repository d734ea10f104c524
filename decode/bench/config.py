"""``prove-bench``'s configuration schema (:class:`BenchConfig`): the one home of every bench default;
``conf/decode/bench.yaml`` only selects it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prove.common.schema import schema_node
from prove.data.loading import check_dtype
from prove.decode.bench.rows import as_values
from prove.decode.config import BACKENDS, VllmOptions

SWEEP_KEYS = (
    "theta",
    "tau",
    "block_size",
    "k",
    "draft_threshold",
    "fuse",
    "fuse_groups",
    "fast",
    "compile",
    "pad_widths",
    "temperature",
    "top_p",
    "top_k",
)
"""Parameters that take a list (one row per value) from the command line: ``theta=[0.05,0.1]``,
``temperature=[0,0.7]``."""


DEFAULT_METHODS = ("ar", "mars", "prove", "prove-lossless")


HF_COMPARE_METHODS = ("ar", "sd")


VLLM_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)
"""Requests in flight at once of the vLLM rows (``backend=vllm``): one request, as our engine decodes, up to a
loaded server's batch."""


@dataclass
class BenchConfig:
    """``prove-bench``: every method over one prompt set, AR first; writes bench.json, bench.md and plots.

    Launch: ``prove-bench model=PATH verifier=PATH draft=PATH prompts=FILE methods=[ar,mars,prove]
    theta=[0.05,0.1,0.3]``.
    """

    model: str | None = None
    """The model being accelerated: the block proposer (mars / prove / prove-lossless) and the SD target
    (required unless ``hf_compare`` builds one)."""
    verifier: str | None = None
    """ProVe's small scorer (method prove); also the probe whose q the ROC plot uses."""
    draft: str | None = None
    """The SD family's small AR proposer (sd / nsd / asd, and transformers' assisted generation)."""
    prompts: str | None = None
    """JSONL (``prompt`` or ``messages`` per line, optional ``answer`` and ``category``) or plain text, one prompt a
    line (required unless ``suite`` names public sets or ``hf_compare`` draws random ones)."""
    suite: Any = None
    """Named prompt suites instead of ``prompts`` (``prove.data.suites``): ``mt-bench`` (first turns), ``mt-bench-2``
    (second turns after the model's AR greedy first answer), ``humaneval``, ``arithmetic`` (generated), or a list,
    e.g. ``suite=[mt-bench,humaneval]``. bench.md reports every row per category too."""
    per_category: Any = None
    """The first N prompts of each category of each suite (null = all), e.g. ``per_category=2`` for a quick pass
    over MT-bench's 8 categories, or a count per suite: ``per_category={mt-bench:5,humaneval:40}`` (HumanEval and the
    arithmetic set are one category each; a suite left out: all its prompts)."""
    suite_files: Any = None
    """A local copy of a suite's file instead of its package's, e.g. ``suite_files={mt-bench:FILE}``."""
    first_answer_tokens: int = 256
    """``mt-bench-2``: max_new_tokens of the AR greedy first answers the second turns follow (decoded once per model
    and cached in ``suite_cache``; the same for every row)."""
    suite_cache: str = "outputs/suites"
    """Where ``mt-bench-2``'s first answers are cached (one JSONL per model fingerprint, dtype and token limit)."""
    run_code: bool = False
    """``suite=humaneval``: score pass@1 by running every row's code with the problem's tests, in a fresh Python
    process per program (model-written code on this machine: hence opt-in). false: accuracy n/a."""
    position_bin: int = 64
    """Response positions per bin of bench.md's tokens-per-cycle-by-position tables (first 64 tokens, next 64, ...)."""
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))
    """Methods to run (``prove.decode.methods``); ``ar`` is always run first, as the reference."""
    theta: Any = None
    """ProVe's θ (NSD's nucleus mass): a value, or a list to sweep, e.g. ``theta=[0.05,0.1,0.3]``."""
    tau: Any = None
    """MARS's τ: a value or a list to sweep."""
    block_size: Any = None
    """K: a value or a list to sweep (null = the trained block size)."""
    k: Any = None
    """The draft lookahead of the SD family: a value or a list to sweep."""
    draft_threshold: Any = None
    """Where a proposal stops (``DecodeParams.draft_threshold``; sd, nsd, unfused prove-lossless): a value or a
    list, e.g. ``draft_threshold=[0,0.4]`` for the two draft-length policies of transformers' rows. With
    ``hf_compare`` and no value given: ``[0, hf_assistant_threshold]``."""
    fuse: Any = None
    """Fused verify-and-draft for the methods that can (prove-lossless; nsd / asd on the block proposer):
    a value or a list, e.g. ``fuse=[false,true]`` for unfused and fused rows side by side."""
    fuse_groups: Any = None
    """J of the fused rows: ``all``, m or ``auto``, or a list, e.g. ``fuse_groups=[all,2,auto]`` (unfused rows ignore
    it)."""
    fast: Any = None
    """Our engine's fast path (``DecodeParams.fast``: true, false, auto), or a list, e.g. ``fast=[false,true]`` for
    the reference loop and the fast path side by side; each row records which ran (``path``)."""
    compile: Any = None
    """The fast path's cycle through ``torch.compile`` (``DecodeParams.compile``: true, false), or a list, e.g.
    ``compile=[false,true]`` with ``fast=true``: eager and compiled cycles side by side."""
    pad_widths: Any = None
    """Padded passes on the reference path (``DecodeParams.pad_widths``: auto, off), or a list, e.g.
    ``pad_widths=[off,auto]``."""
    temperature: Any = None
    """Sampling temperature of our rows: null / 0 = greedy; a value, or a list for a row each, e.g.
    ``temperature=[0,0.7]``: ``ar``, ``ar T=0.7``, ``sd``, ``sd T=0.7``, ... (a sampled row's name always carries its
    T). A method that is greedy only (``prove-lossless``, ``asd``, ``pard``) keeps its greedy row alone, and bench.md
    says so once; transformers' and vLLM's rows stay greedy. One method alone:
    ``method_params={sd:{temperature:0.7}}``. A sampled row's speedup is over the AR row at its temperature (and
    top-p, top-k) where one ran, else over greedy ``ar``, as its ``speedup_over`` says; "= AR" is for greedy rows."""
    top_p: Any = None
    """Nucleus mass of the sampled rows (null = 1, off): a value or a list; greedy rows ignore it."""
    top_k: Any = None
    """Top-k of the sampled rows (null = 0, off): a value or a list; greedy rows ignore it."""
    seed: int = 0
    """Sampling seed: prompt i is decoded with seed ``seed + i`` by every sampled row (the decoder's
    ``generate(seed=...)``, as ``prove-decode`` seeds a prompt file), in every repeat: a rerun gives the same
    tokens."""
    method_params: Any = None
    """Per-method values or sweeps of any ``DecodeParams`` the method reads, overriding the shared ones:
    ``method_params={prove:{theta:[0.05,0.1,0.3]},asd:{budget:[0,8]}}``."""
    n_prompts: int | None = None
    """Use the first N prompts (null = all)."""
    max_new_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    chat: bool = False
    """``prompt`` fields and plain lines are raw text; ``messages`` use the chat template. ``chat=true`` wraps raw
    text as one user turn of the chat template."""
    warmup: int = 1
    """Prompts each row decodes untimed before the timed loop."""
    repeats: int = 1
    """Timed decodes of each prompt by each row, round-robin over the rows; the fastest counts (a shared
    machine's stalls only slow a decode down, so the minimum is the least noisy estimate)."""
    hf: bool = True
    """Add transformers' rows: ``hf-greedy`` (``generate``), and ``hf-assisted`` when a draft is given."""
    hf_assistant_tokens: int = 5
    """k of transformers' assisted generation (at most k a cycle: its constant schedule)."""
    hf_assistant_threshold: float = 0.4
    """A second assisted-generation row, ``hf-assisted-confidence``, with transformers' default draft-length
    policy: drafting stops after a token whose draft probability is under this (0.4 is transformers' default;
    transformers adapts it during a call when scikit-learn is installed, and bench.json's row says whether it
    did). 0: only the constant row, ``hf-assisted``, which never stops early."""
    trace: bool = True
    """An extra, untimed pass of prove-lossless with the verifier as a probe: per-position p̃, q and
    "matches greedy" for the ROC plot and the per-position match curve (block models only)."""
    quality: bool = True
    """Score every row's outputs teacher-forced after the timed rounds (untimed; :mod:`prove.decode.bench.quality`):
    per-token agreement with the target's greedy choice, mean log-likelihood under ``quality_model`` relative to AR's
    output, output length and distinct-n — quality a lossy row can show where task accuracy is near zero."""
    quality_model: str | None = None
    """The model whose log-likelihood scores the outputs (a Hugging Face folder, hub id or ``.gguf``): the base a
    proposer was trained from, say; null: ``model``."""
    bin_size: int = 8
    """Response positions per bin of the tokens-per-cycle-along-the-response curve."""
    output_dir: str = "outputs/bench"
    """Where bench.json, bench.md and the PNG plots go."""
    plots: bool = True
    pass_cost_widths: int = 0
    """Measure the model's pass cost t(w)/t(1) for widths w = 1..N (tokens fed in one pass over a cached
    context, through the fused pass's masked path) and print it in bench.md; 0 = skip. It is what decides
    how many groups a fused pass should carry on a given machine."""
    pass_cost_context: int = 128
    """Cached context length of the pass-cost measurement."""
    pass_cost_repeats: int = 10
    """Timed passes per width (round-robin over the widths; the fastest counts)."""
    device: str = "cpu"
    dtype: str = "float32"
    progress: bool = True
    hf_compare: str | None = None
    """Our ``ar`` / ``sd`` against transformers' ``generate`` greedy and assisted generation on random-weight
    models of a real model's shape, built in-process (``prove.decode.random_models.SHAPES``: ``qwen2.5-0.5b``,
    ``tiny``): the target, a ``draft_layers``-layer cut of it as the draft, ``n_prompts`` prompts of
    ``prompt_len`` random token ids, no EOS (every request decodes ``max_new_tokens``). No ``model``,
    ``draft`` or ``prompts``; ``methods`` defaults to ``[ar, sd]``. Tokens must be identical between all four
    rows (a mismatch is an error); bench.json's ``hf_compare`` has the paired time ratios."""
    draft_layers: int = 6
    """``hf_compare``: decoder layers of the layer-skip draft."""
    prompt_len: int = 128
    """``hf_compare``: tokens per random prompt."""
    deep_scale: float = 1.0
    """``hf_compare``: scale of the output projections of the layers the draft skips (< 1: the draft agrees
    with the target more often, like a trained layer-skip draft; ``random_models.random_target_and_draft``)."""
    backend: str = "engine"
    """``engine``: our rows (and transformers'); ``vllm``: vLLM's rows too, in the same run and report
    (:mod:`prove.decode.bench.vllm_rows`): each of ``vllm_methods`` decoding every prompt at each concurrency of
    ``vllm_concurrency``, checked token for token against our ``ar``."""
    vllm_methods: list[str] = field(default_factory=lambda: ["ar", "prove-lossless", "sd", "prove"])
    """The methods vLLM runs with ``backend=vllm`` (``prove.decode.vllm.backend.vllm_methods()``), one engine each;
    ``sd``, ``pard``, ``nsd`` and ``asd`` only where a ``draft`` is given, ``prove`` where a ``verifier`` is. K and k
    are the first values of their sweeps (an engine starts with one); each point of the rule's sweep (θ; ASD's budget,
    gate, max_mismatches) is a row of its own, ``vllm prove θ=0.1``, served by the method's one engine with the values
    sent per request (:mod:`prove.decode.bench.vllm_rows`)."""
    vllm_method_params: Any = None
    """The vLLM rows' own per-method values or sweeps, shaped as ``method_params`` (K / k: one value; the rule's keys:
    a list for a row each), e.g. ``vllm_method_params={prove:{theta:[0.1]}}`` for one vLLM prove row beside our
    rows' θ sweep. A method it names takes these instead of its ``method_params``; the others keep theirs (null: all
    do), over the shared keys."""
    vllm_concurrency: list[int] = field(default_factory=lambda: list(VLLM_CONCURRENCY))
    """Requests kept in flight by the vLLM rows: one row per method and value."""
    vllm: VllmOptions = field(default_factory=VllmOptions)
    """The vLLM engines' knobs (``vllm.kv_cache_gb``, ``vllm.max_model_len``, ``vllm.engine_args``, ...): every
    engine of the run is started once and kept while the rows run, interleaved like ours."""

    def __post_init__(self) -> None:
        check_dtype(self.dtype, "dtype")
        if self.hf_compare is not None:
            self._check_hf_compare()
        else:
            self._check_sources()
        self._check_counts()
        if not self.methods:
            raise ValueError("methods is empty: give e.g. methods=[ar,prove-lossless]")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}: pick one of {', '.join(BACKENDS)}")
        for key in SWEEP_KEYS:
            as_values(getattr(self, key))
        for key in ("method_params", "vllm_method_params"):
            mp = getattr(self, key) or {}
            if not isinstance(mp, Mapping) or not all(isinstance(v, Mapping) for v in mp.values()):
                raise ValueError(
                    f"{key}={mp!r} must map a method to its params, e.g. {key}={{prove:{{theta:[0.05,0.1]}}}}"
                )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r} must be an integer ≥ 0")
        if self.backend == "vllm":
            self._check_vllm()
        elif self.vllm_method_params:
            raise ValueError(
                "vllm_method_params sets the vLLM rows' sweeps: add backend=vllm, or drop vllm_method_params"
            )

    def _check_hf_compare(self) -> None:
        """``hf_compare``: a known shape, no models or prompts of ours, ar / sd only, greedy (tokens compared)."""
        from prove.decode.random_models import SHAPES

        if self.hf_compare not in SHAPES:
            raise ValueError(
                f"hf_compare={self.hf_compare!r} is not a known shape; pick one of: {', '.join(SHAPES)}"
            )
        if self.model is not None or self.draft is not None or self.prompts is not None or self.suite:
            raise ValueError(
                "hf_compare builds its own models and prompts: drop model=, draft=, prompts= and suite="
            )
        if list(self.methods) == list(DEFAULT_METHODS):
            self.methods = list(HF_COMPARE_METHODS)
        extra = set(self.methods) - set(HF_COMPARE_METHODS)
        if extra:
            raise ValueError(
                f"hf_compare runs methods {list(HF_COMPARE_METHODS)} only (no mask token, no verifier); drop {sorted(extra)}"
            )
        if any(as_values(self.temperature)) or any(
            (own or {}).get("temperature") for own in (self.method_params or {}).values()
        ):
            raise ValueError("hf_compare checks greedy tokens against transformers' greedy: drop temperature")
        if self.prompt_len < 1:
            raise ValueError(f"prompt_len={self.prompt_len} must be ≥ 1")
        if self.draft_threshold is None:  # ours beside each of transformers' two draft-length policies
            self.draft_threshold = [0.0, self.hf_assistant_threshold] if self.hf_assistant_threshold else 0.0

    def _check_sources(self) -> None:
        """A model, and prompts from one of a file or named suites."""
        if self.model is None:
            raise ValueError("pass model=PATH (the model being accelerated), or hf_compare=SHAPE")
        if (self.prompts is None) == (not self.suite):
            raise ValueError(
                "pass prompts=FILE (JSONL or plain text) or suite=NAME (mt-bench, mt-bench-2, humaneval, "
                "arithmetic), one of the two (or hf_compare=SHAPE)"
            )
        if self.suite:
            from prove.decode.suites import suite_names

            suite_names(self.suite)
        elif self.suite_files:
            raise ValueError("suite_files replaces a suite's file: add suite=NAME, or drop suite_files")

    def _check_counts(self) -> None:
        """The counts and ranges: prompts, tokens, repeats, the pass-cost measurement."""
        if self.per_category is not None:
            from prove.decode.suites import per_category_counts, suite_names

            per_category_counts(self.per_category, suite_names(self.suite))
        if self.first_answer_tokens < 1 or self.position_bin < 1:
            raise ValueError(
                f"first_answer_tokens={self.first_answer_tokens} and position_bin={self.position_bin} must be ≥ 1"
            )
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be ≥ 1")
        if self.n_prompts is not None and self.n_prompts < 1:
            raise ValueError(f"n_prompts={self.n_prompts} must be ≥ 1 (or null for all)")
        if self.repeats < 1:
            raise ValueError(f"repeats={self.repeats} must be ≥ 1")
        if self.warmup < 0:
            raise ValueError(f"warmup={self.warmup} must be ≥ 0")
        if not 0 <= self.hf_assistant_threshold <= 1:
            raise ValueError(
                f"hf_assistant_threshold={self.hf_assistant_threshold} is a probability: give a value in [0, 1]"
            )
        if self.pass_cost_widths < 0 or self.pass_cost_context < 1 or self.pass_cost_repeats < 1:
            raise ValueError(
                f"pass_cost_widths={self.pass_cost_widths} must be ≥ 0 (0 = off), pass_cost_context="
                f"{self.pass_cost_context} and pass_cost_repeats={self.pass_cost_repeats} ≥ 1"
            )

    def _check_vllm(self) -> None:
        from prove.decode.vllm.backend import vllm_methods

        if self.hf_compare is not None:
            raise ValueError("hf_compare compares ours with transformers' generate: drop backend=vllm")
        runs = vllm_methods()
        unknown = [m for m in self.vllm_methods if m not in runs]
        if unknown or not self.vllm_methods:
            raise ValueError(
                f"vllm_methods={list(self.vllm_methods)}: vLLM runs {', '.join(runs)} (the others: our rows)"
            )
        if not self.vllm_concurrency or min(self.vllm_concurrency) < 1:
            raise ValueError(f"vllm_concurrency={list(self.vllm_concurrency)}: give requests in flight ≥ 1")
        if max(self.vllm_concurrency) > self.vllm.max_num_seqs:
            raise ValueError(
                f"vllm_concurrency reaches {max(self.vllm_concurrency)} but vllm.max_num_seqs="
                f"{self.vllm.max_num_seqs} caps a step: raise vllm.max_num_seqs"
            )
        self.vllm_concurrency = sorted(set(self.vllm_concurrency))
        from prove.decode.bench.vllm_rows import plan

        plan(self)  # every vLLM row's values checked: vllm_method_params' methods and keys, the rules' ranges

    def sweeps(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in SWEEP_KEYS}


def register_configs() -> None:
    """Register the schema that ``conf/bench.yaml`` extends (idempotent)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="bench_schema", node=schema_node(BenchConfig))
