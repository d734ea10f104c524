"""Structured configs of decoding (docs/design.md §3.1): dataclasses registered with Hydra's ConfigStore.

``DecodeParams`` is what a method reads (the Python API takes the same names as keyword arguments);
``DecodeConfig`` adds what the ``prove-decode`` CLI needs (paths, prompt file, output file, device).
A typo in a key fails when Hydra composes the config, before any model loads. This module imports
neither torch nor transformers, so ``prove-decode --help`` stays instant.

These dataclasses are the one home of every default (the YAML files only select them). Defaults of
``None`` mean "the method's default" (its registry entry in ``prove.decode.methods``), or, for ``block_size``, the block size the checkpoint was trained
with (``prove.json``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from prove.common.schema import schema_node
from prove.data.loading import DTYPES as DTYPES  # one home of the dtype names (decode, bench, eval, train)
from prove.data.loading import check_dtype

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "seed")
"""The ``DecodeParams`` every method reads; the others are method parameters (``prove.decode.methods``)."""
_INT_PARAMS = ("block_size", "k", "max_mismatches", "top_k", "seed")
ENGINE_KEYS = ("fast", "compile", "pad_widths")
"""The ``DecodeParams`` that choose how our engine runs a method, not what it computes: every method takes them."""


@dataclass
class DecodeParams:
    """Parameters of a decoding method. ``None`` = the method's default."""

    theta: float | None = None
    """ProVe threshold θ on p̃_i·q_i (proposer confidence × verifier probability), or NSD's nucleus mass."""
    tau: float | None = None
    """MARS confidence threshold τ on p̃_i (MARS: 0.95)."""
    block_size: int | None = None
    """K, placeholders per block pass. ``None`` = the trained block size (prove.json); must not exceed it."""
    k: int | None = None
    """Draft lookahead of the speculative-decoding family (draft proposer: k sequential passes)."""
    budget: float | None = None
    """ASD's per-request regret budget B: the summed regret of accepted mismatches (ASD: 8.0; 0 = exact greedy)."""
    gate: float | None = None
    """ASD's gate g: a mismatch at depth i (1-based) passes only if its regret r_i ≤ g·(K − i + 1) (ASD: 0.25; 0 = exact greedy)."""
    max_mismatches: int | None = None
    """ASD's m: mismatches accepted per block at most (ASD: 2; 0 = exact greedy)."""
    fuse: bool | None = None
    """Fused verify-and-draft (``prove.decode.engine.fused``): the model's verification pass also drafts the next
    block, so a cycle is one model pass. For block proposals the model verifies itself (prove-lossless;
    nsd / asd with proposer=block); greedy only; the output is unchanged."""
    fuse_groups: Any = None
    """With ``fuse``: draft after ``all`` acceptance lengths, or after the m likeliest ones (an integer m ≥ 1,
    by the proposer's confidences): a narrower pass, and a one-token cycle when the guess misses; or ``auto``:
    per cycle, the likeliest lengths whose expected yield pays for the wider pass, by this device's pass-cost
    curve (measured when the Decoder is built)."""
    draft_threshold: float | None = None
    """Where a proposal stops: after the first token whose probability under its proposer is below this (that
    token is still proposed, as transformers' assisted generation does with ``assistant_confidence_threshold``).
    A draft model then stops drafting (fewer draft passes and a narrower verification when its draft is poor); a
    block proposal is verified only up to there (unfused). 0 = always k (or K) tokens. The rule sees only a
    shorter proposal: greedy output and the sampling distribution are unchanged (sd, nsd, prove-lossless)."""
    temperature: float = 0.0
    """0 = greedy. > 0 samples (proposers draw from, and rules read, the tempered distributions)."""
    top_p: float = 1.0
    """Nucleus sampling mass (with temperature > 0); 1 = off."""
    top_k: int = 0
    """Top-k sampling (with temperature > 0); 0 = off."""
    seed: int = 0
    """Seed of the torch.Generator that sampling draws from."""
    fast: Any = None
    """Our engine's fast path (``prove.decode.engine.device``: a static slot cache, fixed-width cycles captured as CUDA
    graphs, one host sync per cycle): ``true``, ``false`` or ``auto`` (``None`` = auto: on CUDA for the methods
    and models it serves, today's reference path elsewhere). Greedy output is the same either way; sampled output
    has the same distribution, from other draws."""
    compile: bool | None = None
    """``true``: the fast path's regular cycle goes through ``torch.compile`` (inductor, ``fullgraph``, no dynamic
    shapes) before it is captured as a CUDA graph: the elementwise work of every layer (RMSNorm, rotary, SwiGLU, the
    residual adds) fused into a few kernels a layer, where the eager model launches ~40 small ones. A compile of
    seconds (CPU, tiny) to minutes (GPU, large shapes) per Decoder. Needs the fast path (``fast=true``, or auto on
    CUDA); ``false`` / ``None``: the eager cycle. Greedy output is the same up to the rounding of fused kernels."""
    pad_widths: Any = None
    """``auto``: on the reference path, measure this device's cost of a linear pass at each width once per model
    and run a pass wider (filler tokens, discarded) where a wider one costs less (``prove.decode.engine.padding``; on a CPU
    some widths run slower than wider ones). ``off`` (``None``): every pass as wide as its tokens."""

    def __post_init__(self) -> None:
        for name in DecodeParams.field_names():
            value = getattr(self, name)
            if value is None or name in ("fuse_groups", "fast", "pad_widths"):  # parsed below
                continue
            if name in ("fuse", "compile"):
                if not isinstance(value, bool):
                    raise ValueError(f"{name}={value!r} must be true or false")
                continue
            if name in _INT_PARAMS and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{name}={value!r} must be an integer")
            if name not in _INT_PARAMS and (
                isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value)
            ):
                raise ValueError(f"{name}={value!r} must be a number")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} is negative; use 0 for greedy or a value > 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must lie in (0, 1]; use 1 to switch it off")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} is negative; use 0 to switch it off")
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"block_size={self.block_size} must be ≥ 1")
        if self.k is not None and self.k < 1:
            raise ValueError(f"k={self.k} must be ≥ 1")
        if self.tau is not None and self.tau < 0:
            raise ValueError(f"tau={self.tau} must be ≥ 0 (τ > 1 never accepts beyond y_1, i.e. AR)")
        if self.draft_threshold is not None and not 0 <= self.draft_threshold <= 1:
            raise ValueError(
                f"draft_threshold={self.draft_threshold} is a probability: give a value in [0, 1] (0 = off)"
            )
        if self.theta is not None and self.theta < 0:
            raise ValueError(f"theta={self.theta} must be ≥ 0 (θ = 0 commits whole blocks)")
        for name in ("budget", "gate", "max_mismatches"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be ≥ 0 (0 makes asd exactly greedy)")
        if self.fuse_groups is not None:
            m = parse_fuse_groups(self.fuse_groups)
            self.fuse_groups = "all" if m is None else m
        if self.fast is not None:
            self.fast = parse_fast(self.fast)
        if self.compile and self.fast is False:
            raise ValueError(
                "compile=true compiles the fast path's cycle, and fast=false turns that path off: pass fast=true "
                "(or auto), or compile=false"
            )
        if self.pad_widths is not None:
            self.pad_widths = parse_pad_widths(self.pad_widths)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def params(self) -> DecodeParams:
        """Just the method parameters of a config that extends this class (``DecodeConfig``, ``EvalConfig``)."""
        return DecodeParams(**{name: getattr(self, name) for name in DecodeParams.field_names()})

    def with_defaults(self, defaults: dict[str, Any]) -> DecodeParams:
        """A copy where every ``None`` field takes its value from ``defaults``."""
        updates = {k: v for k, v in defaults.items() if getattr(self, k) is None}
        return dataclasses.replace(self, **updates)


BACKENDS = ("engine", "vllm")
"""``engine``: ours (every method, one request at a time, exact stats); ``vllm``: vLLM (the methods it can express,
batched, paged KV, tensor parallel; ``prove.decode.vllm.backend``)."""


@dataclass
class VllmOptions:
    """Knobs of ``backend=vllm`` (``prove-decode``, the Python API's ``VllmDecoder``) and of ``prove-serve``."""

    concurrency: int | None = None
    """Requests in flight at once: ``None`` = every prompt at once (vLLM's scheduler runs ``max_num_seqs`` of them);
    1 = one request in flight, as our engine decodes."""
    max_num_seqs: int = 256
    """vLLM's cap on the sequences it batches in one step."""
    kv_cache_gb: float | None = None
    """GiB of KV cache (vLLM's ``kv_cache_memory_bytes``), checked against the free memory before the engine starts.
    ``None`` = sized by prove (``prove.decode.vllm.memory``): on the CPU the free memory less the weights of the
    target and drafter and a 2 GiB margin, half of that at most, no more than ``max_num_seqs`` sequences of
    ``max_model_len`` tokens fill and no less than one (vLLM's own CPU default would demand 92% of the machine free
    and take it); on a GPU what vLLM's ``gpu_memory_utilization`` leaves, that utilization lowered to the GPU's
    free memory when the GPU is in use and the user has not set it. The chosen size is printed at start."""
    max_model_len: int | None = None
    """Longest prompt + output vLLM plans KV space for; ``None`` = the model's ``max_position_embeddings``."""
    tensor_parallel_size: int = 1
    """GPUs one model is split over (the drafter of ``draft_model`` is split alike)."""
    enforce_eager: bool | None = None
    """No CUDA graphs or compilation; ``None`` = true on the CPU (where compiling buys nothing at test sizes), vLLM's
    default on a GPU."""
    k_schedule: list[list[int]] | None = None
    """K by batch size: ``[[first, last, K], ...]`` ranges of requests in a step (vLLM's
    ``num_speculative_tokens_per_batch_size``), e.g. ``[[1,8,8],[9,32,4],[33,256,0]]``, so one engine drafts less as
    the batch grows (docs/vllm.md, "Under load"). K = 0 for the lossless methods (``prove-lossless``, ``pard``,
    ``sd``) only: ``prove``, ``nsd`` and ``asd`` take K ≥ 1 (at K = 0 vLLM's target answers the step, not our rule).
    Parallel drafting then runs through our drafter (``prove.decode.vllm.plugin``, pinned to its tested vLLM), which
    runs no pass at K = 0. ``None`` = the static K everywhere."""
    engine_args: dict[str, Any] = field(default_factory=dict)
    """Any other vLLM engine argument (``vllm.EngineArgs``), one override a key:
    ``vllm.engine_args.max_num_batched_tokens=8192`` (prove-serve: ``engine_args.max_num_batched_tokens=8192``); it
    wins over what the adapter sets. ``gpu_memory_utilization`` or ``kv_cache_memory_bytes`` here replace prove's
    KV-cache sizing (``kv_cache_gb``) and are checked against free memory the same way."""

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(
                f"vllm.concurrency={self.concurrency} must be ≥ 1 (or null: every prompt at once)"
            )
        if self.max_num_seqs < 1:
            raise ValueError(f"vllm.max_num_seqs={self.max_num_seqs} must be ≥ 1")
        if self.kv_cache_gb is not None and self.kv_cache_gb <= 0:
            raise ValueError(
                f"vllm.kv_cache_gb={self.kv_cache_gb} must be > 0 (or null: sized from the free memory)"
            )
        if self.tensor_parallel_size < 1:
            raise ValueError(f"vllm.tensor_parallel_size={self.tensor_parallel_size} must be ≥ 1")
        for entry in self.k_schedule or ():
            if len(entry) != 3 or not 1 <= entry[0] <= entry[1] or entry[2] < 0:
                raise ValueError(
                    f"vllm.k_schedule entry {list(entry)} must be [first, last, K] with 1 ≤ first ≤ last and K ≥ 0, "
                    "e.g. vllm.k_schedule=[[1,8,8],[9,256,0]]"
                )


@dataclass
class DecodeConfig(DecodeParams):
    """``prove-decode``: decode a prompt file with one method, writing one JSONL record per prompt.

    Launch: ``prove-decode model=PATH method=prove verifier=PATH theta=0.1 block_size=16
    prompts=prompts.jsonl output=out.jsonl max_new_tokens=256``.
    """

    model: str = "???"
    """Checkpoint directory (or hub id) of the model being accelerated: the block proposer for
    mars / prove / prove-lossless, the target for the speculative-decoding family, the model for ar."""
    verifier: str | None = None
    """ProVe's small scorer (method=prove). With prove-lossless it is an optional probe recorded by the trace."""
    draft: str | None = None
    """The small AR proposer of the speculative-decoding family."""
    method: str = "prove-lossless"
    """A name from ``prove.decode.methods.METHODS`` (its parameters' defaults are that entry's)."""
    proposer: str | None = None
    """Run the method's rule on another proposer (``block`` or ``draft``); e.g. ``method=nsd proposer=block``
    is NSD's nucleus gate on the block proposer, self-verified. ``None`` = the method's own."""
    prompts: str | None = None
    """JSONL with a ``prompt`` (raw text) or ``messages`` (chat turns) field per line, or a plain-text file (one raw-text
    prompt a line). See ``chat``. Or ``suite``."""
    suite: Any = None
    """Named public prompt sets instead of ``prompts`` (``prove.data.suites``): ``mt-bench``, ``mt-bench-2`` (second
    turns after the model's cached AR greedy first answers), ``humaneval``, ``arithmetic`` (generated), or a list.
    Each output record carries its ``category`` (``suite/category``, e.g. ``mt-bench/writing``)."""
    per_category: Any = None
    """With ``suite``: the first N prompts of each category (null = all), or a count per suite, e.g.
    ``per_category={mt-bench:5,humaneval:40}``."""
    suite_files: Any = None
    """With ``suite``: a local copy of a suite's file instead of its package's, e.g. ``suite_files={mt-bench:FILE}``."""
    first_answer_tokens: int = 256
    """``mt-bench-2``: max_new_tokens of the AR greedy first answers (decoded once per model, cached in
    ``suite_cache``)."""
    suite_cache: str = "outputs/suites"
    """Where ``mt-bench-2``'s first answers are cached."""
    output: str = "???"
    """JSONL written one record per prompt as each finishes; an existing file is resumed (finished ids are skipped)."""
    max_new_tokens: int = 256
    """New tokens per prompt at most."""
    stop: list[str] = field(default_factory=list)
    """Stop strings: output ends at the token that completes the first one (that token included), as AR would."""
    chat: bool = False
    """Prompt convention: a ``prompt`` field or a plain line is raw text, fed as given; ``messages`` go through the
    model's chat template. ``chat=true`` wraps raw text as one user turn of the chat template."""
    trace: bool = False
    """Record per-position proposer confidence / verifier probability / greedy match in each record's stats."""
    device: str = "cpu"
    """torch device, e.g. ``cuda`` or ``cuda:1``."""
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16, float16, or auto (the checkpoint's)."""
    cache_len: int | None = None
    """The fast path's KV slots, fixed (a prompt + ``max_new_tokens`` it cannot hold is refused under ``fast=true``
    and decoded on the reference path under auto). ``None``: start at min(max_position_embeddings, 4096) and grow
    as a request needs. A pass attends the slots in use either way."""
    backend: str = "engine"
    """``engine`` (ours: every method) or ``vllm`` (ar, prove-lossless, sd, pard on vLLM, every prompt batched;
    ``vllm.*`` are its knobs)."""
    vllm: VllmOptions = field(default_factory=VllmOptions)
    """``backend=vllm``'s knobs: ``vllm.concurrency``, ``vllm.max_num_seqs``, ``vllm.kv_cache_gb``, ...,
    ``vllm.engine_args``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be ≥ 1")
        if self.cache_len is not None and self.cache_len < 2:
            raise ValueError(
                f"cache_len={self.cache_len} must be ≥ 2 (a prompt token and a new one), or null to grow"
            )
        check_dtype(self.dtype, "dtype")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}: pick one of {', '.join(BACKENDS)}")
        if (self.prompts is None) == (not self.suite):
            raise ValueError(
                "pass prompts=FILE (JSONL or plain text) or suite=NAME (mt-bench, mt-bench-2, humaneval, arithmetic), "
                "one of the two"
            )
        if self.suite:
            from prove.decode.suites import suite_names

            names = suite_names(self.suite)
            if "mt-bench-2" in names and self.backend != "engine":
                raise ValueError(
                    "suite mt-bench-2 decodes its first answers with our engine: use backend=engine"
                )
        if self.per_category is not None:
            from prove.decode.suites import per_category_counts, suite_names

            per_category_counts(self.per_category, suite_names(self.suite))
        if self.first_answer_tokens < 1:
            raise ValueError(f"first_answer_tokens={self.first_answer_tokens} must be ≥ 1")


def parse_fuse_groups(value: Any) -> int | str | None:
    """``fuse_groups``: ``all`` → None, ``auto`` → "auto", or a count m ≥ 1 (an int, or its decimal string from
    the CLI)."""
    if value is None or value == "all":
        return None
    if value == "auto":
        return "auto"
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ValueError(
        f"fuse_groups={value!r}: give all, auto, or a number of groups m ≥ 1 (e.g. fuse_groups=3)"
    )


def parse_fast(value: Any) -> bool | str:
    """``fast``: True, False or "auto" (``None`` = auto), from Python or the CLI's strings."""
    if value is None or value == "auto":
        return "auto"
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"fast={value!r}: give true, false or auto")


def parse_pad_widths(value: Any) -> str:
    """``pad_widths``: "auto" (measure, then pad) or "off" (also false); from Python or the CLI's strings."""
    if value is True or (isinstance(value, str) and value.lower() in ("auto", "true")):
        return "auto"
    if value is False or (isinstance(value, str) and value.lower() in ("off", "false")):
        return "off"
    raise ValueError(f"pad_widths={value!r}: give auto or off")


def register_configs() -> None:
    """Register the schema the primary config ``conf/decode.yaml`` extends (idempotent)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="decode_schema", node=schema_node(DecodeConfig))
