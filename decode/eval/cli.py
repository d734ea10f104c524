"""``prove-eval``: task accuracy of a decoding method against AR, through lm-evaluation-harness.

Two front doors:

* ``prove-eval model=PATH method=prove verifier=PATH theta=0.1 tasks=[gsm8k,bbh] output=DIR`` (Hydra,
  ``conf/eval.yaml``, every key overridable) runs the baseline (``ar``) and the method on the same tasks in
  one process and prints ProVe's results table: rows = task metrics, columns AR accuracy, method accuracy,
  Δ points, tokens per cycle, wall time and speedup. It writes ``DIR/<method>/results.json`` (lm-eval's
  results), ``DIR/prove_stats.json`` (decode statistics) and ``DIR/comparison.{json,md}``.
* ``prove-eval ... backend=vllm`` runs both through lm-eval's own ``vllm`` model instead, with the method's
  speculative config (``prove.decode.vllm.backend``): every request batched, for accuracy at scale.
* ``prove-eval lm-eval <lm-eval arguments>`` is lm-eval's own CLI with the ``prove`` model registered:
  ``prove-eval lm-eval --model prove --model_args model=PATH,method=ar --tasks gsm8k``. (The stock
  ``lm_eval`` command cannot find plugin models: lm-eval 0.4.13 has no discovery hook for them.)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from prove.common.schema import schema_node
from prove.data.loading import check_dtype
from prove.decode.config import BACKENDS, DecodeParams, VllmOptions


@dataclass
class EvalConfig(DecodeParams):
    """``prove-eval``: the method and the baseline over lm-eval tasks, side by side.

    Launch: ``prove-eval model=PATH method=prove verifier=PATH theta=0.1 tasks=[prove_arith] output=DIR``.
    """

    model: str = "???"
    """Checkpoint of the model being accelerated (block proposer, or the SD target). Log-likelihood tasks score it."""
    verifier: str | None = None
    """ProVe's small scorer (method=prove)."""
    draft: str | None = None
    """The SD family's small AR proposer."""
    method: str = "prove-lossless"
    """The method under test (a name from ``prove.decode.methods``)."""
    baseline: str = "ar"
    """The reference it is compared with, run on the same tasks in the same process."""
    tasks: list[str] = field(default_factory=lambda: ["prove_arith"])
    """lm-eval task (or group) names: ``prove_arith`` ships with prove; gsm8k, bbh, ... are lm-eval's."""
    data: str | None = None
    """JSONL test file for ``prove_arith`` (null: the tiny recipe's ``runs/data/arithmetic/test.jsonl``)."""
    include_path: list[str] = field(default_factory=list)
    """Extra folders of task YAML (local copies of benchmarks, see docs/eval.md)."""
    apply_chat_template: bool = True
    """Render prompts with the model's chat template (lm-eval's ``--apply_chat_template``)."""
    system_instruction: str | None = None
    """lm-eval's ``--system_instruction``."""
    fewshot_as_multiturn: bool = True
    """lm-eval's ``--fewshot_as_multiturn`` (with a chat template)."""
    num_fewshot: int | None = None
    """Overrides the tasks' few-shot count."""
    limit: float | None = None
    """Documents per task (≥ 1) or a fraction (< 1); for smoke runs."""
    max_gen_toks: int | None = None
    """Overrides the tasks' generation length cap."""
    confirm_run_unsafe_code: bool = False
    """lm-eval's ``--confirm_run_unsafe_code``: tasks that execute generated code (humaneval) refuse to run without it."""
    batch_size: int = 1
    """Batch of the log-likelihood forwards (generation is one request at a time)."""
    output: str = "outputs/eval"
    """Folder for results.json per method, prove_stats.json and comparison.{json,md}."""
    log_samples: bool = True
    """Write lm-eval's per-document samples (``<method>/samples_<task>.jsonl``)."""
    device: str = "cpu"
    """torch device, e.g. ``cuda``."""
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16, float16, or auto (the checkpoint's)."""
    backend: str = "engine"
    """``engine``: the ``prove`` model (our Decoder, one request at a time, our decode stats); ``vllm``: lm-eval's own
    ``vllm`` model with the method's ``speculative_config`` (ar, prove-lossless, sd, pard; prove, nsd and asd with our
    rule in vLLM's step, its values sent per request), every request batched
    (:func:`prove.decode.eval.model.vllm_model_args`); ``vllm.*`` are its knobs."""
    vllm: VllmOptions = field(default_factory=VllmOptions)
    """``backend=vllm``'s engine knobs (``vllm.max_num_seqs``, ``vllm.kv_cache_gb``, ``vllm.tensor_parallel_size``,
    ``vllm.engine_args``, ...)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}: pick one of {', '.join(BACKENDS)}")
        if not self.tasks:
            raise ValueError("tasks is empty; name at least one lm-eval task, e.g. tasks=[prove_arith]")
        check_dtype(self.dtype, "dtype")
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size} must be ≥ 1")
        if self.max_gen_toks is not None and self.max_gen_toks < 1:
            raise ValueError(f"max_gen_toks={self.max_gen_toks} must be ≥ 1")


def register_configs() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="eval_schema", node=schema_node(EvalConfig))


def run(cfg: EvalConfig) -> dict:
    """Evaluate ``cfg.baseline`` and ``cfg.method``; print and return the comparison."""
    from prove.decode.eval.model import compare_methods
    from prove.decode.methods import resolve_params

    resolve_params(cfg.method, **vars(cfg.params()))  # every parameter checked before lm-eval loads anything
    resolve_params(cfg.baseline)

    return compare_methods(cfg)


def lm_eval_main(argv: list[str]) -> None:
    """lm-eval's CLI with the ``prove`` model registered."""
    import prove.decode.eval.model  # noqa: F401  (registers --model prove)
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm-eval", *argv]
    cli_evaluate()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("lm-eval", "lm_eval"):
        lm_eval_main(sys.argv[2:])
        return
    from prove.common.errors import hydra_cli

    register_configs()
    hydra_cli("prove-eval", "prove.conf.eval", "eval", run)()


if __name__ == "__main__":
    main()
