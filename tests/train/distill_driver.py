"""Run under ``torchrun --nproc_per_node 2``: stage distill's generation across the ranks (gloo on CPU), as the
pipeline runs it — process group first, each rank its slice, the wait for every rank, the set built by rank 0.

    torchrun --nproc_per_node 2 tests/train/distill_driver.py CRASH_RANK CRASH_AFTER override=value ...

CRASH_RANK ≥ 0 kills that rank (``os._exit``, no cleanup, as a node failure would) after it has flushed
CRASH_AFTER records; the launcher then tears the other rank down wherever it is.
"""

from __future__ import annotations

import os
import sys

import torch
from prove.train import distill

from tests.train.helpers import train_config


def main() -> None:
    crash_rank, crash_after, overrides = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    cfg = train_config(overrides)
    rank, world = distill.init_distributed()
    assert world == 2 and torch.distributed.is_initialized() and torch.distributed.get_backend() == "gloo"
    written = []

    def on_record(rec):
        written.append(rec["index"])
        if rank == crash_rank and len(written) >= crash_after:
            os._exit(3)

    distill.generate_responses(cfg, progress=False, on_record=on_record)
    distill.wait_for_all_ranks()
    if rank == 0:
        distill.build_generated_set(cfg.distill.generated_dir)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()  # as prove-train does (prove.train.cli.close_process_group)


if __name__ == "__main__":
    main()
