"""Run under ``torchrun --nproc_per_node 2``: one mars stage with DeepSpeed ZeRO-3 on CPU (gloo), then the
in-memory (still partitioned) model's logits on a fixed input, saved by rank 0 for the test to compare, with the
process's CPU thread count and whether DeepSpeed ran the optimizer on the CPU.

    torchrun --nproc_per_node 2 tests/train/zero3_driver.py OUT.pt [--best-at=STEP] [--probe] override=value ...

``--best-at=STEP`` scripts the eval score (``eval_tpc_k4``) to peak at STEP, so ``eval.best`` must reload that
checkpoint into the engine. ``--probe`` records the loss on a fixed batch at the end of every step, of the stage's
final model, and, in a resumed run, right after the resume has loaded (before its first step), with the optimizer's
full state then (``deepspeed.utils.safe_get_full_optimizer_state``: each parameter's moments, its step counts).
"""

from __future__ import annotations

import os
import sys

import torch
from prove.train.pipeline import train

from tests.train.helpers import train_config


def script_best(step: int) -> None:
    """Every eval's ``eval_tpc_k4`` becomes 1 + (5 at ``step``, else 0), logged and returned alike."""
    from prove.train.trainer import MarsTrainer

    real = MarsTrainer.evaluate

    def scored(self, *args, **kwargs):
        metrics = real(self, *args, **kwargs)
        value = 6.0 if self.state.global_step == step else 1.0
        metrics["eval_tpc_k4"] = self.state.log_history[-1]["eval_tpc_k4"] = value
        return metrics

    MarsTrainer.evaluate = scored


PROBED: dict = {}


def fixed_batch_loss(model) -> float:
    """The causal-LM loss of ``model`` (every rank takes part under ZeRO-3) on one fixed batch, in eval mode."""
    was_training = model.training
    model.eval()
    x = torch.arange(3, 35).view(2, 16)
    with torch.no_grad():
        loss = float(model(input_ids=x, labels=x).loss)
    model.train(was_training)
    return loss


def probe() -> None:
    """Record into :data:`PROBED` what ``--probe`` says."""
    from deepspeed.utils import safe_get_full_optimizer_state
    from prove.train.trainer import MarsTrainer
    from transformers import TrainerCallback

    class Probe(TrainerCallback):
        def __init__(self, trainer):
            self.trainer = trainer

        def on_train_begin(self, args, state, control, **kwargs):
            if state.global_step == 0:
                return
            model = self.trainer.model
            PROBED["resumed_at"] = state.global_step
            PROBED["loss_after_load"] = fixed_batch_loss(model)
            PROBED["moments"] = {
                name: {
                    k: safe_get_full_optimizer_state(p, k).cpu().clone() for k in ("exp_avg", "exp_avg_sq")
                }
                for name, p in model.named_parameters()
                if p.requires_grad
            }
            inner = self.trainer.model_wrapped.optimizer.optimizer  # the torch optimizer under ZeRO's
            PROBED["optimizer_steps"] = sorted({int(s["step"]) for s in inner.state.values() if "step" in s})

        def on_step_end(self, args, state, control, **kwargs):
            PROBED.setdefault("loss_at_step", {})[state.global_step] = fixed_batch_loss(self.trainer.model)

    real_init = MarsTrainer.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.add_callback(Probe(self))

    MarsTrainer.__init__ = init


def main() -> None:
    out, overrides = sys.argv[1], sys.argv[2:]
    while overrides and overrides[0].startswith("--"):
        flag = overrides.pop(0)
        if flag == "--probe":
            probe()
        else:
            assert flag.startswith("--best-at="), flag
            script_best(int(flag.split("=", 1)[1]))
    res = train(train_config(overrides))
    model = res.model
    if PROBED:
        PROBED["final_loss"] = fixed_batch_loss(model)
    model.eval()
    x = torch.arange(3, 23).view(2, 10)
    with torch.no_grad():
        logits = model(input_ids=x).logits  # every rank takes part: ZeRO-3 gathers each layer's weights
    if torch.distributed.get_rank() == 0:
        torch.save(
            {
                "input_ids": x,
                "logits": logits,
                "global_step": res.global_step,
                "world_size": torch.distributed.get_world_size(),
                "logs": [h for h in res.log_history if "loss" in h],
                "evals": [h for h in res.log_history if "eval_blocks" in h],
                "threads": torch.get_num_threads(),
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                "cpu_offload": bool(model.zero_cpu_offload()),
                **PROBED,
            },
            out,
        )
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()  # as prove-train does (prove.train.cli.close_process_group)


if __name__ == "__main__":
    main()
