"""prove-decode end to end: config composition of every method YAML, the documented command line, prompt
files, the JSONL output and resuming it, and the clear errors of bad input."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from prove.data.prompts import read_prompts
from prove.decode.cli import register_configs
from prove.decode.config import DecodeConfig
from prove.decode.methods import METHODS, resolve_params
from prove.decode.records import run

BIN = Path(sys.executable).parent
CONF = Path(__file__).resolve().parents[2] / "conf"


def config(*overrides: str) -> DecodeConfig:
    register_configs()
    with initialize_config_module(config_module="prove.conf.decode", version_base=None):
        cfg = compose("decode", overrides=list(overrides))
    return OmegaConf.to_object(cfg)  # type: ignore[return-value]


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.fixture
def prompt_file(tmp_path) -> Path:
    rows = [
        {"prompt": "Ana has 3 apples"},
        {"id": "chat-1", "messages": [{"role": "user", "content": "Ben has 2 pens."}]},
        {"prompt": "How many coins does Dev have?"},
    ]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_cli_module_imports_no_torch_and_help_works():
    code = "import sys, prove.decode.cli; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    help_ = subprocess.run([BIN / "prove-decode", "--help"], capture_output=True, text=True, check=True)
    assert "method=NAME: a method of prove.decode.methods" in help_.stdout
    assert "method: prove-lossless" in help_.stdout.splitlines()


@pytest.mark.parametrize("name", sorted(METHODS))
def test_method_defaults_have_one_home_the_registry(name):
    """``method=NAME`` selects the method and leaves its parameters unset, so the registry's defaults apply."""
    cfg = config("model=M", "prompts=P", "output=O", f"method={name}")
    assert cfg.method == name
    for key in METHODS[name].defaults:
        assert getattr(cfg, key) is None, f"the composed config sets {key}: leave it to the registry"
    _, params = resolve_params(cfg.method, **vars(cfg.params()))
    assert {k: getattr(params, k) for k in METHODS[name].defaults} == dict(METHODS[name].defaults)


@pytest.mark.parametrize("path", ["decode/decode.yaml", "decode/bench.yaml", "eval/eval.yaml"])
def test_cli_yaml_restates_no_schema_default(path):
    """Each default lives in its dataclass only: a CLI's YAML selects the schema and sets Hydra up."""
    raw = OmegaConf.load(CONF / path)
    assert set(raw.keys()) <= {"defaults", "hydra"}, (
        f"conf/{path} restates {sorted(set(raw.keys()) - {'defaults', 'hydra'})}"
    )


def test_the_documented_command_line_composes():
    cfg = config(
        "model=PATH",
        "verifier=SMALL",
        "method=prove",
        "theta=0.3",
        "block_size=16",
        "prompts=FILE",
        "output=OUT",
        "max_new_tokens=8",
    )
    assert (cfg.method, cfg.theta, cfg.block_size, cfg.verifier, cfg.max_new_tokens) == (
        "prove",
        0.3,
        16,
        "SMALL",
        8,
    )
    assert config("model=M", "prompts=P", "output=O").method == "prove-lossless"
    with pytest.raises(ConfigCompositionException):
        config("model=M", "prompts=P", "output=O", "thetaa=0.1")
    with pytest.raises(ValueError, match="unknown method 'nope'; pick one of"):
        run(config("model=M", "prompts=P", "output=O", "method=nope"))  # refused before any file is read
    with pytest.raises(ValueError, match="max_new_tokens=0 must be ≥ 1"):
        config("model=M", "prompts=P", "output=O", "max_new_tokens=0")
    # fast=true|false|auto (the fast path): parsed, and a bad value refused when the config is built
    assert [
        config("model=M", "prompts=P", "output=O", f"fast={v}").fast for v in ("true", "false", "auto")
    ] == [
        True,
        False,
        "auto",
    ]
    with pytest.raises(ValueError, match="fast='yes': give true, false or auto"):
        config("model=M", "prompts=P", "output=O", "fast=yes")
    # the fast path's cache: grown as needed by default, or fixed
    assert config("model=M", "prompts=P", "output=O").cache_len is None
    assert config("model=M", "prompts=P", "output=O", "cache_len=8192").cache_len == 8192
    with pytest.raises(ValueError, match="cache_len=1 must be ≥ 2"):
        config("model=M", "prompts=P", "output=O", "cache_len=1")


