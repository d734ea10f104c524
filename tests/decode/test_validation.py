"""Bad input is refused at start, before a file is read or a model loaded: method parameters, the context length
(every position a method feeds counted), the dtype."""

from __future__ import annotations

import copy

import pytest
from prove.decode import Decoder

pytestmark = pytest.mark.filterwarnings("ignore:checkpoint .* records no trained block size")


BAD_PARAMS = [
    ("nsd", {"theta": 1.5}, r"nsd's theta=1.5 is a nucleus mass"),  # used to fail at the first generate
    ("nsd", {"theta": -0.1}, "theta=-0.1 must be ≥ 0"),
    # used to decode silently at one token per cycle (p̃·q never reaches 1.5)
    ("prove", {"theta": 1.5}, r"prove's theta=1.5 bounds p̃·q.*pass a value in \[0, 1\]"),
    ("prove", {"theta": "0.1"}, "theta='0.1' must be a number"),
    ("mars", {"tau": float("nan")}, "tau=nan must be a number"),
    ("sd", {"k": 2.5}, "k=2.5 must be an integer"),
    ("sd", {"k": 0}, "k=0 must be ≥ 1"),
    ("asd", {"max_mismatches": 1.5}, "max_mismatches=1.5 must be an integer"),
    ("asd", {"budget": -1.0}, "budget=-1.0 must be ≥ 0"),
    ("asd", {"temperature": 0.7}, "method asd is greedy"),
    ("prove-lossless", {"block_size": 0}, "block_size=0 must be ≥ 1"),
    ("ar", {"top_p": 0.0}, r"top_p=0.0 must lie in \(0, 1\]"),
    ("ar", {"top_k": True}, "top_k=True must be an integer"),
    ("ar", {"seed": 1.5}, "seed=1.5 must be an integer"),
    ("ar", {"compile": "yes"}, "compile='yes' must be true or false"),
    ("ar", {"compile": True, "fast": False}, "compile=true compiles the fast path's cycle, and fast=false"),
    # fast=auto keeps a CPU decode on the reference path: compile=true would silently compile nothing
    ("ar", {"compile": True}, r"fast=auto runs on CUDA only \(this decode is on cpu\): pass fast=true"),
]


@pytest.mark.parametrize(("method", "params", "match"), BAD_PARAMS)
def test_bad_parameters_fail_when_the_decoder_is_built(lm, tokenizer, method, params, match):
    kw = {"draft": lm} if method in ("sd", "nsd", "asd") else {"verifier": lm} if method == "prove" else {}
    with pytest.raises(ValueError, match=match):
        Decoder(lm, tokenizer, method=method, **{"block_size": 4, **kw, **params})


def test_bad_parameters_fail_before_the_cli_reads_a_file_or_loads_a_model(tmp_path):
    from prove.decode.bench.config import BenchConfig
    from prove.decode.bench.run import run_bench
    from prove.decode.config import DecodeConfig
    from prove.decode.records import run

    missing = str(tmp_path / "missing")
    with pytest.raises(ValueError, match="nucleus mass"):
        run(
            DecodeConfig(
                model=missing, method="nsd", draft=missing, theta=1.5, prompts=missing, output=missing
            )
        )
    with pytest.raises(ValueError, match="nucleus mass"):
        run_bench(
            BenchConfig(
                model=missing, prompts=missing, methods=["ar", "nsd"], method_params={"nsd": {"theta": 1.5}}
            )
        )
    assert not list(tmp_path.iterdir())


# -- the context length ----------------------------------------------------------------------------------------


def _record_positions(model, seen: list[int]):
    """A copy of ``model`` that records the largest position it is fed in each forward."""
    m = copy.deepcopy(model)

    def hook(_module, args, kwargs):
        pos = kwargs.get("position_ids")
        if pos is not None:
            seen.append(int(pos.max()))
        else:  # no explicit positions: the cache length + the new tokens
            cache = kwargs.get("past_key_values", kwargs.get("cache"))
            ids = kwargs.get("input_ids", args[0] if args else None)
            seen.append((cache.get_seq_length() if cache is not None else 0) + ids.shape[1] - 1)

    m.register_forward_pre_hook(hook, with_kwargs=True)
    return m


@pytest.mark.parametrize("method", ["ar", "mars", "prove", "prove-lossless", "sd", "nsd", "asd"])
def test_context_length_is_checked_at_start_counting_every_position_fed(
    lm, small, tokenizer, prompts, method
):
    """At prompt + max_new_tokens = max_position_embeddings every method runs and no model is fed a position
    ≥ the limit (block placeholders and verifier passes included); one more token is a clear error before any
    forward pass (it used to run silently past the limit)."""
    p = prompts[0]
    n = 2 * 4 + 3  # several whole blocks, then a partial one at the end
    limit = len(p) + n
    seen: list[int] = []
    target = _record_positions(lm, seen)
    target.config.max_position_embeddings = limit
    other = _record_positions(lm if method in ("sd", "nsd", "asd") else small, seen)
    other.config.max_position_embeddings = limit
    role = {"prove": "verifier", "sd": "draft", "nsd": "draft", "asd": "draft"}.get(method)
    kw = {role: other} if role else {}
    dec = Decoder(target, tokenizer, method=method, **({"block_size": 4} if method in ("mars", "prove", "prove-lossless") else {}), **kw,
                  **({"theta": 0.0} if method == "prove" else {"tau": 0.0} if method == "mars" else {}))  # fmt: skip
    out = dec.generate(p, max_new_tokens=n, eos_token_id=[])
    assert len(out.token_ids) == n and seen and max(seen) < limit
    seen.clear()
    with pytest.raises(ValueError, match=rf"= {limit + 1} positions exceed the .*max_position_embeddings \({limit}\): "
                                         rf"lower max_new_tokens to {n} or less"):  # fmt: skip
        dec.generate(p, max_new_tokens=n + 1, eos_token_id=[])
    assert not seen


# -- ProVe through the engine: a partial leading run where p̃·q straddles θ ------------------------------------


@pytest.mark.parametrize("which", ["decode", "bench", "eval"])
def test_a_bad_dtype_is_refused_when_the_config_is_built(which):
    """Every decode-side config checks ``dtype`` with ``prove.data.loading.check_dtype`` (one message, naming
    the choices), before any model is loaded."""
    from prove.decode.bench.config import BenchConfig
    from prove.decode.config import DecodeConfig
    from prove.decode.eval.cli import EvalConfig

    build = {
        "decode": lambda: DecodeConfig(model="M", prompts="P", output="O", dtype="fp8"),
        "bench": lambda: BenchConfig(model="M", prompts="P", dtype="fp8"),
        "eval": lambda: EvalConfig(model="M", tasks=["prove_arith"], output="O", dtype="fp8"),
    }[which]
    with pytest.raises(ValueError, match=r"dtype='fp8': use one of auto, float32, bfloat16, float16"):
        build()
