"""``python -m prove.recipes.gpu_check`` (``make gpu-check``): proves the GPU path and measures what decides speed.

One command, one report (``gpu-check.json``, ``gpu-check.md``, ``cost_curve.png`` in ``--out``), in a few
minutes on one CUDA GPU. Every model is a random-weight Qwen2 of a real shape built in-process
(``prove.decode.random_models``): nothing is downloaded, so it runs on a machine without internet.

1. **train** (:mod:`~prove.recipes.gpu_check.training`) — a few MARS steps (``prove.train.masks`` /
   ``prove.train.losses``, the inputs, mask and loss that ``MarsTrainer`` uses) on a Qwen2.5-0.5B-shaped model
   in bf16, once with the FlexAttention ``BlockMask`` (``attn_implementation="flex_attention"``: transformers
   compiles ``flex_attention``) and once with the dense float additive mask (sdpa), from the same weights on
   the same batches. Checks: the first step's losses agree to bf16 tolerance, every gradient is finite;
   reports tokens/s and peak memory.
2. **decode** (:mod:`~prove.recipes.gpu_check.decoding`) — ar, prove-lossless unfused and fused, greedy sd,
   and sampling sd / nsd run through :class:`prove.decode.Decoder` on the device. In fp32 the lossless methods
   must equal transformers' greedy ``generate`` token for token; in bf16 their agreement with ``generate``
   (bf16 too) is reported (batch-shape-dependent numerics can flip near-ties).
3. **curve** (:mod:`~prove.recipes.gpu_check.curve`) — the cost curve t(w): the latency of one engine pass
   (``ModelRunner.forward``) of w tokens on a warm KV cache of 512 tokens, w = 1, 2, 4, …, 256 and every wider
   width the prediction reads, for Qwen2.5-0.5B/3B/7B/32B shapes in bf16, timed with CUDA events after
   warm-up. A shape that does not fit the GPU's free memory is skipped, and the report says so.

From t(w) and per-depth acceptance rates (the demo's, shipped in ``gpu_check_acceptance.json``;
``--acceptance bench.json`` takes a ``prove-bench`` report of your own model and task),
:mod:`~prove.recipes.gpu_check.predict` predicts the speedup over AR of prove-lossless (unfused and fused),
prove (with a 3B-shaped verifier) and sd at k = 5 (with a 0.5B-shaped draft). The report
(:mod:`~prove.recipes.gpu_check.report`) and the command line (:mod:`~prove.recipes.gpu_check.cli`) close it;
:mod:`~prove.recipes.gpu_check.config` holds the shapes and every knob.

``--tiny`` runs the same code on CPU with tiny shapes in seconds (the test suite runs it, so the check
cannot rot). Without ``--tiny`` the check needs CUDA: on a machine without it, it says so in one line and
exits with status 2. It exits 1 when a check fails (the report still gets written) and 0 otherwise.

Imports: torch, transformers, and ``prove.decode`` / ``prove.train.masks`` / ``prove.train.losses``, which
need nothing more; matplotlib is optional (without it the plot is skipped, with a note). No hydra,
deepspeed, datasets, accelerate. So a GPU machine with torch and transformers runs it after
``pip install --no-deps --no-build-isolation -e .`` (or with no install at all: ``make gpu-check``).
"""

from prove.recipes.gpu_check.cli import main, parse_args, run
from prove.recipes.gpu_check.config import ALL_PARTS, PARTS, PIPELINE_STAGES, SHAPES, CheckConfig, tiny_config
from prove.recipes.gpu_check.curve import fits, run_curve, time_widths
from prove.recipes.gpu_check.decoding import DecodeSpec, decode_specs, run_decode
from prove.recipes.gpu_check.pipeline import run_pipeline
from prove.recipes.gpu_check.predict import (
    block_sizes_for,
    curve_widths,
    fused_width,
    interp,
    load_acceptance,
    predict,
    prediction_widths,
    predictor_check,
)
from prove.recipes.gpu_check.report import render_md, write_plot
from prove.recipes.gpu_check.training import run_train

__all__ = [
    "ALL_PARTS",
    "PARTS",
    "PIPELINE_STAGES",
    "SHAPES",
    "CheckConfig",
    "DecodeSpec",
    "block_sizes_for",
    "curve_widths",
    "decode_specs",
    "fits",
    "fused_width",
    "interp",
    "load_acceptance",
    "main",
    "parse_args",
    "predict",
    "prediction_widths",
    "predictor_check",
    "render_md",
    "run",
    "run_curve",
    "run_decode",
    "run_pipeline",
    "run_train",
    "time_widths",
    "tiny_config",
    "write_plot",
]
