"""lm-evaluation-harness integration: the ``prove`` model, the shipped ``prove_arith`` task, ``prove-eval``.

Tiny random Qwen2 checkpoints (fp32), an 8-document task, offline. Accuracy is ~0 on a random model, so the
real checks are on the generated text per document: AR through prove's engine, ProVe-lossless and lm-eval's
own ``hf`` model must produce the same completions, and ``until`` strings must cut where AR would.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException

pytest.importorskip("lm_eval")

from lm_eval import simple_evaluate  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from prove.decode.eval.cli import EvalConfig  # noqa: E402
from prove.decode.eval.model import ProveLM, compare_methods, task_manager  # noqa: E402

from tests.numerics import fp32_tol, model_reduction  # noqa: E402

N_DOCS = 8
MAX_GEN = 16


@pytest.fixture(scope="module")
def checkpoint(checkpoints):
    """The decode tests' random block-proposer checkpoint (tokenizer with <|mask|>, prove.json K = 4, weights
    redrawn so greedy text varies: "identical outputs" is then a strong check)."""
    return Path(checkpoints["mars"])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from prove.data.synthetic import as_prompt, generate_arithmetic, write_jsonl

    path = tmp_path_factory.mktemp("data") / "test.jsonl"
    return write_jsonl((as_prompt(r) for r in generate_arithmetic(N_DOCS, seed=7)), path)


def _cfg(checkpoint, data, out, **kw) -> EvalConfig:
    return EvalConfig(model=str(checkpoint), data=str(data), output=str(out), max_gen_toks=MAX_GEN, **kw)


def _resps(samples: list[dict]) -> dict[int, str]:
    return {s["doc_id"]: s["resps"][0][0] for s in samples}


def test_prove_eval_lossless_matches_ar_per_document(checkpoint, data, tmp_path):
    """prove-eval's comparison: same accuracy, same completion for every document, stats and table written."""
    report = compare_methods(_cfg(checkpoint, data, tmp_path, method="prove-lossless"))

    (row,) = [r for r in report["rows"] if r["task"] == "prove_arith"]
    assert row["metric"] == "exact_match,answer"
    assert row["baseline"] == row["method"] and row["delta_pts"] == 0.0
    assert row["tokens_per_cycle"] >= 1.0 and row["speedup"] > 0

    def samples(method):
        lines = (tmp_path / method / "samples_prove_arith.jsonl").read_text().splitlines()
        return _resps([json.loads(x) for x in lines])

    ar, lossless = samples("ar"), samples("prove-lossless")
    assert len(ar) == N_DOCS and ar == lossless
    assert len(set(ar.values())) == N_DOCS, "the random model's completions should differ per document"

    stats = json.loads((tmp_path / "prove_stats.json").read_text())
    assert stats["ar"]["tasks"]["prove_arith"]["requests"] == N_DOCS
    assert stats["ar"]["tasks"]["prove_arith"]["tokens_per_cycle"] == pytest.approx(1.0)
    assert (
        stats["prove-lossless"]["tasks"]["prove_arith"]["new_tokens"]
        == stats["ar"]["tasks"]["prove_arith"]["new_tokens"]
    )
    table = (tmp_path / "comparison.md").read_text()
    assert "| prove_arith | exact_match,answer |" in table and "speedup" in table
    # lm-eval's results are there too, with the decode stats inside its config block
    results = json.loads((tmp_path / "prove-lossless" / "results.json").read_text())
    assert results["config"]["prove"]["method"] == "prove-lossless"


def test_model_by_name_matches_lm_eval_hf(checkpoint, data, tmp_path):
    """``--model prove`` (registry lookup by name) gives lm-eval's ``hf`` model's completions, chat template on."""
    tasks = task_manager(_cfg(checkpoint, data, tmp_path))
    common = dict(
        tasks=["prove_arith"], task_manager=tasks, apply_chat_template=True, log_samples=True,
        gen_kwargs={"max_gen_toks": MAX_GEN}, limit=4, bootstrap_iters=0,
    )  # fmt: skip
    ours = simple_evaluate(model="prove", model_args=f"model={checkpoint},method=prove-lossless", **common)
    hf = simple_evaluate(model="hf", model_args=f"pretrained={checkpoint},dtype=float32,device=cpu", **common)
    assert _resps(ours["samples"]["prove_arith"]) == _resps(hf["samples"]["prove_arith"])
    assert ours["config"]["prove"]["tasks"]["prove_arith"]["requests"] == 4


def _gen(lm, context: str, **gen_kwargs) -> tuple[str, list[int]]:
    req = Instance("generate_until", {}, (context, gen_kwargs), 0)
    (text,) = lm.generate_until([req], disable_tqdm=True)
    return text, lm.outputs[-1]["token_ids"]


def test_until_stops_where_ar_stops(checkpoint, tokenizer):
    ar = ProveLM(model=str(checkpoint), method="ar")
    lossless = ProveLM(model=str(checkpoint), method="prove-lossless")
    context = "Ana has 3 apples and gets 4 more. How many apples does Ana have?"
    free, free_ids = _gen(ar, context, until=[], max_gen_toks=24)
    assert len(free_ids) >= 8, "the random model should not end at once; change the seed"
    # a stop string that is completed in the middle of the free output
    head = tokenizer.decode(free_ids[:6])
    stop = next(free[i : i + 2] for i in range(len(head) - 1, len(free) - 1) if free[i : i + 2].strip())
    want = free.split(stop)[0]
    for lm in (ar, lossless):
        text, ids = _gen(lm, context, until=[stop], max_gen_toks=24)
        assert text == want
        # generation ended at the token that completed the stop string, as AR does
        assert stop in tokenizer.decode(ids) and stop not in tokenizer.decode(ids[:-1])
    assert ar.outputs[-1]["token_ids"] == lossless.outputs[-1]["token_ids"]
    # and max_gen_toks caps it exactly
    text, ids = _gen(lossless, context, until=[], max_gen_toks=5)
    assert ids == free_ids[:5]


