"""Run under ``torchrun --nproc_per_node 2``: one mars stage with DeepSpeed ZeRO-3 on CPU (gloo), then the
in-memory (still partitioned) model's logits on a fixed input, saved by rank 0 for the test to compare, with the
process's CPU thread count and whether DeepSpeed ran the optimizer on the CPU.

    torchrun --nproc_per_node 2 tests/train/zero3_driver.py OUT.pt [--best-at=STEP] override=value ...

``--best-at=STEP`` scripts the eval score (``eval_tpc_k4``) to peak at STEP, so ``eval.best`` must reload that
checkpoint into the engine.
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


def main() -> None:
    out, overrides = sys.argv[1], sys.argv[2:]
    if overrides and overrides[0].startswith("--best-at="):
        script_best(int(overrides.pop(0).split("=", 1)[1]))
    res = train(train_config(overrides))
    model = res.model
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
            },
            out,
        )
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
