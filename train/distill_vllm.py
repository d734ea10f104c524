"""Stage distill's generation on vLLM (``distill.backend=vllm``; the stage itself: :mod:`prove.train.distill`).

Each process hands its whole slice of the prompts to one vLLM engine
(:class:`prove.decode.vllm.backend.VllmDecoder`: continuous batching, a paged KV cache, ``ar`` or
``prove-lossless`` as vLLM parallel drafting) and gets each record back as it finishes, the top-k log-probs read
off the generating pass. Under a launcher, :func:`vllm_slot` decides which ranks start an engine, on which of the
node's GPUs, and which slice each answers.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Generator, Iterator, Sequence
from contextlib import closing, contextmanager
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from prove.train.config import TrainConfig
    from prove.train.distill import Prompt


def vllm_slot(
    rank: int, world_size: int, tensor_parallel_size: int, local_rank: int, local_world_size: int
) -> tuple[int, int, list[int]] | None:
    """``(part, parts, local GPUs)`` of this process's vLLM engine under a launcher — it answers prompt i when
    ``i % parts == part``, on those GPU indices of its node — or ``None`` for a process whose GPUs serve another's
    engine. One engine per process (``tensor_parallel_size`` 1: each rank its own slice and GPU, as our engine),
    else one per ``tensor_parallel_size`` consecutive ranks of a node, started by the first (vLLM splits it over
    its group's GPUs). Without a launcher (``world_size`` 1) vLLM takes the GPUs it is shown: ``(0, 1, [])``."""
    tp = tensor_parallel_size
    if world_size == 1:
        return 0, 1, []
    if local_world_size % tp:
        raise ValueError(
            f"distill.vllm.tensor_parallel_size={tp} must divide the {local_world_size} processes per node: launch "
            f"a multiple of {tp} GPUs per node, or drop the launcher (one process: vLLM splits the engine itself)"
        )
    if local_rank % tp:
        return None
    return rank // tp, world_size // tp, list(range(local_rank, local_rank + tp))


@contextmanager
def _visible_gpus(local: Sequence[int]) -> Iterator[None]:
    """``CUDA_VISIBLE_DEVICES`` narrowed to these of the node's GPUs while vLLM starts its engine processes (they
    inherit it; vLLM places an engine on the GPUs it sees), restored after."""
    if not local or not torch.cuda.is_available():
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown = before.split(",") if before else [str(i) for i in range(torch.cuda.device_count())]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(shown[i] for i in local)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES")
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def load_vllm_proposer(cfg: TrainConfig, gpus: Sequence[int] = ()) -> Any:
    """The proposer as a :class:`prove.decode.vllm.backend.VllmDecoder` (``distill.method``, K, the generation
    dtype, ``distill.vllm``'s knobs) on ``gpus`` of this node (:func:`vllm_slot`). vLLM returns 20 log-probs a token
    at most unless told: ``distill.top_k`` above that raises its ``max_logprobs``."""
    from prove.decode.vllm.backend import VllmDecoder
    from prove.train import distill

    d = cfg.distill
    options = d.vllm
    if d.top_k > 20 and "max_logprobs" not in options.engine_args:
        options = dataclasses.replace(options, engine_args={**options.engine_args, "max_logprobs": d.top_k})
    with _visible_gpus(gpus):
        return VllmDecoder(
            str(d.proposer),
            method=d.method,
            device=distill._device(cfg),
            dtype=distill.generation_dtype(cfg),
            options=options,
            block_size=d.block_size,
            knob_prefix="distill.vllm.",
        )


def answer_vllm(
    decoder: Any, prompts: Sequence[Prompt], max_new_tokens: int, top_k: int
) -> Generator[dict[str, Any]]:
    """Shard records for every prompt, handed to vLLM at once and yielded as each finishes (so a killed run keeps
    what is written): the same records as :func:`answer`, the top-k read off the generating pass (vLLM's raw
    log-probs). Every prompt's length is checked before any is decoded."""
    ids = []
    for prompt in prompts:
        prompt_ids = decoder.encode(prompt.messages)
        try:
            decoder.check_length(len(prompt_ids), max_new_tokens)
        except ValueError as e:
            raise ValueError(f"distill prompt {prompt.id!r}: {e}") from None
        ids.append(prompt_ids)
    from prove.train import distill

    eos = decoder.eos_ids()
    with closing(decoder.generate_many(ids, max_new_tokens, logprobs=top_k)) as results:
        for j, result in results:
            rec = distill._record(prompts[j], ids[j], result, eos)
            if top_k > 0:
                rec["topk_ids"] = [[i for i, _ in position] for position in result.top_logprobs]
                rec["topk_logprobs"] = [[lp for _, lp in position] for position in result.top_logprobs]
            yield rec