def test_loglikelihood_equals_direct_computation(checkpoint):
    lm = ProveLM(model=str(checkpoint), method="prove-lossless", batch_size=2)
    model, tokenizer = lm.model, lm.tokenizer  # the checkpoint's tokenizer, as AutoTokenizer loads it
    pairs = [("Ben has 2 coins.", " Ben has 2 coins."), ("The answer is", " 7."), ("", "Cleo starts with 5")]
    reqs = [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)]
    got = lm.loglikelihood(reqs, disable_tqdm=True)

    def direct(ctx_ids: list[int], cont_ids: list[int]) -> tuple[float, bool, float]:
        """The log-likelihood from one unbatched pass, the greedy flag, and how far a batched (padded) pass may
        lie from it: each log-probability within twice the logits' fp32 bound (tests/numerics.py)."""
        ids = torch.tensor([ctx_ids + cont_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].float()
        logp = torch.log_softmax(logits, -1)
        rows = logp[len(ctx_ids) - 1 :]
        target = torch.tensor(cont_ids)
        n, d = model_reduction(model)
        tol = 2 * len(cont_ids) * fp32_tol(logits, reduction=max(n, ids.shape[1]), depth=d)
        return float(rows.gather(1, target[:, None]).sum()), bool((rows.argmax(-1) == target).all()), tol

    for (ctx, cont), (ll, greedy) in zip(pairs, got, strict=True):
        if ctx:
            ctx_ids = tokenizer.encode(ctx)
            cont_ids = tokenizer.encode(ctx + cont)[len(ctx_ids) :]
        else:  # empty context: conditioned on the EOS token (the tokenizer has no BOS), as lm-eval does
            ctx_ids, cont_ids = [tokenizer.eos_token_id], tokenizer.encode(cont)
        want_ll, want_greedy, tol = direct(ctx_ids, cont_ids)
        assert ll == pytest.approx(want_ll, abs=tol) and greedy == want_greedy

    text = "Dev has 9 pens and gets 1 more."
    (rolling,) = lm.loglikelihood_rolling(
        [Instance("loglikelihood_rolling", {}, (text,), 0)], disable_tqdm=True
    )
    want_ll, _, tol = direct([tokenizer.eos_token_id], tokenizer.encode(text))
    assert rolling == pytest.approx(want_ll, abs=tol)


def test_eval_config_composes(tmp_path):
    """conf/eval/eval.yaml composes onto EvalConfig; a typo fails at composition."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from prove.decode.eval.cli import register_configs

    register_configs()
    with initialize_config_module("prove.conf.eval", version_base=None):
        cfg = compose("eval", overrides=["model=m", "method=prove", "theta=0.1", "tasks=[gsm8k,bbh]"])
        obj = OmegaConf.to_object(cfg)
        assert isinstance(obj, EvalConfig) and obj.theta == 0.1 and obj.tasks == ["gsm8k", "bbh"]
        with pytest.raises(ConfigCompositionException, match="'thet'"):
            compose("eval", overrides=["model=m", "thet=0.1"])


def test_data_overlay_points_prove_arith_at_the_file(data, tmp_path):
    tasks = task_manager(EvalConfig(model="m", data=str(data), output=str(tmp_path)))
    assert "prove_arith" in tasks.all_tasks
    loaded = tasks.load(["prove_arith"])["tasks"]
    (task,) = loaded.values()
    docs = list(task.test_docs())
    assert len(docs) == N_DOCS and task.doc_to_text(docs[0]).startswith(
        docs[0]["messages"][0]["content"][:10]
    )
    with pytest.raises(ValueError, match="not a file"):
        task_manager(EvalConfig(model="m", data=str(tmp_path / "missing.jsonl"), output=str(tmp_path)))


@pytest.mark.slow
def test_prove_eval_lm_eval_passthrough_cli(checkpoint, data, tmp_path):
    """``prove-eval lm-eval --model prove ...``: lm-eval's own CLI, offline, with the model registered."""
    import os
    import subprocess
    import sys

    overlay = tmp_path / "tasks"
    overlay.mkdir()
    from prove.decode.eval.tasks import TASKS_DIR

    (overlay / "prove_arith.yaml").write_text(
        f"include: {TASKS_DIR / 'prove_arith.yaml'}\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
    )
    stats = tmp_path / "out" / "prove_stats.json"
    cmd = [
        sys.executable, "-m", "prove.decode.eval.cli", "lm-eval", "--model", "prove",
        "--model_args", f"model={checkpoint},method=prove-lossless,stats_path={stats}",
        "--tasks", "prove_arith", "--include_path", str(overlay), "--apply_chat_template",
        "--gen_kwargs", f"max_gen_toks={MAX_GEN}", "--limit", "2", "--output_path", str(tmp_path / "out"),
    ]  # fmt: skip
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "prove_arith" in proc.stdout and "exact_match" in proc.stdout
    (results,) = (tmp_path / "out").rglob("results_*.json")
    assert json.loads(results.read_text())["config"]["prove"]["tasks"]["prove_arith"]["requests"] == 2
    assert json.loads(stats.read_text())["method"] == "prove-lossless"