def test_cli_end_to_end_lossless_equals_ar(checkpoints, prompt_file, tmp_path):
    out = tmp_path / "lossless.jsonl"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [
        BIN / "prove-decode",
        f"model={checkpoints['mars']}",
        "method=prove-lossless",
        "block_size=4",
        f"prompts={prompt_file}",
        f"output={out}",
        "max_new_tokens=16",
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert not (tmp_path / "outputs").exists() and not (tmp_path / ".hydra").exists()
    ar_out = run(
        config(
            f"model={checkpoints['mars']}",
            "method=ar",
            f"prompts={prompt_file}",
            f"output={tmp_path / 'ar.jsonl'}",
            "max_new_tokens=16",
        )
    )
    lossless, ar = read_jsonl(out), read_jsonl(ar_out)
    assert [r["id"] for r in lossless] == [0, "chat-1", 2]
    assert [r["token_ids"] for r in lossless] == [r["token_ids"] for r in ar]
    assert [r["completion"] for r in lossless] == [r["completion"] for r in ar]
    rec = lossless[1]
    assert (
        rec["prompt"] == [{"role": "user", "content": "Ben has 2 pens."}]
        and rec["method"] == "prove-lossless"
    )
    for key in (
        "new_tokens",
        "cycles",
        "tokens_per_cycle",
        "model_passes",
        "verifier_passes",
        "draft_passes",
        "accepted_by_depth",
        "proposed_by_depth",
        "committed_per_cycle",
        "wall_s",
    ):
        assert key in rec["stats"]


def test_prove_with_verifier_and_trace(checkpoints, prompt_file, tmp_path):
    out = run(
        config(
            f"model={checkpoints['mars']}",
            f"verifier={checkpoints['verifier']}",
            "method=prove",
            "theta=0.05",
            f"prompts={prompt_file}",
            f"output={tmp_path / 'p.jsonl'}",
            "max_new_tokens=10",
            "trace=true",
        )
    )
    recs = read_jsonl(out)
    assert len(recs) == 3
    for r in recs:
        s = r["stats"]
        assert s["verifier_passes"] == s["cycles"] == len(s["trace"])
        assert all(row["verifier_prob"] is not None for row in s["trace"])


def test_resume_skips_finished_ids_and_drops_a_torn_line(checkpoints, prompt_file, tmp_path):
    out = tmp_path / "out.jsonl"
    first = {"id": 0, "prompt": "Ana has 3 apples", "completion": "KEEP", "token_ids": [], "stats": {}}
    out.write_text(json.dumps(first) + "\n" + '{"id": "chat-1", "prompt": [{"ro')  # killed mid-write
    cfg = config(
        f"model={checkpoints['mars']}",
        "method=ar",
        f"prompts={prompt_file}",
        f"output={out}",
        "max_new_tokens=4",
    )
    run(cfg)
    recs = read_jsonl(out)
    assert [r["id"] for r in recs] == [0, "chat-1", 2]
    assert recs[0]["completion"] == "KEEP"  # not decoded again
    again = run(cfg)
    assert read_jsonl(again) == recs  # nothing left to do


def test_prompt_convention_raw_text_messages_and_the_chat_switch(checkpoints, tmp_path):
    """``prompt`` fields and plain lines are raw text by default (they were wrapped in the chat template);
    ``messages`` always go through the chat template; ``chat=true`` wraps raw text as a user turn. The Python
    API follows the same rule."""
    from prove.decode import Decoder

    text = "Ana has 3 apples"
    messages = [{"role": "user", "content": text}]
    dec = Decoder(checkpoints["mars"], method="ar")
    raw_ids = dec.generate(text, max_new_tokens=5).token_ids
    chat_ids = dec.generate(messages, max_new_tokens=5).token_ids
    assert dec.encode(text) == dec.tokenizer(text)["input_ids"]
    assert dec.encode(text, chat=True) == dec.encode(messages) != dec.encode(text)
    assert dec.generate(text, max_new_tokens=5, chat=True).token_ids == chat_ids

    txt = tmp_path / "prompts.txt"
    txt.write_text(f"{text}\n\nBen has 2 pens\n")
    assert [(r.id, r.prompt) for r in read_prompts(txt)] == [(0, text), (1, "Ben has 2 pens")]
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text(json.dumps({"prompt": text}) + "\n" + json.dumps({"messages": messages}) + "\n")
    model = f"model={checkpoints['mars']}"

    def decode(path, name, *extra):
        out = tmp_path / f"{name}.jsonl"
        return [r["token_ids"] for r in read_jsonl(run(config(model, "method=ar", f"prompts={path}", f"output={out}",
                                                              "max_new_tokens=5", *extra)))]  # fmt: skip

    assert config(model, "prompts=p", "output=o").chat is False
    assert decode(txt, "txt")[0] == raw_ids
    assert decode(txt, "txt-chat", "chat=true")[0] == chat_ids
    assert decode(jsonl, "jsonl") == [raw_ids, chat_ids]  # prompt: raw; messages: chat template
    assert decode(jsonl, "jsonl-chat", "chat=true") == [chat_ids, chat_ids]
    assert raw_ids != chat_ids


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (
            '{"prompt": "a"}\n{"text": "b"}\n',
            r"prompts.jsonl:2 needs exactly one of the fields 'prompt' \(text\) or 'messages'",
        ),
        ('{"prompt": "a"}\n{"prompt": \n', "prompts.jsonl:2 is not valid JSON"),
        ('{"messages": "hi"}\n', "'messages' must be a list of"),
        ('{"id": 1, "prompt": "a"}\n{"id": 1, "prompt": "b"}\n', "repeats an id"),
    ],
)
def test_bad_prompt_files(tmp_path, content, match):
    path = tmp_path / "prompts.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        read_prompts(path)


