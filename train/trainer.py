"""The Hugging Face Trainer subclasses of the stages — ``MarsTrainer`` (MARS's block-training loss, docs/design.md §2.1),
``DistillTrainer`` (stage distill's CE + top-k KL) — and the wall-clock cap."""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

import torch
from prove.data.chat import IGNORE_INDEX
from prove.decode.engine import end_of_turn_ids
from prove.train import universal
from prove.train.acceptance import AcceptanceSums, allowed_argmax, block_acceptance
from prove.train.losses import distill_loss
from prove.train.mars_step import MarsStep, target_head
from transformers import Trainer, TrainerCallback

log = logging.getLogger(__name__)


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

    Batches hold ``input_ids`` / ``labels`` / ``attention_mask`` ``(B, L)`` with each example a multiple of K long
    (:class:`prove.train.collate.Collator`). ``compute_loss`` is :meth:`prove.train.mars_step.MarsStep.loss` (the step
    composed once for it, ``tools/bench_mars_step.py`` and ``make gpu-check``): it turns them into
    ``[noisy | clean]`` without the noisy blocks before ``(P − 1) // K`` (:func:`prove.train.masks.trimmed_inputs`: they hold
    no target and nothing reads them), builds each example's block attention as ``attention`` (``stage.attention``)
    says — ``auto``: under sdpa the model switches to :mod:`prove.train.attention`'s block attention (the clean
    stream causal on its own, a mask of the noisy rows only), under ``flex_attention`` a FlexAttention
    ``BlockMask``; ``mask``: one float additive 4D mask over the whole input —, runs the decoder and applies the
    head (:func:`prove.train.mars_step.target_head`: a trainable ``<|mask|>`` row's gradient is its own row's) and the
    cross-entropy only at the positions with a target, ``ce_chunk_rows`` at a time
    (:func:`prove.train.losses.head_cross_entropy`); the loss is :func:`prove.train.losses.mars_loss_terms`.

    With an ``eval_dataset``, :meth:`evaluate` scores it in the same teacher-forced passes and logs the simulated
    acceptance of :mod:`prove.train.acceptance` (``eval_tpc_k{K′}``, ``eval_accept_d{d}``, ...).
    """

    term_names = ("loss_noisy", "loss_clean")

    def __init__(
        self,
        *args: Any,
        mask_token_id: int,
        block_size: int,
        ar_weight: float = 1.0,
        ce_chunk_rows: int | None = None,
        depth_decay: float = 1.0,
        eval_batch_size: int | None = None,
        eval_tau: float = 0.95,
        attention: str = "auto",
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.step = MarsStep.for_model(
            self.model, attention, mask_token_id, block_size,
            ar_weight=ar_weight, ce_chunk_rows=ce_chunk_rows, depth_decay=depth_decay, cache_masks=True,
        )  # fmt: skip
        """The step (:class:`prove.train.mars_step.MarsStep`: the masks kept per batch layout); the model is switched to the
        block attention when that is the one :func:`prove.train.attention.mars_attention_impl` picks."""
        self.eval_batch_size = eval_batch_size or self.args.per_device_train_batch_size
        self.eval_tau = eval_tau
        self._allowed: torch.Tensor | None = None
        self.last_acceptance: AcceptanceSums | None = None
        """The counts behind the last :meth:`evaluate`'s acceptance metrics (summed over ranks)."""

    # -- the training step ---------------------------------------------------------------------------------------

    @property
    def attention_impl(self) -> str | None:
        """The attention the step's mask is built for (:func:`prove.train.attention.mars_attention_impl`)."""
        return self.step.impl

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = self.step.loss(model, self.accelerator.unwrap_model(model), inputs).terms
        self._record(out.noisy, out.clean)
        return (out.loss, None) if return_outputs else out.loss

    # -- acceptance while training -------------------------------------------------------------------------------

    def train(self, *args: Any, **kwargs: Any):
        """Train, then score the eval set once more unless the last step was just scored; with
        ``metric_for_best_model`` set (``eval.best``), end holding the best-scoring weights: the final ones when
        they score best, else the best ``checkpoint-N`` loaded back (its adapter, with LoRA)."""
        self._train_start = time.perf_counter()
        out = super().train(*args, **kwargs)
        if self.eval_dataset is None:
            return out
        state = self.state
        if not any(h.get("step") == state.global_step and "eval_blocks" in h for h in state.log_history):
            metrics = self.evaluate()
            self._determine_best_metric(metrics, None)
        best = state.best_model_checkpoint
        if (
            self.args.metric_for_best_model
            and state.best_global_step != state.global_step
            and best is not None
        ):
            log.info(
                "eval.best: the stage's output is %s (%s = %s)",
                best,
                self.args.metric_for_best_model,
                state.best_metric,
            )
            # written by another number of processes (before a world-size resume): loaded as a universal checkpoint
            engine = self.model_wrapped if self.is_deepspeed_enabled else None
            with universal.loading(engine, best, self.args.world_size, self.args.process_index):
                self._load_best_model()
        return out

    def eval_record(self) -> dict[str, Any] | None:
        """What prove.json keeps of the eval (None without one): ``history`` (every ``eval_*`` log, with its step),
        ``output`` (the scores of the weights the stage writes) and ``best`` (``eval.best``'s pick, or None)."""
        history = [h for h in self.state.log_history if "eval_blocks" in h]
        if not history:
            return None
        output = history[-1]
        best = None
        if self.args.metric_for_best_model:
            step = self.state.best_global_step
            output = next((h for h in history if h.get("step") == step), output)
            best = {
                "metric": self.args.metric_for_best_model,
                "value": self.state.best_metric,
                "step": step,
                "checkpoint": self.state.best_model_checkpoint if step != self.state.global_step else None,
            }
        return {"history": history, "output": output, "best": best}

    def evaluate(
        self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        """Simulated acceptance on the eval set (:mod:`prove.train.acceptance`), logged as ``eval_*``.

        Each rank scores rows ``rank::world`` in the same number of forwards (a rank out of rows runs one whose
        counts it drops), so ZeRO-3's collectives line up; the counts are summed over ranks."""
        dataset: Any = (
            self.eval_dataset if eval_dataset is None else eval_dataset
        )  # rows: a Sequence or a Dataset
        assert dataset is not None, "evaluate() needs an eval set (eval.rows)"
        model = self.model_wrapped
        was_training = model.training
        model.eval()
        world, rank = self.args.world_size, self.args.process_index
        mine = list(range(rank, len(dataset), world))
        per_rank = -(-len(dataset) // world)
        bs = self.eval_batch_size
        total: torch.Tensor | None = None
        losses = torch.zeros(
            4, dtype=torch.float64, device=self.args.device
        )  # (loss, noisy, clean, 1) · seqs
        with torch.no_grad():
            for start in range(0, per_rank, bs):
                idx = mine[start : start + bs]
                batch = self._prepare_inputs(self.data_collator([dataset[i] for i in (idx or [0])]))
                sums, terms = self._eval_batch(model, batch)
                vec = sums.as_tensor().to(self.args.device)
                if (
                    not idx
                ):  # a rank out of rows: its forward ran for the collectives, its counts do not count
                    vec, terms = vec * 0, terms * 0
                total = vec if total is None else total + vec
                losses += terms
        assert total is not None
        total = self.accelerator.reduce(total, reduction="sum")
        losses = self.accelerator.reduce(losses, reduction="sum")
        if was_training:
            model.train()
        self.last_acceptance = AcceptanceSums.from_tensor(total.cpu())
        summary = self.last_acceptance.summary()
        n_seq = max(float(losses[3]), 1.0)
        metrics = {f"{metric_key_prefix}_{k}": round(v, 4) for k, v in summary.items()}
        metrics[f"{metric_key_prefix}_loss"] = round(float(losses[0]) / n_seq, 4)
        metrics[f"{metric_key_prefix}_loss_noisy"] = round(float(losses[1]) / n_seq, 4)
        metrics[f"{metric_key_prefix}_loss_clean"] = round(float(losses[2]) / n_seq, 4)
        began = getattr(self, "_train_start", None)
        if began is not None:  # wall minutes since this launch began training: the curves' CPU-time axis
            metrics[f"{metric_key_prefix}_minutes"] = round((time.perf_counter() - began) / 60, 2)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def _eval_batch(self, model, batch) -> tuple[AcceptanceSums, torch.Tensor]:
        """One teacher-forced pass: the acceptance sums, and the loss terms and 1, × the batch's sequences with a
        target ``(4,)``."""
        labels = batch["labels"]
        bsz, length = labels.shape
        unwrapped = self.accelerator.unwrap_model(model)
        at = self.step.targets(model, unwrapped, batch)
        hidden, targets, rows, cols, x, noisy = at.hidden, at.targets, at.rows, at.cols, at.inputs, at.noisy
        head = target_head(unwrapped.get_output_embeddings())
        chunk = self.step.ce_chunk_rows or max(1, hidden.shape[0])
        ce, pred, conf = [], [], []
        for i in range(0, hidden.shape[0], chunk):
            logits = head(hidden[i : i + chunk]).float()  # (n_chunk, V)
            ce.append(torch.nn.functional.cross_entropy(logits, targets[i : i + chunk], reduction="none"))
            p, c = allowed_argmax(logits, self._allowed_ids(logits.shape[-1], logits.device))
            pred.append(p)
            conf.append(c)
        ce_t, pred_t, conf_t = torch.cat(ce), torch.cat(pred), torch.cat(conf)
        terms = self.step.loss_terms(ce_t, labels, at)
        n_seq = int((labels != IGNORE_INDEX).any(dim=1).sum())
        # back to stream positions: clean column N + j is clean j, noisy column c is noisy stream index p
        p = x.stream_index[rows, cols]  # (n,) < L: only real positions carry targets
        clean_pred = torch.full((bsz, length), -1, dtype=torch.long, device=labels.device)
        noisy_pred, noisy_conf = clean_pred.clone(), torch.zeros((bsz, length), device=labels.device)
        clean_pred[rows[~noisy], p[~noisy]] = pred_t[~noisy]
        noisy_pred[rows[noisy], p[noisy]] = pred_t[noisy]
        noisy_conf[rows[noisy], p[noisy]] = conf_t[noisy]
        sums = block_acceptance(
            clean_pred,
            noisy_pred,
            noisy_conf,
            labels,
            self.step.block_size,
            self._stop_ids(),
            self.eval_tau,
        )
        vec = (
            torch.stack([terms.loss, terms.noisy, terms.clean, torch.ones_like(terms.loss)]).double() * n_seq
        )
        return sums, vec.to(self.args.device)

    def _allowed_ids(self, vocab: int, device) -> torch.Tensor:
        """``(V,)`` True on the ids decoding may output (:func:`prove.decode.decoder.allowed_ids`)."""
        if self._allowed is None or self._allowed.numel() != vocab:
            from prove.decode.decoder import allowed_ids

            limit, excluded = allowed_ids([vocab], self.processing_class, [self.step.mask_token_id])
            allowed = torch.zeros(vocab, dtype=torch.bool)
            allowed[:limit] = True
            allowed[list(excluded)] = False
            self._allowed = allowed
        return self._allowed.to(device)

    def _stop_ids(self) -> list[int]:
        """The end-of-turn ids, as decoding stops (:func:`prove.decode.engine.end_of_turn_ids`)."""
        model = self.accelerator.unwrap_model(self.model)
        generation = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        return end_of_turn_ids(generation, getattr(self.processing_class, "eos_token_id", None))


class EvalCallback(TrainerCallback):
    """Scores the eval set every ``steps`` optimizer steps (MarsTrainer.evaluate; the Trainer's own eval strategy
    stays off, so a stage without an eval set needs no eval arguments)."""

    def __init__(self, steps: int):
        self.steps = steps

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.steps == 0:
            control.should_evaluate = True
        return control


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


class CadenceCallback(TrainerCallback):
    """Logs, evaluates and saves on this launch's ``logging_steps`` / ``eval_steps`` / ``save_steps``, also after a
    resume. transformers reads the three from the checkpoint's ``trainer_state.json`` when it resumes (and only warns
    that the arguments differ), so a resumed stage would keep the first launch's cadence: with ``eval.best`` and a new
    ``eval.steps``/``trainer.save_steps`` whose multiples transformers checked at start, the best-scoring step could
    then have no checkpoint to load at the end. The rerun rule (:mod:`prove.train.rerun`) lets the cadence change
    on a resume (it does not change the trained model); this makes the change take effect."""

    def on_train_begin(self, args, state, control, **kwargs):
        state.compute_steps(args, state.max_steps)


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
