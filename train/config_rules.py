"""The cross-field rules of a ``prove-train`` config (:class:`prove.train.config.TrainConfig`), checked when the
dataclasses are built (``OmegaConf.to_object``): each broken rule is a ``ValueError`` that says what to change.
One function a topic — the launch, stage mars's block layout, stage distill, the held-out eval, the model source —
called in that order by :func:`check_train_config`."""

from __future__ import annotations

from prove.train.config import PeftKind, Role, Stage, TrainConfig

MARS_ATTENTION = ("sdpa", "flex_attention", "eager")
"""Attention implementations that apply stage mars's block mask (a float 4D mask, or a FlexAttention BlockMask);
flash_attention_2/3 and paged kernels take only a padding mask."""


def greedy_exact_methods() -> list[str]:
    """Decoding methods whose greedy output is exactly the model's own AR output with no second model: what
    distillation may decode the proposer's responses with. Read from the decode registry's facts
    (``Method.is_lossless``, ``needs_verifier``, ``needs_draft``); imported on use, as it pulls in torch."""
    from prove.decode.methods import METHODS

    return [
        name
        for name, m in METHODS.items()
        if m.is_lossless(m.defaults) and not (m.needs_verifier or m.needs_draft)
    ]


def check_train_config(cfg: TrainConfig) -> None:
    """Every rule below, in order; the first broken one raises."""
    check_launch(cfg)
    check_mars(cfg)
    check_lengths(cfg)
    check_distill(cfg)
    check_eval(cfg)
    check_model_source(cfg)


def check_launch(cfg: TrainConfig) -> None:
    """The recipe's ``stages`` table, ``force`` against ``resume``, ``cpu_threads``."""
    roles = {str(r) for r in Role}
    if set(cfg.stages) - roles:
        key = sorted(set(cfg.stages) - roles)[0]
        raise ValueError(
            f"stages.{key}: a recipe's stages table is keyed by role, then stage — "
            f"stages.<{'|'.join(sorted(roles))}>.<stage>.<knob>, e.g. stages.verifier.distill.init_from"
        )
    if cfg.force and cfg.resume is True:
        raise ValueError(
            "force=true trains the stage again from its first step, resume=true resumes it: drop one of them"
        )
    if cfg.cpu_threads is not None and cfg.cpu_threads < 0:
        raise ValueError(
            f"cpu_threads={cfg.cpu_threads}: use ≥ 1, 0 (the node's cores shared by its processes) or null "
            "(sized so only when the optimizer is offloaded)"
        )


def check_mars(cfg: TrainConfig) -> None:
    """Stage mars: an attention that applies its block mask, and the proposer's role."""
    if cfg.stage.name != Stage.mars:
        return
    if cfg.model.attn_implementation not in MARS_ATTENTION:
        raise ValueError(
            f"model.attn_implementation={cfg.model.attn_implementation!r} ignores the 4D block mask that "
            "stage mars trains with (every position would see the clean stream's future): use "
            "model.attn_implementation=sdpa, or flex_attention on a GPU (a sparse BlockMask)"
        )
    if cfg.stage.role == Role.verifier:
        raise ValueError(
            "stage=mars trains the block proposer: drop stage.role=verifier (the verifier is a plain AR "
            "model: stage=sft stage.role=verifier, or stage=distill)"
        )


def check_lengths(cfg: TrainConfig) -> None:
    """K (``block_size``) against ``max_len``."""
    k, max_len = cfg.stage.block_size, cfg.data.max_len
    mars = cfg.stage.name == Stage.mars
    if k < 1:
        raise ValueError(f"block_size={k}: K must be ≥ 1 (MARS uses 4–16); pass block_size=<K>")
    if mars and k > max_len:
        raise ValueError(f"block_size={k} exceeds max_len={max_len}: lower block_size or raise max_len")
    if max_len < 2:
        raise ValueError(f"max_len={max_len}: an example needs at least a prompt and one response token")
    if mars and max_len % k:
        # The collator pads each example to a multiple of K with EOS *labelled* as a target. A row
        # right-truncated at max_len has no EOS of its own: padding it would teach an EOS in mid-answer.
        # With max_len a multiple of K a truncated row already ends on a block boundary.
        lower, upper = max_len // k * k, -(-max_len // k) * k
        raise ValueError(
            f"max_len={max_len} is not a multiple of block_size={k}: rows truncated at max_len would be "
            f"padded with EOS labels inside the answer; use max_len={lower or upper} or max_len={upper}"
        )


def check_distill(cfg: TrainConfig) -> None:
    """Stage distill: a method whose greedy output is the proposer's own (here, not in ``DistillConfig``: the
    registry is read only when used); training it, the verifier's role and a verifier to start from."""
    if cfg.stage.name != Stage.distill:
        return
    exact = greedy_exact_methods()
    if cfg.distill.method not in exact:
        raise ValueError(
            f"distill.method={cfg.distill.method!r}: the responses must be the proposer's own greedy "
            f"output; use one of {exact} (prove-lossless is the fast one)"
        )
    if not cfg.distill.train:
        return
    if cfg.stage.role != Role.verifier:
        raise ValueError(
            "stage=distill trains the verifier: drop stage.role=proposer (or set distill.train=false to "
            "only generate the proposer's responses as data)"
        )
    if cfg.stage.init_from is None and cfg.model.name_or_path is None:
        raise ValueError(
            "stage=distill fine-tunes an existing verifier: set stage.init_from=<verifier checkpoint or hub id> "
            "(ProVe: Qwen/Qwen2.5-0.5B-Instruct; the tiny recipe: runs/tiny/verifier-sft)"
        )


def check_eval(cfg: TrainConfig) -> None:
    """The held-out eval: its K, and ``eval.best``'s checkpoints."""
    k = cfg.stage.block_size
    if cfg.eval.block_size is not None and cfg.eval.block_size > k:
        raise ValueError(
            f"eval.block_size={cfg.eval.block_size} is above the trained K = {k}: decoding never uses more; "
            f"set eval.block_size ≤ {k} (or null for K)"
        )
    if not cfg.eval.best:
        return
    steps, save = cfg.eval.steps or cfg.trainer.save_steps, cfg.trainer.save_steps
    if steps % save:
        raise ValueError(
            f"eval.best picks among saved checkpoints, but eval.steps={steps} scores steps that "
            f"trainer.save_steps={save} does not save: set eval.steps to a multiple of {save} (or drop it)"
        )
    if cfg.deepspeed is not None and cfg.trainer.save_only_model:
        raise ValueError(
            "eval.best reloads the best checkpoint-N into the DeepSpeed engine, which needs its engine state: "
            "set trainer.save_only_model=false (or drop eval.best)"
        )


def check_model_source(cfg: TrainConfig) -> None:
    """What LoRA and ``model.num_layers`` need: a loaded (pretrained) model."""
    loaded = cfg.stage.init_from is not None or cfg.model.name_or_path is not None
    if cfg.peft.kind == PeftKind.lora and not loaded:
        raise ValueError(
            "peft=lora adapts a pretrained model, and the merged checkpoint is rebuilt from it: set "
            "model.name_or_path=<hub id or dir> or stage.init_from=<checkpoint> (or drop peft=lora)"
        )
    if cfg.model.num_layers is not None:
        if cfg.model.num_layers < 1:
            raise ValueError(
                f"model.num_layers={cfg.model.num_layers}: keep at least 1 layer, or null for all"
            )
        if not loaded:
            raise ValueError(
                "model.num_layers cuts a loaded model: set model.name_or_path / stage.init_from, or size a "
                "from-scratch model with model.scratch.layers"
            )
