"""Verifier distillation (stage distill, docs/design.md §2.3): the verifier learns the proposer's own outputs.

ProVe reports that a verifier fine-tuned on the proposer's greedy responses commits 6–10% more tokens per
cycle at the same error rate. The stage has two steps:

1) **Generate** (:func:`generate_responses`, :func:`build_generated_set`; the prompts:
   :mod:`prove.train.distill_prompts`). Every process joins the launcher's
   process group first (:func:`init_distributed`), so a long generation never delays the rendezvous. The
   proposer (``distill.proposer``, a MARS checkpoint; bf16 on a GPU, fp32 on the CPU, loaded straight onto
   the process's device) answers greedily through ``prove.decode`` with ``prove-lossless`` (token for token
   its AR output, fewer passes). The engine decodes one request at a time, so each process walks its own
   slice of the prompts (prompt i → rank ``i % world_size``) request by request — or, with ``distill.batch_size``
   > 1 and method ``ar``, that many at once through transformers' batched greedy ``generate``
   (:func:`answer_batch`: an order of magnitude faster on a CPU, where one request at a time is bound by reading
   the weights for every token). With ``distill.backend=vllm`` (:func:`prove.train.distill_vllm.answer_vllm`) each process hands its whole
   slice to one vLLM engine (``prove.decode.vllm.backend.VllmDecoder``: continuous batching, a paged KV cache,
   ``ar`` or ``prove-lossless`` as vLLM parallel drafting — the same greedy tokens) and writes each response as it
   finishes; an engine split over ``distill.vllm.tensor_parallel_size`` GPUs is started by the first rank of each
   group of that many, which answers the group's slice (:func:`prove.train.distill_vllm.vllm_slot`). Each finished response is
   appended to that rank's JSONL shard and flushed (``shards/part-<rank>.jsonl``); a rerun — with any number
   of processes — skips every prompt already in any shard and drops a half-written last line, so a killed
   generation resumes where it stopped, nothing lost or repeated, and ends with the same set as an
   uninterrupted one. The ranks then wait for each other on a gloo group with a long timeout
   (:func:`wait_for_all_ranks`: they finish hours apart at scale, longer than NCCL's collective timeout). The shards are then assembled, in prompt order, into a ``datasets``
   dataset (``save_to_disk``: ``<generated_dir>/dataset``) in the Dolci schema (``messages`` = the prompt
   turns + the proposer's response as the assistant turn) plus the exact token ids; ``generation.json``
   beside it records the proposer checkpoint (and its prove.json) and the decode settings. A finished set
   with the same settings is reused; different settings in the same folder are an error.

   *Top-k log-probs* (``distill.top_k``): after a response is generated, one teacher-forced forward of the
   proposer over ``[prompt, response]`` with a plain causal mask gives its AR distribution p at every
   response position (the lossless verify pass computes the same logits, but only for the block positions
   it scored; one extra pass per response keeps the engine untouched and is exact in fp32). On vLLM they come
   from the generating pass itself (its raw log-probs: the log-softmax of the logits at each response position
   given the tokens before it, which is what the teacher-forced pass computes). The top-k ids and
   their log p (unnormalised over the k) are stored per response token.

2) **Fine-tune** the verifier (``stage.init_from``, else ``model.name_or_path``) on (prompt, response):
   :func:`prove.train.losses.distill_loss` = CE on the response tokens + ``distill.kl_weight`` × token-level KL. The training
   ids are exactly ``prompt_ids + response_ids`` as generated — the ids the verifier scores when it
   verifies this proposer — which is what ``prove.data``'s chat-template tokenization of ``messages`` gives
   (checked by a test), without a decode/re-encode round trip that could shift the KL targets.

The verifier checkpoint's ``prove.json`` records ``distilled_from`` (the proposer) and the generation
settings; ``prove.decode`` refuses a verifier whose tokenizer differs from the proposer's.

    prove-train recipe=tiny stage=distill
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
from collections.abc import Callable, Generator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets
import torch
import torch.distributed as dist
from prove.common.checkpoint import read_prove_json
from prove.data import loading
from prove.data.chat import IGNORE_INDEX
from prove.decode import Decoder
from prove.decode.methods import get_method
from prove.train import distill_vllm
from prove.train.distill_prompts import GENERATION_JSON as GENERATION_JSON
from prove.train.distill_prompts import Prompt as Prompt
from prove.train.distill_prompts import excluded_ids as excluded_ids
from prove.train.distill_prompts import prompt_set as prompt_set
from tqdm import tqdm

if TYPE_CHECKING:
    from prove.train.config import TrainConfig

log = logging.getLogger(__name__)

# generation.json keys that must match for a rerun to resume (or reuse) what is in generated_dir.
_SETTING_KEYS = (
    "proposer",
    "method",
    "block_size",
    "max_new_tokens",
    "dtype",
    "top_k",
    "prompts",
    "num_prompts",
    "prompt_seed",
    "exclude_from",
)
# How long a rank that finished its shard waits for the slowest one (generation speed varies with response length).
WAIT_TIMEOUT = timedelta(days=7)
_wait_group: Any = None


# --------------------------------------------------------------------------------------------------------------
# 1) generation
# --------------------------------------------------------------------------------------------------------------


def generation_settings(
    cfg: TrainConfig, source: str, prompts: Sequence[Prompt], block_size: int | None
) -> dict[str, Any]:
    """What generation.json records; the keys of ``_SETTING_KEYS`` must match for a rerun to resume."""
    d = cfg.distill
    meta = read_prove_json(d.proposer) if Path(d.proposer).is_dir() else None
    return {
        "proposer": str(d.proposer),
        "proposer_meta": None
        if meta is None
        else {k: v for k, v in meta.to_dict().items() if k != "training_config"},
        "method": d.method,
        "block_size": block_size,
        "max_new_tokens": d.max_new_tokens,
        "dtype": generation_dtype(cfg),
        "top_k": d.top_k,
        "prompts": source,
        "num_prompts": len(prompts),
        "prompt_ids": [p.id for p in prompts],
        "prompt_seed": d.prompt_seed,
        "exclude_from": [str(x) for x in d.exclude_from],
        "top_k_source": "the generating pass's raw log-probs on vLLM (the proposer's AR distribution)"
        if d.backend == "vllm"
        else "teacher-forced forward of the proposer over [prompt, response] (its AR distribution)",
        "batch_size": d.batch_size,
        "backend": d.backend,
    }


def _block_size(cfg: TrainConfig) -> int | None:
    """K the block method decodes with: ``distill.block_size``, else the proposer's trained one (prove.json)."""
    if not get_method(cfg.distill.method).needs_mask:
        return None
    if cfg.distill.block_size is not None:
        return cfg.distill.block_size
    meta = read_prove_json(cfg.distill.proposer)
    return None if meta is None else meta.block_size


