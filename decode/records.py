"""Prompt files in, JSONL records out: what ``prove-decode`` runs (docs/design.md §3.1).

Reading prompts is :mod:`prove.data.prompts`. Output: JSONL, one record per prompt (``id``, ``prompt``,
``completion``, ``token_ids`` = new tokens only, ``stats``, ``method``), written and flushed as each
finishes. An output file that already holds records is resumed: finished ids are skipped and a
half-written last line (a killed run) is dropped, so nothing finished is lost or repeated.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prove.data.prompts import PromptRecord, finished_ids, read_prompts, render

if TYPE_CHECKING:
    from prove.decode.config import DecodeConfig
    from prove.decode.decoder import Decoder
    from prove.decode.vllm.backend import VllmDecoder

__all__ = ["decode_prompts", "decode_records", "run"]


def decode_prompts(
    decoder: Decoder,
    records: list[PromptRecord],
    output: str | Path,
    *,
    max_new_tokens: int,
    stop: list[str] | None = None,
    chat: bool = False,
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """Decode ``records`` not yet in ``output``, appending one flushed JSONL record per prompt.

    Each prompt is seeded with ``seed`` + its position in the file, so a resumed run samples as an
    uninterrupted one would.
    """

    def one_at_a_time(encoded: list[list[int]], seeds: list[int]) -> Iterator[tuple[int, Any]]:
        for j, (ids, s) in enumerate(zip(encoded, seeds, strict=True)):
            yield j, decoder.generate(ids, max_new_tokens=max_new_tokens, stop=stop, seed=s)

    return _decode_file(decoder, records, output, one_at_a_time, max_new_tokens, chat, seed, progress)


def _decode_file(
    decoder: Any,
    records: list[PromptRecord],
    output: str | Path,
    generate: Callable[[list[list[int]], list[int]], Iterator[tuple[int, Any]]],
    max_new_tokens: int,
    chat: bool,
    seed: int,
    progress: bool,
) -> Path:
    """The file loop both decoders share: skip the records already in ``output``, encode and length-check every
    other one before any is decoded, then append one flushed record per result of ``generate(encoded, seeds)``
    (``(index into the unfinished prompts, result)``, in any order), prompt i seeded with ``seed + i``."""
    from tqdm import tqdm

    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    done = finished_ids(output)
    todo = [(i, r) for i, r in enumerate(records) if repr(r.id) not in done]
    encoded = []
    for _, rec in todo:  # a prompt too long for the models, or empty, fails here, before anything is decoded
        ids = decoder.encode(render(rec, chat))
        try:
            decoder.check_length(len(ids), max_new_tokens)
        except ValueError as e:
            where = f" (line {rec.line} of the prompt file)" if rec.line is not None else ""
            raise ValueError(f"prompt {rec.id!r}{where}: {e}") from None
        encoded.append(ids)
    bar = tqdm(
        total=len(records),
        initial=len(records) - len(todo),
        file=sys.stderr,
        disable=not progress,
        unit="prompt",
    )
    with output.open("a") as f:
        for j, result in generate(encoded, [seed + i for i, _ in todo]):
            row = output_record(todo[j][1], result, decoder.method.name)
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            f.flush()
            bar.set_postfix(tok_per_cycle=f"{result.stats.tokens_per_cycle:.2f}")
            bar.update()
    bar.close()
    return output


def output_record(rec: PromptRecord, result: Any, method: str) -> dict[str, Any]:
    """One output line: the prompt's id and text, the completion, its new token ids, the method and the stats
    (both backends write these)."""
    return {
        "id": rec.id,
        "prompt": rec.prompt,
        **({"category": rec.category} if rec.category is not None else {}),
        "completion": result.text,
        "token_ids": result.token_ids,
        "method": method,
        "stats": result.stats.to_dict(),
    }


def run(cfg: DecodeConfig) -> Path:
    """The ``prove-decode`` run: load the models, decode the prompt file, write the output file."""
    from prove.decode.decoder import Decoder
    from prove.decode.methods import resolve_params

    resolve_params(
        cfg.method, cfg.proposer, **vars(cfg.params())
    )  # every parameter checked before any file or model
    records = read_prompts(cfg.prompts) if cfg.prompts is not None else suite_records(cfg)
    if cfg.backend == "vllm":
        return _run_vllm(cfg, records)
    decoder = Decoder(
        cfg.model,
        method=cfg.method,
        proposer=cfg.proposer,
        verifier=cfg.verifier,
        draft=cfg.draft,
        device=cfg.device,
        dtype=cfg.dtype,
        trace=cfg.trace,
        cache_len=cfg.cache_len,
        **vars(cfg.params()),
    )
    if records is None:  # mt-bench-2: the second turns follow this model's own AR first answers
        records = suite_records(cfg, decoder.model, decoder.tokenizer)
        assert records is not None, "given the model, every suite loads"
    return decode_prompts(
        decoder,
        records,
        cfg.output,
        max_new_tokens=cfg.max_new_tokens,
        stop=list(cfg.stop),
        chat=cfg.chat,
        seed=cfg.seed,
    )


def suite_records(cfg: DecodeConfig, model: Any = None, tokenizer: Any = None) -> list[PromptRecord] | None:
    """``suite=``'s records (``prove.decode.suites``); without ``model``, None when a suite needs it (``mt-bench-2``)
    after every suite's file has been read (a missing package fails before any model loads)."""
    import dataclasses

    from prove.data.suites import get_suite
    from prove.decode.suites import check_suites, configured_sources, load_configured, suite_names

    names = suite_names(cfg.suite)
    if model is None:
        check_suites(names, configured_sources(cfg))
        if any(get_suite(n).needs_answers for n in names):
            return None
    loaded = load_configured(cfg, model=model, tokenizer=tokenizer)
    return [
        dataclasses.replace(r, category=f"{s}/{r.category}")
        for r, s in zip(loaded.records, loaded.suites, strict=True)
    ]


