"""Structured configs for ``prove-train`` (docs/design.md §2), registered with Hydra's ConfigStore.

``conf/train.yaml`` composes the groups below onto :class:`TrainConfig`, so an unknown key or a value
of the wrong type fails when the config is composed, not an hour into a run. ``train(cfg)`` receives
the dataclasses (``OmegaConf.to_object``), whose ``__post_init__`` checks cross-field constraints
(:class:`TrainConfig`'s in :mod:`prove.train.config_rules`) and raises ``ValueError``s that say what to change.

Recipes (``recipes/*.yaml``) are registered as the config group ``recipe`` (package ``_global_``), so
``prove-train recipe=tiny stage=sft`` overlays a whole pipeline and a misspelt recipe fails loudly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from importlib.resources import files
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf
from prove.common.schema import schema_node
from prove.data.gguf import is_gguf, locate, package_file
from prove.data.loading import MASK_TOKEN, check_dtype
from prove.decode.config import BACKENDS, VllmOptions


class _Choice(str, Enum):  # noqa: UP042 - StrEnum formats and reprs otherwise; OmegaConf reads these
    def __str__(self) -> str:  # "sft", not "Stage.sft", inside interpolated strings such as output_dir
        return self.value


class Stage(_Choice):
    """A training stage (docs/design.md §2): each is one Hydra run of ``prove-train``."""

    sft = "sft"
    mars = "mars"
    distill = "distill"


class Role(_Choice):
    """Which model of the proposer–verifier pair a stage trains (docs/design.md §2)."""

    proposer = "proposer"
    verifier = "verifier"


@dataclass
class ScratchConfig:
    """A Qwen2 model built from scratch (the tiny CPU demo, docs/design.md §5) instead of loaded."""

    layers: int = 4
    """Decoder layers."""
    hidden: int = 128
    """Hidden size."""
    heads: int = 4
    """Attention heads."""
    kv_heads: int = 4
    """Key/value heads (grouped-query attention when fewer than ``heads``)."""
    intermediate: int = 512
    """MLP width."""
    tie_embeddings: bool = True
    """Share the input embedding and the LM head."""
    max_position_embeddings: int = 2048
    """Longest position the rotary embedding is sized for."""
    vocab_size: int = 512
    """Size of the byte-level BPE trained on the training rows (``prove.data.tokenizer.build_tiny_tokenizer``)."""
    tokenizer_rows: int = 20000
    """How many training rows the tokenizer is trained on."""


@dataclass
class ModelConfig:
    """The model a stage starts from."""

    name_or_path: str | None = None
    """Hub id or local directory of the base model, or a GGUF file (``*.gguf``: converted once to a cached Hugging
    Face folder, :mod:`prove.data.gguf`); ``None`` builds ``scratch`` instead."""
    gguf_file: str | None = None
    """A GGUF file inside ``name_or_path`` (a local folder or a hub repo), as ``from_pretrained(gguf_file=)`` takes
    it; the model is its converted folder."""
    num_layers: int | None = None
    """Keep only the first N decoder layers of the loaded model, with its final norm and head: a small verifier
    cut from its base (``prove.data.loading.load_model``); ``None`` keeps them all."""
    tokenizer: str | None = None
    """Tokenizer hub id or directory when it differs from ``name_or_path``."""
    scratch: ScratchConfig | None = None
    """Architecture of a from-scratch model (used when ``name_or_path`` is ``None``)."""
    dtype: str = "auto"
    """Weights dtype when loading: ``auto`` (fp32 on CPU, the checkpoint's dtype on GPU), ``float32``, ``bfloat16``, ``float16``."""
    attn_implementation: str = "sdpa"
    """``eager``, ``sdpa``, ``flex_attention`` (MARS then uses a sparse BlockMask) or ``flash_attention_2`` (SFT only)."""
    trust_remote_code: bool = False
    """Passed to ``from_pretrained``."""

    def __post_init__(self) -> None:
        if self.name_or_path is None and self.scratch is None:
            raise ValueError(
                "set model.name_or_path=<hub id or dir>, or pick a from-scratch model (model=tiny)"
            )
        if self.gguf_file is not None and (self.name_or_path is None or is_gguf(self.name_or_path)):
            raise ValueError(
                f"model.gguf_file={self.gguf_file!r} names a file inside model.name_or_path: set "
                "model.name_or_path=<the folder or hub repo holding it>, or pass the file itself as "
                "model.name_or_path=<path>.gguf and drop model.gguf_file"
            )
        check_dtype(self.dtype, "model.dtype")

    @property
    def source(self) -> str | None:
        """What the model loads from: ``name_or_path``, or the path of ``gguf_file`` inside it (a hub repo's file
        is downloaded here)."""
        if self.gguf_file is None or self.name_or_path is None:
            return self.name_or_path
        return locate(self.name_or_path, self.gguf_file)


@dataclass
class SyntheticConfig:
    """Generate the arithmetic demo task (``prove.data.synthetic``) at ``data.path`` when it is missing."""

    n: int = 20000
    """Training rows."""
    test_size: int = 500
    """Held-out prompts written next to it as ``test.jsonl``."""
    seed: int = 0
    """Generator seed."""
    tasks: list[str] = field(default_factory=lambda: ["arithmetic"])
    """The generated tasks, mixed (``prove.data.synthetic.TASKS``: ``arithmetic``, ``lists``)."""
    instruct: bool = False
    """Phrase the arithmetic questions for a pretrained chat model answering in its own words (finish with
    "The answer is"); the tiny task's templated replies need no instruction."""


@dataclass
class DataConfig:
    """Training conversations (Dolci ``messages`` schema; docs/design.md §2)."""

    path: str = MISSING
    """Hub id, JSONL/parquet file or folder, or ``save_to_disk`` folder."""
    name: str | None = None
    """The hub dataset's config name."""
    split: str = "train"
    """Hub split."""
    num_rows: int | None = None
    """Use only the first N rows (quick runs)."""
    max_len: int = 512
    """Longest tokenized example; longer ones are right-truncated, rows whose prompt alone is longer are dropped."""
    num_proc: int = 1
    """Tokenization worker processes."""
    chat_template: str | None = None
    """``None`` keeps the tokenizer's template; ``chatml`` or a Jinja string replaces it."""
    synthetic: SyntheticConfig | None = None
    """Generate the arithmetic demo task into ``path``'s folder if ``path`` does not exist."""
    cache_dir: str | None = "${run_dir}/tokenized"
    """Where the tokenized set is kept (``<cache_dir>/<key>``, :mod:`prove.train.rows`): built once by each node's
    first process while the others wait on the file, not in a collective, and reused by every later stage and
    relaunch — the key leaves out ``stage.mask_token``, so mars reads what sft built. ``None``: no cache."""


class MarsAttention(_Choice):
    """How a MARS step applies the block attention rule (docs/design.md §2.1, "On the CPU")."""

    auto = "auto"
    """``blocks`` when the model's attention is sdpa, FlexAttention's ``BlockMask`` under flex_attention, else ``mask``."""
    blocks = "blocks"
    """The clean stream causal on its own and the noisy queries under a mask of their rows only
    (:mod:`prove.train.attention`): no dense (N + L)² mask; the model runs ``prove_mars_sdpa`` (sdpa for every other
    call)."""
    mask = "mask"
    """One mask over the whole trimmed input for the model's own attention: a float additive (N + L)² mask under
    sdpa/eager, a ``BlockMask`` under flex_attention."""


@dataclass
class StageConfig:
    """What the stage trains (docs/design.md §2, §2.1)."""

    name: Stage = Stage.sft
    """``sft``, ``mars`` (block training) or ``distill`` (the verifier, on the proposer's outputs; docs/design.md §2.3)."""
    role: Role = Role.proposer
    """The model trained: ``proposer`` (sft, mars) or ``verifier`` (distill; sft too, for a verifier trained from
    scratch like the tiny recipe's). Recipes key their per-stage knobs and output folders by it."""
    init_from: str | None = None
    """Checkpoint the stage starts from instead of ``model.name_or_path`` (mars: the sft stage's output;
    distill: the stock verifier)."""
    block_size: int = 16
    """K, the number of placeholders filled per forward pass (mars)."""
    ar_weight: float = 1.0
    """Weight of the clean-stream (AR) CE added to the noisy-stream CE (mars)."""
    mask_token: str = MASK_TOKEN
    """The placeholder token added to the tokenizer (mars)."""
    ce_chunk_rows: int | None = 4096
    """Targets whose logits are made at once (mars): the head and the CE run only at positions with a target,
    this many at a time, each chunk recomputed in the backward pass, so at most one chunk's fp32 logits exist
    (4096 rows × V = 152k: 2.5 GB). ``None``: all at once (no recompute; under ZeRO-3 each chunk gathers the head
    again)."""

    attention: MarsAttention = MarsAttention.auto
    """How stage mars applies its block attention: ``auto`` (the fastest that applies: ``blocks`` under sdpa, the
    ``BlockMask`` under flex_attention), ``blocks`` or ``mask`` (:class:`MarsAttention`). All compute the same loss."""

    depth_decay: float = 1.0
    """Weight ``depth_decay ** (d − 2)`` of a noisy target at decode depth d (mars; depth 1 weighs as 2): below 1 the
    shallow depths, which decide tokens per cycle, lead the noisy loss; 1 is MARS's uniform mean
    (:func:`prove.train.losses.depth_weights`)."""

    def __post_init__(self) -> None:
        if not self.depth_decay > 0:
            raise ValueError(
                f"stage.depth_decay={self.depth_decay}: use a weight ratio > 0 (1 = MARS's uniform noisy loss, "
                "0.7 = each depth weighs 0.7 of the one before)"
            )
        if self.ce_chunk_rows is not None and self.ce_chunk_rows < 1:
            raise ValueError(f"stage.ce_chunk_rows={self.ce_chunk_rows}: use ≥ 1, or null for one chunk")


AUTO_EVAL_ROWS = 256
"""``eval.rows=null`` holds out this many rows, where the data has at least ``AUTO_EVAL_MIN_DATA`` rows."""
AUTO_EVAL_MIN_DATA = 20 * AUTO_EVAL_ROWS


@dataclass
class EvalConfig:
    """Acceptance measured while stage mars trains (:meth:`prove.train.trainer.MarsTrainer.evaluate`): rows held out
    from the stage's own data, scored in teacher-forced ``[noisy | clean]`` passes (no generation) for per-depth
    acceptance and simulated tokens per cycle at every K′ ≤ K (:mod:`prove.train.acceptance`)."""

    rows: int | None = None
    """Rows held out (a seeded sample; the same on resume). ``None``: 256 where the data has ≥ 5120 rows, else no eval
    set; 0: none."""
    steps: int | None = None
    """Score every this many optimizer steps, and at the end. ``None``: at every save (``trainer.save_steps``)."""
    best: bool = False
    """The stage's output is the checkpoint that scored the highest ``eval_tpc_k{block_size}`` (the final weights
    when they score best): its weights, with LoRA its adapter merged. ``save_total_limit`` keeps it."""
    block_size: int | None = None
    """K′ whose simulated tokens per cycle ``eval.best`` maximises; ``None``: the trained K. At most K."""
    batch_size: int | None = None
    """Rows per eval forward; ``None``: ``trainer.per_device_train_batch_size``."""
    tau: float = 0.95
    """τ of the simulated MARS confidence rule (``eval_tpc_mars_k*``)."""

    def __post_init__(self) -> None:
        if self.rows is not None and self.rows < 0:
            raise ValueError(f"eval.rows={self.rows}: use 0 (no eval set), a positive count, or null (auto)")
        for name in ("steps", "block_size", "batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"eval.{name}={value}: use ≥ 1, or null for the default")
        if self.rows == 0 and (self.steps is not None or self.best):
            key = "eval.steps" if self.steps is not None else "eval.best"
            raise ValueError(
                f"{key} scores an eval set, but eval.rows=0 holds none out: set eval.rows=<N> or drop {key}"
            )

    def resolve_rows(self, data_rows: int) -> int:
        """The rows held out of ``data_rows``; a ``ValueError`` naming the fix when they cannot be."""
        rows = self.rows
        if rows is None:
            rows = AUTO_EVAL_ROWS if data_rows >= AUTO_EVAL_MIN_DATA else 0
        if rows >= data_rows and rows > 0:
            raise ValueError(
                f"eval.rows={rows} holds out every one of the stage's {data_rows} rows: lower eval.rows "
                f"(at most {max(data_rows - 1, 0)}), or eval.rows=0 for no eval set"
            )
        if rows == 0 and (self.steps is not None or self.best):
            key = "eval.steps" if self.steps is not None else "eval.best"
            why = f"the data has {data_rows} rows (the automatic eval set needs {AUTO_EVAL_MIN_DATA})"
            raise ValueError(
                f"{key} needs an eval set, but {why}: set eval.rows=<N> below {data_rows}, or drop {key}"
            )
        return rows

    def metric(self, trained_k: int) -> str:
        """The logged value ``eval.best`` maximises."""
        return f"eval_tpc_k{self.block_size or trained_k}"


@dataclass
class DistillConfig:
    """Verifier distillation (stage distill, docs/design.md §2.3): generate the proposer's greedy responses with
    ``prove.decode``, then fine-tune the verifier on them (CE on the response + optional top-k KL)."""

    proposer: str = "${run_dir}/mars"
    """The proposer checkpoint whose outputs the verifier learns (a ``prove-train stage=mars`` output)."""
    prompts: str | None = None
    """A prompt file as ``prove-decode`` reads it (JSONL ``prompt``/``messages``, or text lines); ``None``: the
    conversations of ``data`` without their final assistant turn."""
    num_prompts: int | None = None
    """Use only the first N prompts (after the shuffle when ``prompt_seed`` is set)."""
    prompt_seed: int | None = None
    """Shuffle ``data``'s conversations with this seed before taking ``num_prompts`` (a sample of the whole
    mixture; Dolci's rows are grouped by source); ``None``: file order."""
    exclude_from: list[str] = field(default_factory=list)
    """Generated sets (``generated_dir`` folders) whose prompts this one leaves out: the ids their
    ``generation.json`` records (``prompt_ids``) are dropped before ``num_prompts`` are taken — an on-policy round
    relabels only prompts no earlier set read (``rounds``)."""
    reserve_prompts: int = 0
    """Prompts that must remain unread after this set (the later on-policy rounds' share, set by ``rounds``): fewer
    is an error before anything is generated."""
    method: str = "prove-lossless"
    """Decoding method; a greedy-exact one (``prove-lossless``, ``ar``) so responses are the proposer's AR output."""
    block_size: int | None = None
    """K for block methods; ``None``: the proposer's trained block size."""
    max_new_tokens: int = 512
    """Longest response generated."""
    batch_size: int = 1
    """``backend=engine``: prompts answered at once: 1 = the decode engine, one request at a time; > 1 (method
    ``ar``) = transformers' batched greedy ``generate``, the same decoding an order of magnitude faster on a CPU
    (only the batched matmuls' rounding differs: ``prove.train.distill.answer_batch``). ``backend=vllm`` batches
    by itself (``vllm.concurrency``, ``vllm.max_num_seqs``): leave it at 1."""
    backend: str = "engine"
    """``engine``: our decode engine (above); ``vllm``: vLLM (``prove.decode.vllm.backend``) — every prompt of the
    process's slice handed to one engine at once (paged KV cache, continuous batching, ``vllm.tensor_parallel_size``),
    method ``ar`` or ``prove-lossless`` (the MARS checkpoint as its own parallel drafter: the same greedy tokens),
    the top-k log-probs read off the generating pass. ``prove.train.distill.generate_vllm``."""
    vllm: VllmOptions = field(default_factory=VllmOptions)
    """``backend=vllm``'s knobs: ``distill.vllm.max_num_seqs`` (sequences batched per step), ``kv_cache_gb``,
    ``max_model_len``, ``tensor_parallel_size`` (GPUs per engine), ``engine_args`` (any other vLLM engine argument,
    one override a key: ``distill.vllm.engine_args.gpu_memory_utilization=0.9``)."""
    dtype: str | None = None
    """Dtype of the proposer while generating: ``None`` = ``bfloat16`` on a GPU, ``float32`` on the CPU; or
    ``float32``, ``bfloat16``, ``float16``."""
    device: str | None = None
    """Generation device; ``None``: ``cuda:<LOCAL_RANK>`` when a GPU is present, else ``cpu``."""
    top_k: int = 8
    """Store the proposer's top-k log-probs at each response position (0: store none; ``kl_weight`` needs ≥ 1)."""
    kl_weight: float = 0.0
    """Weight of the token-level KL(p̂_topk ‖ q) added to the response CE (:func:`prove.train.losses.distill_loss`)."""
    generated_dir: str = "${run_dir}/distill-data"
    """Where the generated set goes: ``shards/`` (JSONL, flushed per record; a rerun resumes), ``dataset/``
    (``datasets.save_to_disk``) and ``generation.json`` (proposer + decode settings)."""
    train: bool = True
    """``False``: the stage ends once the generated set is written, training nothing — a model's own greedy
    responses as the data of a later stage (self-distillation: ``data.path=<generated_dir>/dataset``, the
    Dolci schema). ``stage.role`` is then only the recipe's key for the stage's knobs."""

    def __post_init__(self) -> None:
        if self.top_k < 0:
            raise ValueError(f"distill.top_k={self.top_k}: use 0 (store none) or a positive k")
        if self.kl_weight < 0:
            raise ValueError(f"distill.kl_weight={self.kl_weight} must be ≥ 0")
        if self.kl_weight > 0 and self.top_k < 1:
            raise ValueError(
                "distill.kl_weight > 0 needs the proposer's top-k log-probs: set distill.top_k ≥ 1"
            )
        if self.num_prompts is not None and self.num_prompts < 1:
            raise ValueError(f"distill.num_prompts={self.num_prompts}: use ≥ 1, or null for every prompt")
        if self.reserve_prompts < 0:
            raise ValueError(f"distill.reserve_prompts={self.reserve_prompts} must be ≥ 0")
        if self.max_new_tokens < 1:
            raise ValueError(f"distill.max_new_tokens={self.max_new_tokens} must be ≥ 1")
        if self.batch_size < 1:
            raise ValueError(f"distill.batch_size={self.batch_size}: use 1 (one request at a time) or more")
        if self.backend not in BACKENDS:
            raise ValueError(f"distill.backend={self.backend!r}: pick one of {', '.join(BACKENDS)}")
        if self.batch_size > 1 and self.backend == "vllm":
            raise ValueError(
                f"distill.batch_size={self.batch_size} is transformers' batched generate (backend=engine); vLLM "
                "batches every prompt by itself: drop distill.batch_size (distill.vllm.max_num_seqs caps a step)"
            )
        if self.batch_size > 1 and self.method != "ar":
            raise ValueError(
                f"distill.batch_size={self.batch_size} answers with transformers' batched greedy generate, which "
                f"decodes AR: set distill.method=ar (the same responses as {self.method!r}), or distill.batch_size=1"
            )
        if self.dtype == "auto":
            raise ValueError(
                "distill.dtype=auto: use null (bf16 on GPU, fp32 on CPU), float32, bfloat16 or float16"
            )
        check_dtype(self.dtype, "distill.dtype", allow_none=True)


@dataclass
class TrainerConfig:
    """``transformers.TrainingArguments`` values (plus the wall-clock cap); ``extra`` passes any other argument."""

    output_dir: str = MISSING
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    learning_rate: float = 5e-6
    num_train_epochs: float = 1.0
    max_steps: int = -1
    """Stop after this many optimizer steps (-1: run ``num_train_epochs``); the LR schedule ends here."""
    lr_scheduler_type: str = "cosine"
    warmup_steps: float = 0.03
    """Steps, or a fraction of the run when < 1."""
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    optim: str = "adamw_torch"
    group_by_length: bool = False
    """Batch rows of similar length together (transformers' length-grouped sampler, still shuffled): less batch
    padding, so fewer positions computed; the sampler reads every row's length once at start."""
    bf16: bool = False
    activation_checkpointing: bool = False
    """Recompute activations in the backward pass (transformers' new name for gradient checkpointing)."""
    logging_steps: int = 10
    save_steps: int = 500
    """Write a ``checkpoint-N/`` folder every this many optimizer steps (the final model is saved regardless)."""
    save_total_limit: int | None = 2
    """Keep only the newest N ``checkpoint-N/`` folders (``None``: all)."""
    save_only_model: bool = False
    """``checkpoint-N/`` holds the weights only: a fraction of the size (the 32B run's optimizer state is
    ~390 GB per save) but not resumable — a restart begins the stage again. ``False`` keeps optimizer,
    scheduler and RNG states so a killed run resumes where it stopped."""
    seed: int = 42
    dataloader_num_workers: int = 0
    max_minutes: float | None = None
    """Stop (and save) once training has run this many minutes; the cap applies alongside ``max_steps``."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Any other ``TrainingArguments`` field, e.g. ``+trainer.extra.eval_steps=100``."""


class PeftKind(_Choice):
    none = "none"
    lora = "lora"


@dataclass
class PeftConfig:
    """Parameter-efficient fine-tuning (``peft``): ``none`` or LoRA."""

    kind: PeftKind = PeftKind.none
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    train_mask_token: bool = True
    """Train the ``<|mask|>`` embedding row (``trainable_token_indices``) — MARS needs it."""
    # The adapter goes to ``output_dir/adapter`` and the merged model to ``output_dir`` (the checkpoint contract).


@dataclass
class RoundsConfig:
    """On-policy rounds of the proposer (:mod:`prove.train.rounds`, docs/training.md). Round 1 is the recipe's
    own stages (``stage=distill stage.role=proposer`` with ``distill.train=false``, then ``stage=mars``); each round
    r ≥ 2 (``round=r``) relabels ``num_prompts`` prompts no earlier round read with round r − 1's MARS model
    (its greedy outputs: stage distill's generation) into ``<run_dir>/round-r/self-distill``, then continues MARS
    from round r − 1's model on them into ``<run_dir>/round-r/mars`` (its own held-out acceptance curve)."""

    count: int = 1
    """Rounds in all (1: no on-policy round)."""
    num_prompts: int = 400
    """Prompts each round r ≥ 2 relabels."""
    max_steps: int = 40
    """MARS steps each round r ≥ 2 continues for."""
    max_minutes: float | None = None
    """A wall-time cap on each round r ≥ 2's MARS (``None``: the stage's own)."""

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"rounds.count={self.count}: use ≥ 1 (1: no on-policy round)")
        if self.num_prompts < 1 or self.max_steps < 1:
            raise ValueError(
                f"rounds.num_prompts={self.num_prompts}, rounds.max_steps={self.max_steps}: both must be ≥ 1"
            )


class LoggerKind(_Choice):
    none = "none"
    wandb = "wandb"


@dataclass
class LoggerConfig:
    """Experiment tracking; ``WANDB_MODE=offline`` keeps wandb local."""

    kind: LoggerKind = LoggerKind.none
    project: str = "prove"
    name: str | None = None
    group: str | None = None
    entity: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class TrainConfig:
    """One ``prove-train`` run: one stage of one pipeline."""

    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    stage: StageConfig = MISSING
    trainer: TrainerConfig = MISSING
    deepspeed: dict[str, Any] | None = None
    """A DeepSpeed config (JSON-able; ``auto`` where TrainingArguments owns the value), or ``None``."""
    peft: PeftConfig = field(default_factory=PeftConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    """Stage distill's generation and loss settings (ignored by sft and mars)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Stage mars's held-out acceptance (``eval.rows``, ``eval.steps``, ``eval.best``; ignored by sft and distill)."""

    rounds: RoundsConfig = field(default_factory=RoundsConfig)
    """On-policy rounds of the proposer (``rounds.count``, ``rounds.num_prompts``, ``rounds.max_steps``)."""
    round: int = 1
    """The round this run trains: 1 = the recipe's stages as written; r ≥ 2 = round r's relabelling
    (``stage=distill stage.role=proposer``) or MARS (``stage=mars``), in ``<run_dir>/round-r`` (:mod:`prove.train.rounds`)."""
    steps: list[str] = field(default_factory=lambda: ["stage=sft", "stage=mars", "stage=distill"])
    """``make train``'s prove-train runs, in order (``python -m prove.train.recipe``): each the overrides of one
    run; a run of consecutive entries holding ``{round}`` repeats for each round 2..``rounds.count``."""

    run_name: str = "default"
    """Names the run: outputs go to ``runs/<run_name>/<stage>``."""
    run_dir: str = "runs/${run_name}"
    output_dir: str = "${run_dir}/${stage.name}"
    block_size: int = 16
    """K (top-level knob, interpolated into ``stage.block_size``)."""
    max_len: int = 512
    """Longest training example (interpolated into ``data.max_len``)."""
    lr: float = 5e-6
    """Peak learning rate (interpolated into ``trainer.learning_rate``)."""
    epochs: float = 1.0
    """Epochs (interpolated into ``trainer.num_train_epochs``)."""
    max_steps: int = -1
    """Optimizer steps, -1 for whole epochs (interpolated into ``trainer.max_steps``)."""
    resume: bool | None = None
    """``True``: resume from the last checkpoint in ``output_dir`` (error if none); ``None``: resume if one exists; ``False``: start over."""
    force: bool = False
    """Train the stage even though ``output_dir`` holds a finished ``prove.json`` of the same config (which is
    otherwise skipped, :mod:`prove.train.rerun`); it starts over, ignoring the folder's ``checkpoint-*``."""
    cpu_threads: int | None = None
    """OpenMP / intra-op threads of each process. ``None``: when the DeepSpeed config offloads the optimizer to the
    CPU (its Adam step runs there), the node's cores divided by its processes (:mod:`prove.train.threads`);
    otherwise left as the environment set it (``OMP_NUM_THREADS``, which torchrun and the Makefile set to 1). ``0``:
    the node's cores divided by its processes in any case — for a model that trains on the CPU itself (the
    SmolLM2 recipe), where one thread would leave the other cores idle."""
    stages: dict[str, Any] = field(default_factory=dict)
    """Per-stage knob table for recipes, keyed by role, then stage: ``stages.<role>.<stage>.<knob>``, read as
    ``lr: ${stages.${stage.role}.${stage.name}.lr}`` (a knob of all of a role's stages sits beside them, like the
    tiny recipe's ``stages.proposer.layers``). Stage sft runs for either role, so the role comes first."""

    def __post_init__(self) -> None:
        # the cross-field rules have a module of their own (they read the stage registries, some on use)
        from prove.train.config_rules import check_train_config

        check_train_config(self)


def register_configs() -> None:
    """Register the schema, the recipes and the ``${package_file:<package>/<file>}`` resolver (a file shipped inside
    an installed package, :func:`prove.data.gguf.package_file`) with Hydra (idempotent)."""
    OmegaConf.register_new_resolver("package_file", package_file, replace=True)
    OmegaConf.register_new_resolver("round_dir", round_dir, replace=True)
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=schema_node(TrainConfig))
    for name, node in recipe_nodes().items():
        cs.store(group="recipe", name=name, node=node, package="_global_")


def round_dir(run_dir: str, r: int | str) -> str:
    """Round r's folder: ``run_dir`` itself for round 1, ``<run_dir>/round-r`` after it (the recipes'
    ``${round_dir:${run_dir},${rounds.count}}/mars``: the last round's proposer)."""
    r = int(r)
    if r < 1:
        raise ValueError(f"round {r}: rounds count from 1")
    return str(run_dir) if r == 1 else f"{run_dir}/round-{r}"


def recipe_nodes() -> dict[str, Any]:
    """Every ``recipes/*.yaml`` (shipped as ``prove.recipes``), loaded, by name."""
    out = {}
    for entry in sorted(files("prove.recipes").iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".yaml"):
            out[entry.name.removesuffix(".yaml")] = OmegaConf.create(entry.read_text())
    return out


def run_label(cfg: TrainConfig) -> str:
    """The run's name in logs and trackers: ``logger.name``, else ``<run_name>-<stage>``."""
    return cfg.logger.name or f"{cfg.run_name}-{cfg.stage.name}"


def config_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The whole resolved config as plain JSON-able values (for prove.json and the tracker)."""
    out = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True)
    assert isinstance(out, dict)
    return {str(k): v for k, v in out.items()}