def _check_settings(directory: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The stored generation.json (None if absent); a mismatch with ``settings`` is a ValueError."""
    path = directory / GENERATION_JSON
    if not path.is_file():
        return None
    stored = json.loads(path.read_text())
    stored = {"exclude_from": [], **stored}  # sets written before exclude_from existed read none
    diff = {k: (stored.get(k), settings[k]) for k in _SETTING_KEYS if stored.get(k) != settings[k]}
    if diff:
        raise ValueError(
            f"{directory} holds responses generated with other settings ({diff}, stored vs now): "
            "set distill.generated_dir=<new folder>, or delete it to regenerate"
        )
    return stored


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def read_shards(shard_dir: Path, own: Path | None = None) -> dict[int, dict[str, Any]]:
    """Every complete record in ``shard_dir/*.jsonl`` by prompt index; ``own``'s half-written tail is cut."""
    records: dict[int, dict[str, Any]] = {}
    for shard in sorted(shard_dir.glob("*.jsonl")):
        good = 0
        with shard.open("rb") as f:
            for raw in f:
                try:
                    if not raw.endswith(b"\n"):
                        raise ValueError("unterminated line")
                    rec = json.loads(raw)
                except ValueError:
                    break
                records.setdefault(int(rec["index"]), rec)
                good += len(raw)
        if shard == own and good != shard.stat().st_size:
            with shard.open("r+b") as f:
                f.truncate(good)
    return records


def init_distributed() -> tuple[int, int]:
    """Join the launcher's process group (torchrun / deepspeed set RANK, WORLD_SIZE, MASTER_ADDR) before generating,
    and open the gloo group :func:`wait_for_all_ranks` uses; returns ``(rank, world_size)``. Without a launcher
    (WORLD_SIZE unset or 1): ``(0, 1)`` and nothing to join. The training that follows reuses the same group."""
    global _wait_group
    if int(os.environ.get("WORLD_SIZE", 1)) > 1 and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    if not dist.is_initialized():
        return 0, 1
    if _wait_group is None:
        _wait_group = dist.new_group(backend="gloo", timeout=WAIT_TIMEOUT)
    return dist.get_rank(), dist.get_world_size()


def wait_for_all_ranks() -> None:
    """Block until every rank has finished its shard (a gloo barrier with a timeout of days, not NCCL's minutes)."""
    if dist.is_initialized():
        dist.barrier(group=_wait_group)


def _device(cfg: TrainConfig) -> str:
    if cfg.distill.device is not None:
        return cfg.distill.device
    return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu"


def generation_dtype(cfg: TrainConfig) -> str:
    """``distill.dtype``, else bfloat16 on a GPU and float32 on the CPU (a 32B proposer is 65 GB in bf16)."""
    if cfg.distill.dtype is not None:
        return cfg.distill.dtype
    return "bfloat16" if _device(cfg).startswith("cuda") else "float32"


def load_proposer(cfg: TrainConfig) -> Any:
    """The proposer as a :class:`prove.decode.Decoder`, its weights loaded straight onto this rank's device in the
    generation dtype (no full fp32 copy in host memory per rank)."""
    d = cfg.distill
    device = _device(cfg)
    model = loading.load_model(str(d.proposer), generation_dtype(cfg), device=device)
    tokenizer = loading.load_tokenizer(str(d.proposer))
    return Decoder(model, tokenizer, method=d.method, device=device, block_size=d.block_size)


@torch.no_grad()
def top_k_logprobs(model: Any, prompt_ids: list[int], response_ids: list[int], k: int) -> tuple[list, list]:
    """The proposer's top-k (ids, log-probs) at each response position: one teacher-forced causal pass."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids + response_ids], device=device)  # (1, P+R)
    logits = model(input_ids=ids, use_cache=False).logits[0]  # (P+R, V)
    p = len(prompt_ids)
    logp = torch.log_softmax(logits[p - 1 : p - 1 + len(response_ids)].float(), dim=-1)  # (R, V)
    top = logp.topk(k, dim=-1)  # (R, k)
    return top.indices.tolist(), top.values.tolist()


def answer(decoder: Any, prompt: Prompt, max_new_tokens: int, top_k: int) -> dict[str, Any]:
    """One shard record: the proposer's greedy response to ``prompt`` (+ its top-k log-probs when ``top_k`` > 0)."""
    prompt_ids = decoder.encode(prompt.messages)
    result = decoder.generate(prompt_ids, max_new_tokens=max_new_tokens)
    rec = _record(prompt, prompt_ids, result, decoder.eos_ids())
    response_ids = rec["response_ids"]
    if top_k > 0:
        rec["topk_ids"], rec["topk_logprobs"] = top_k_logprobs(decoder.model, prompt_ids, response_ids, top_k)
    return rec


def _record(prompt: Prompt, prompt_ids: list[int], result: Any, eos: Sequence[int]) -> dict[str, Any]:
    """A shard record (without top-k) from a decode result (``token_ids``, ``text``, ``stats``) of either backend."""
    response_ids = [int(t) for t in result.token_ids]
    return {
        "index": prompt.index,
        "id": prompt.id,
        "messages": prompt.messages + [{"role": "assistant", "content": result.text}],
        "prompt_ids": prompt_ids,
        "response_ids": response_ids,
        "finished": bool(response_ids) and response_ids[-1] in eos,
        "tokens_per_cycle": result.stats.tokens_per_cycle,
        "cycles": result.stats.cycles,
    }


@torch.no_grad()
def answer_batch(
    decoder: Any, prompts: Sequence[Prompt], max_new_tokens: int, top_k: int
) -> list[dict[str, Any]]:
    """Shard records for several prompts at once (``distill.batch_size`` > 1, method ``ar``): transformers' greedy
    ``generate`` over the left-padded batch, restricted to the ids the decoder may emit (``Models.allowed``: never
    ``<|mask|>``), each row cut after its first EOS as the engine cuts it. One request at a time is bound by
    reading the weights once per token; a batch reads them once per step for every row (on a 2-core CPU,
    SmolLM2-135M: 16 rows ran ~13× the tokens per second of one). The decoding is the engine's ``ar``; only the
    batched matmuls round differently, so on a real model a near-tie of the top two logits may rarely break the
    other way (a tiny model's outputs are token for token the same, tests/train/test_distill.py)."""
    from transformers import GenerationConfig

    model, tokenizer = decoder.model, decoder.tokenizer
    device = next(model.parameters()).device
    ids = [decoder.encode(p.messages) for p in prompts]
    width = max(len(x) for x in ids)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids], device=device)  # (B, width)
    attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device)
    eos = decoder.eos_ids()
    allowed = decoder.models.allowed
    suppress = [] if allowed is None else (~allowed).nonzero().flatten().tolist()
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=pad,
        suppress_tokens=suppress or None,
    )
    out = model.generate(input_ids=input_ids, attention_mask=attention, generation_config=config)
    records = []
    for prompt, prompt_ids, row in zip(prompts, ids, out[:, width:].tolist(), strict=True):
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        response_ids = [int(t) for t in row[:end]]
        rec: dict[str, Any] = {
            "index": prompt.index,
            "id": prompt.id,
            "messages": prompt.messages
            + [{"role": "assistant", "content": tokenizer.decode(response_ids, skip_special_tokens=True)}],
            "prompt_ids": prompt_ids,
            "response_ids": response_ids,
            "finished": bool(response_ids) and response_ids[-1] in eos,
            "tokens_per_cycle": 1.0,
            "cycles": len(response_ids),
        }
        if top_k > 0:
            rec["topk_ids"], rec["topk_logprobs"] = top_k_logprobs(model, prompt_ids, response_ids, top_k)
        records.append(rec)
    return records


def _engine_answers(
    decoder: Any, prompts: Sequence[Prompt], max_new_tokens: int, top_k: int, batch_size: int
) -> Generator[dict[str, Any]]:
    """Shard records from our engine: one request at a time, or ``batch_size`` at once (:func:`answer_batch`)."""
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        if batch_size == 1:
            yield answer(decoder, batch[0], max_new_tokens, top_k)
        else:
            yield from answer_batch(decoder, batch, max_new_tokens, top_k)


def generate_responses(
    cfg: TrainConfig,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    progress: bool = True,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """Step 1a: this process's share of the responses, appended to its shard. Returns ``generated_dir``.

    Joins the process group first (:func:`init_distributed`) unless ``rank``/``world_size`` are given. Prompt i
    goes to rank ``i % world_size``, one request at a time (the decode engine is single-request), or with
    ``distill.backend=vllm`` to the vLLM engine of its slice (:func:`prove.train.distill_vllm.vllm_slot`), all at once. Prompts
    already in any shard are skipped, so a rerun resumes; a finished set (``dataset/`` with matching settings)
    is not touched. ``on_record`` is called after each record is flushed (progress reporting).
    """
    if rank is None or world_size is None:
        rank, world_size = init_distributed()
    d = cfg.distill
    out = Path(d.generated_dir)
    if not Path(d.proposer).exists():
        raise ValueError(
            f"distill.proposer={d.proposer!r} does not exist: train it first (prove-train stage=mars)"
        )
    prompts, source = prompt_set(cfg)
    settings = generation_settings(cfg, source, prompts, _block_size(cfg))
    stored = _check_settings(out, settings)
    if stored is not None and stored.get("complete") and (out / "dataset").is_dir():
        log.info("reusing the generated set in %s", out)
        return out
    shard_dir = out / "shards"
    shard_dir.mkdir(parents=True, exist_ok=True)
    if stored is None:
        _write_json(out / GENERATION_JSON, {**settings, "complete": False})
    own = shard_dir / f"part-{rank:05d}.jsonl"
    done = read_shards(shard_dir, own)
    share = _generation_slice(cfg, rank, world_size)
    if share is None:
        log.info("rank %d: its GPUs serve the vLLM engine of a lower rank", rank)
        return out
    part, parts, gpus = share
    mine = [p for p in prompts if p.index % parts == part]
    todo = [p for p in mine if p.index not in done]
    if not todo:  # a rerun after this slice finished: no model to load
        log.info("rank %d: every prompt of its slice is answered in %s", rank, shard_dir)
        return out
    decoder = _load_generator(cfg, settings, gpus)
    log.info(
        "generating %d responses (%d already done) with %s on %s", len(todo), len(done), d.method, d.proposer
    )
    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), file=sys.stderr, disable=not progress,
               unit="prompt", desc=f"distill generation (rank {rank})")  # fmt: skip
    _append_records(cfg, decoder, todo, own, bar, on_record)
    del decoder
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the proposer's memory goes back before the verifier loads
    return out


def _generation_slice(cfg: TrainConfig, rank: int, world_size: int) -> tuple[int, int, list[int]] | None:
    """``(part, parts, gpus)``: this rank answers the prompts whose index is ``part`` modulo ``parts``; with
    ``distill.backend=vllm`` its slice is its engine's (on ``gpus``), and None when its GPUs serve a lower rank's
    engine."""
    d = cfg.distill
    if d.backend != "vllm":
        return rank, world_size, []
    # processes on this node: torchrun's LOCAL_WORLD_SIZE, the deepspeed launcher's LOCAL_SIZE
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or world_size)
    local_rank = int(os.environ.get("LOCAL_RANK", rank % local_world))
    return distill_vllm.vllm_slot(rank, world_size, d.vllm.tensor_parallel_size, local_rank, local_world)


def _load_generator(cfg: TrainConfig, settings: Mapping[str, Any], gpus: list[int]) -> Any:
    """The proposer on our engine, or on a vLLM engine over ``gpus``; its block size must be the recorded one."""
    d = cfg.distill
    decoder = load_proposer(cfg) if d.backend == "engine" else distill_vllm.load_vllm_proposer(cfg, gpus)
    if decoder.method.needs_mask and decoder.params.block_size != settings["block_size"]:
        raise AssertionError(f"block size {decoder.params.block_size} != {settings['block_size']} recorded")
    return decoder


def _append_records(
    cfg: TrainConfig, decoder: Any, todo: Sequence[Prompt], own: Path, bar: Any,
    on_record: Callable[[dict[str, Any]], None] | None,
) -> None:  # fmt: skip
    """Answer ``todo`` and append each record to this rank's shard as it comes (flushed, so a killed run keeps
    it); then abort what vLLM still has in flight and stop its engine."""
    d = cfg.distill
    if d.backend == "vllm":
        records = distill_vllm.answer_vllm(decoder, todo, d.max_new_tokens, d.top_k)
    else:
        records = _engine_answers(decoder, todo, d.max_new_tokens, d.top_k, d.batch_size)
    try:
        with own.open("a") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")
                f.flush()
                bar.set_postfix(tok_per_cycle=f"{rec['tokens_per_cycle']:.2f}")
                bar.update()
                if on_record is not None:
                    on_record(rec)
    finally:
        records.close()  # vLLM: requests still in flight are aborted
        bar.close()
        if d.backend == "vllm":
            decoder.close()  # its engine processes stop, their memory goes back


def _features(top_k: int):
    feats = {
        "index": datasets.Value("int64"),
        "id": datasets.Value("string"),
        "messages": datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")}),
        "prompt_ids": datasets.List(datasets.Value("int32")),
        "response_ids": datasets.List(datasets.Value("int32")),
        "finished": datasets.Value("bool"),
        "tokens_per_cycle": datasets.Value("float64"),
        "cycles": datasets.Value("int64"),
    }
    if top_k > 0:
        feats["topk_ids"] = datasets.List(datasets.List(datasets.Value("int32")))
        feats["topk_logprobs"] = datasets.List(datasets.List(datasets.Value("float32")))
    return datasets.Features(feats)


def build_generated_set(generated_dir: str | Path) -> datasets.Dataset:
    """Step 1b (one process): the shards, in prompt order, as a dataset saved to ``<generated_dir>/dataset``.

    Loads it instead when it already exists. Raises when a prompt has no response (a rank still running or
    failed: rerun the stage, it resumes).
    """
    out = Path(generated_dir)
    settings = json.loads((out / GENERATION_JSON).read_text())
    if settings.get("complete") and (out / "dataset").is_dir():
        return datasets.load_from_disk(str(out / "dataset"))
    records = read_shards(out / "shards")
    n = settings["num_prompts"]
    missing = [i for i in range(n) if i not in records]
    if missing:
        raise ValueError(
            f"{out}: {len(missing)} of {n} prompts have no response (first: {missing[:5]}): rerun the stage to resume"
        )
    rows = [records[i] for i in range(n)]
    feats = _features(settings["top_k"])
    columns = {name: [r[name] for r in rows] for name in feats}
    ds = datasets.Dataset.from_dict(columns, features=feats)
    ds.save_to_disk(str(out / "dataset"))
    tpc = [r["tokens_per_cycle"] for r in rows]
    summary = {
        "rows": n,
        "finished_on_eos": sum(r["finished"] for r in rows),
        "response_tokens": sum(len(r["response_ids"]) for r in rows),
        "mean_tokens_per_cycle": sum(tpc) / len(tpc),
    }
    _write_json(out / GENERATION_JSON, {**settings, "complete": True, "summary": summary})
    log.info("generated set: %s", summary)
    return ds


# --------------------------------------------------------------------------------------------------------------
# 2) the verifier's training rows (its collator, loss and trainer: collate.py, losses.py, trainer.py)
# --------------------------------------------------------------------------------------------------------------


def training_rows(generated: datasets.Dataset, max_len: int) -> datasets.Dataset:
    """``input_ids = prompt_ids + response_ids``, ``labels`` = -100 on the prompt, and the top-k per label
    position (when stored); right-truncated to ``max_len``, rows whose prompt alone is ``max_len`` long dropped."""

    def encode(row: dict[str, Any]) -> dict[str, Any]:
        p = len(row["prompt_ids"])
        ids = (list(row["prompt_ids"]) + list(row["response_ids"]))[:max_len]
        r = len(ids) - p
        out = {"input_ids": ids, "labels": [IGNORE_INDEX] * p + ids[p:]}
        if "topk_ids" in row:
            out["topk_ids"] = row["topk_ids"][:r]
            out["topk_logprobs"] = row["topk_logprobs"][:r]
        return out

    kept = generated.filter(lambda row: len(row["prompt_ids"]) < max_len and len(row["response_ids"]) > 0)
    if len(kept) == 0:
        raise ValueError(f"no generated row fits max_len={max_len} with a response token: raise max_len")
    if len(kept) < len(generated):
        log.warning(
            "distill: dropped %d rows whose prompt is ≥ max_len=%d tokens",
            len(generated) - len(kept),
            max_len,
        )
    return kept.map(encode, remove_columns=kept.column_names, desc="distill rows")


def check_same_vocab(verifier_tokenizer: Any, proposer: str) -> None:
    """The verifier must share the proposer's vocabulary (apart from ``<|mask|>``), as ``prove.decode`` requires."""
    diff = loading.vocab_difference(verifier_tokenizer, loading.load_tokenizer(proposer))
    if diff:
        raise ValueError(
            f"the verifier's tokenizer differs from the proposer {proposer}'s ({diff} "
            "entries differ): distil a verifier of the same model family (same tokenizer)"
        )


def meta_extra(cfg: TrainConfig) -> dict[str, Any]:
    """What the distilled verifier's prove.json records about its proposer and the generated set."""
    out = Path(cfg.distill.generated_dir)
    settings = json.loads((out / GENERATION_JSON).read_text())
    return {
        "distilled_from": settings["proposer"],
        "proposer_meta": settings.get("proposer_meta"),
        "generated_dir": str(out),
        "generation": {k: settings.get(k) for k in (*_SETTING_KEYS, "summary")},
        "kl_weight": cfg.distill.kl_weight,
        "top_k": cfg.distill.top_k,
    }