def test_bad_runs_fail_before_decoding(checkpoints, prompt_file, tmp_path):
    common = [f"prompts={prompt_file}", f"output={tmp_path / 'o.jsonl'}"]
    with pytest.raises(ValueError, match="method=prove needs a verifier: pass verifier=PATH"):
        run(config(f"model={checkpoints['mars']}", "method=prove", *common))
    with pytest.raises(ValueError, match=r"train it with `prove-train stage=mars` or pick method=ar/sd"):
        run(config(f"model={checkpoints['stock']}", "method=mars", *common))
    with pytest.raises(ValueError, match="pass block_size=4 or less"):
        run(config(f"model={checkpoints['mars']}", "block_size=16", *common))
    with pytest.raises(ValueError, match="is not a file"):
        run(
            config(
                f"model={checkpoints['mars']}", "prompts=/nonexistent.jsonl", f"output={tmp_path / 'o.jsonl'}"
            )
        )
    assert not (tmp_path / "o.jsonl").exists()


def test_an_empty_prompt_is_refused_at_start_naming_its_id_and_line(checkpoints, tmp_path):
    """An empty prompt is refused by the up-front check, with the prompts too long for the models, before any
    record is decoded (not when its turn comes, after the records before it), naming its id and its line; a
    chat-wrapped empty text is a chat template, not empty, and decodes."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "Ana has 3 apples"}\n\n{"id": "b", "prompt": ""}\n')
    out = tmp_path / "o.jsonl"
    common = [f"model={checkpoints['mars']}", "method=ar", f"prompts={prompts}", f"output={out}"]
    with pytest.raises(
        ValueError, match=r"^prompt 'b' \(line 3 of the prompt file\): the prompt is empty \(0 tokens\)"
    ):
        run(config(*common, "max_new_tokens=4"))
    assert not out.exists()
    run(config(*common, "max_new_tokens=4", "chat=true"))
    assert [r["id"] for r in read_jsonl(out)] == ["a", "b"]


def test_bad_input_is_one_line_and_exit_status_2(tmp_path):
    """A user error (here a checkpoint path that does not exist) prints what to fix, not a traceback."""
    import subprocess
    import sys

    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    proc = subprocess.run(
        [sys.executable, "-m", "prove.decode.cli", f"model={tmp_path / 'nope'}", f"prompts={prompts}",
         f"output={tmp_path / 'o.jsonl'}", "method=ar"],
        capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "prove-decode: error: no model at" in proc.stderr and "pass model=" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_exit_on_user_error_keeps_the_traceback_with_hydra_full_error(monkeypatch):
    from prove.common.errors import exit_on_user_error

    with pytest.raises(SystemExit) as e, exit_on_user_error("prog"):
        raise ValueError("pass x=1")
    assert e.value.code == 2
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ValueError, match="pass x=1"), exit_on_user_error("prog"):
        raise ValueError("pass x=1")


@pytest.mark.parametrize(
    ("module", "args"),
    [
        ("prove.decode.cli", ["model=m", "prompts=p", "output=o"]),
        ("prove.decode.bench.cli", ["model=m", "prompts=p"]),
        ("prove.decode.eval.cli", ["model=m"]),
    ],
)
def test_every_cli_refuses_a_misspelt_key(module, args):
    """``+tempreature=0.7`` used to be dropped silently by prove-decode / prove-bench / prove-eval (greedy
    decoding without a word); they now refuse it like prove-train does, before loading anything."""
    prog = {"prove.decode.cli": "prove-decode", "prove.decode.bench.cli": "prove-bench"}.get(
        module, "prove-eval"
    )
    proc = subprocess.run(
        [sys.executable, "-m", module, *args, "+tempreature=0.7"],
        capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert f"{prog}: error: unknown config key(s) ['tempreature']" in proc.stderr
    assert "Traceback" not in proc.stderr


_HOLDS_AN_ENGINE = """
import subprocess, sys, time
def body(config):  # stands in for a run that started an engine process (vLLM's EngineCore)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        print("engine pid", child.pid, flush=True)
        time.sleep(120)
    finally:
        child.kill()
        child.wait()
        print("engine stopped", flush=True)