def _run_vllm(cfg: DecodeConfig, records: list[PromptRecord] | None) -> Path:
    """``backend=vllm``: every prompt to vLLM at once (``prove.decode.vllm.backend``), the same records."""
    assert records is not None, (
        "DecodeConfig refuses mt-bench-2 (our engine's first answers) with backend=vllm"
    )
    import warnings

    from prove.decode.vllm.backend import VllmDecoder

    if cfg.verifier is not None and cfg.method != "prove":
        warnings.warn(
            f"backend=vllm runs no separate verifier for method={cfg.method} (nor a trace probe); ignoring verifier=",
            stacklevel=2,
        )
    decoder = VllmDecoder(
        cfg.model,
        method=cfg.method,
        proposer=cfg.proposer,
        draft=cfg.draft,
        verifier=cfg.verifier if cfg.method == "prove" else None,
        device=cfg.device,
        dtype=cfg.dtype,
        options=cfg.vllm,
        trace=cfg.trace,
        **vars(cfg.params()),
    )
    try:
        return decode_records(
            decoder,
            records,
            cfg.output,
            max_new_tokens=cfg.max_new_tokens,
            stop=list(cfg.stop),
            chat=cfg.chat,
            seed=cfg.seed,
        )
    finally:
        decoder.close()


def decode_records(
    decoder: VllmDecoder,
    records: list[Any],
    output: str | Path,
    *,
    max_new_tokens: int,
    stop: list[str] | None = None,
    chat: bool = False,
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """``prove-decode backend=vllm``: ``prove.decode.records.decode_prompts`` with every unfinished prompt handed to
    vLLM at once (``options.concurrency`` in flight), one record appended and flushed per prompt as it finishes —
    the same records, resumed the same way, prompt i seeded with ``seed + i``."""

    def batched(encoded: list[list[int]], seeds: list[int]) -> Iterator[tuple[int, Any]]:
        return decoder.generate_many(encoded, max_new_tokens, stop, seeds=seeds)

    return _decode_file(decoder, records, output, batched, max_new_tokens, chat, seed, progress)
