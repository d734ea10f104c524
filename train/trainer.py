"""The Hugging Face Trainer subclasses of the stages — ``MarsTrainer`` (MARS's block-training loss, docs/design.md §2.1),
``DistillTrainer`` (stage distill's CE + top-k KL) — and the wall-clock cap."""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch
from prove.train.losses import distill_loss, mars_loss
from prove.train.masks import block_inputs, mars_attention_mask
from transformers import Trainer, TrainerCallback


class TermLogTrainer(Trainer):
    """A Trainer whose loss is a weighted sum of two terms, logged beside ``loss`` under ``term_names``.

    Its ``compute_loss`` returns a per-micro-batch mean and runs the forward itself (no
    ``compute_loss_func``, which transformers multiplies by the number of processes on the assumption that
    the loss was divided by the global token count). The terms stay on the device until ``log``, so
    logging costs no per-step synchronisation.
    """

    # A per-micro-batch mean: the Trainer divides it by the gradient-accumulation steps.
    loss_is_scaled_for_ga = False
    term_names: tuple[str, str] = ("loss_a", "loss_b")

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._terms: torch.Tensor | None = None  # running (term a, term b, micro-batches)

    def _record(self, a: torch.Tensor, b: torch.Tensor) -> None:
        row = torch.stack([a.detach().float(), b.detach().float(), torch.ones((), device=a.device)])
        self._terms = row if self._terms is None else self._terms + row

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "loss" in logs and self._terms is not None:
            a, b, n = self._terms.tolist()
            logs[self.term_names[0]] = round(a / n, 4)
            logs[self.term_names[1]] = round(b / n, 4)
            self._terms = None
        super().log(logs, *args, **kwargs)


class MarsTrainer(TermLogTrainer):
    """Trains an ordinary causal LM to fill K placeholders in one pass.

    Batches hold ``input_ids`` / ``labels`` ``(B, L)`` with L a multiple of K (see
    :class:`prove.train.collate.Collator`). ``compute_loss`` turns them into the 2L input
    ``[noisy | clean]`` with position ids ``[0..L-1, 0..L-1]`` and the block attention mask, runs the
    forward and returns :func:`prove.train.losses.mars_loss`.
    The mask is a float additive 4D tensor for eager/sdpa, or a FlexAttention ``BlockMask`` when the
    model runs ``attn_implementation="flex_attention"``.
    """

    term_names = ("loss_noisy", "loss_clean")

    def __init__(
        self, *args: Any, mask_token_id: int, block_size: int, ar_weight: float = 1.0, **kwargs: Any
    ):
        super().__init__(*args, **kwargs)
        self.mask_token_id = mask_token_id
        self.block_size = block_size
        self.ar_weight = ar_weight
        self._masks: dict[tuple, Any] = {}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        ids, labels = inputs["input_ids"], inputs["labels"]  # (B, L)
        x, pos = block_inputs(ids, labels, self.mask_token_id)  # (B, 2L) each
        mask = self._attention_mask(model, ids.shape[1], ids.device)
        outputs = model(input_ids=x, position_ids=pos, attention_mask=mask, use_cache=False)
        out = mars_loss(outputs.logits, labels, self.ar_weight)  # logits (B, 2L, V)
        self._record(out.noisy, out.clean)
        return (out.loss, outputs) if return_outputs else out.loss

    def _attention_mask(self, model, length: int, device: torch.device):
        unwrapped = self.accelerator.unwrap_model(model)
        impl = getattr(unwrapped.config, "_attn_implementation", None)
        dtype = unwrapped.get_input_embeddings().weight.dtype
        key = (length, impl, dtype, str(device))
        if key not in self._masks:
            if len(self._masks) > 64:
                self._masks.clear()
            self._masks[key] = mars_attention_mask(impl, length, self.block_size, dtype, device)
        return self._masks[key]


class DistillTrainer(TermLogTrainer):
    """The Hugging Face Trainer with :func:`prove.train.losses.distill_loss` (CE on the response + kl_weight ×
    top-k KL to the proposer; stage distill, docs/design.md §2.3)."""

    term_names = ("loss_ce", "loss_kl")

    def __init__(self, *args: Any, kl_weight: float = 0.0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.kl_weight = kl_weight

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False
        )
        out = distill_loss(
            outputs.logits,
            inputs["labels"],
            inputs.get("topk_ids"),
            inputs.get("topk_logprobs"),
            self.kl_weight,
        )
        self._record(out.ce, out.kl)
        return (out.loss, outputs) if return_outputs else out.loss


class WallClockCallback(TrainerCallback):
    """Stops training (and saves) once it has run ``max_minutes``; the step cap still applies.

    Under several processes rank 0's clock decides, broadcast every step, so all ranks stop together. A run the
    cap cuts short of its step count warns, and says so in :attr:`stopped_early` (which the stage's result and
    its ``prove.json`` carry): a checkpoint trained for a fraction of its steps decodes worse, and nothing else in
    it shows that.
    """

    def __init__(self, max_minutes: float, setting: str = "trainer.max_minutes"):
        self.max_seconds = max_minutes * 60.0
        self.setting = setting
        """The override that raises the cap (named in the warning when it cuts a run short)."""
        self.start: float | None = None
        self.stopped_at_step: int | None = None
        self.max_steps: int | None = None
        """The run's step count (the Trainer's ``max_steps``, from the epochs when none was set) when it stopped."""

    @property
    def stopped_early(self) -> dict[str, Any] | None:
        """``{"reason": "max_minutes", "step", "max_steps", "max_minutes", "setting"}`` when the cap stopped
        training before its last step; None when it ran all its steps (or the cap struck at the last one)."""
        if self.stopped_at_step is None or self.max_steps is None or self.stopped_at_step >= self.max_steps:
            return None
        return {
            "reason": "max_minutes",
            "step": self.stopped_at_step,
            "max_steps": self.max_steps,
            "max_minutes": self.max_seconds / 60,
            "setting": self.setting,
        }

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        assert self.start is not None
        over = torch.tensor([float(time.monotonic() - self.start > self.max_seconds)])
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            if torch.distributed.get_backend() == "nccl":
                over = over.cuda()
            torch.distributed.broadcast(over, src=0)
        if over.item() > 0:
            self.stopped_at_step = state.global_step
            self.max_steps = state.max_steps
            control.should_training_stop = True
            control.should_save = True
            if state.global_step < state.max_steps and state.is_world_process_zero:
                # said out loud: a checkpoint cut short by the clock decodes worse, and nothing else shows it
                warnings.warn(
                    f"training stopped by its wall-clock cap (max_minutes={self.max_seconds / 60:g}) at step "
                    f"{state.global_step} of {state.max_steps}: the checkpoint is under-trained. Raise "
                    f"{self.setting}, or run it on a less busy machine.",
                    stacklevel=2,
                )
        return control