"""


@pytest.mark.parametrize(
    ("patch", "entry"),
    [
        ("import prove.train.pipeline as m; m.train = body", "from prove.train.cli import main; main()"),
        ("import prove.decode.cli as m; m.run = body", "from prove.decode.cli import main; main()"),
    ],
    ids=["prove-train", "hydra_cli"],
)
def test_sigterm_runs_the_cleanup_and_stops_the_engine_process(patch, entry, tmp_path):
    """``kill`` of a prove-train relabel used to leave its vLLM engine process running (Python's default SIGTERM
    action skips ``finally``): the entry points turn SIGTERM into SystemExit(143), so cleanup runs."""
    code = f"{_HOLDS_AN_ENGINE}\n{patch}\n{entry}"
    args = ["recipe=tiny", "stage=sft"] if "train" in entry else ["model=m", "prompts=p", "output=o"]
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as o, err.open("w") as e:  # files, not pipes: a surviving child would hold a pipe open
        proc = subprocess.Popen([sys.executable, "-c", code, *args, f"hydra.run.dir={tmp_path}"], cwd=tmp_path,
                                stdout=o, stderr=e, text=True)  # fmt: skip
    try:
        while "engine pid" not in out.read_text():
            assert proc.poll() is None, err.read_text()
            time.sleep(0.1)
        child = int(out.read_text().split("engine pid")[1].split()[0])
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    try:
        assert proc.returncode == 128 + signal.SIGTERM, err.read_text()
        assert "engine stopped" in out.read_text()
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
