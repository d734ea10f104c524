"""Named suites for ``prove-bench`` and ``prove-decode`` (:mod:`prove.data.suites`), with MT-bench's second turns.

``mt-bench-2`` continues each question after a first answer. That answer is the model's own AR greedy output
(``first_answer_tokens`` new tokens at most), decoded once per model and cached in ``cache_dir`` as JSONL keyed by
a fingerprint of the weights, the dtype and the token limit: every method of a bench, and every later run on the
same model, continues the same conversation. A killed run resumes the cache where it stopped.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prove.data.prompts import PromptRecord
from prove.data.suites import (
    LoadedSuite,
    MTQuestion,
    first_per_category,
    get_suite,
    load_suite,
    mt_bench_questions,
)


def model_fingerprint(model: Any) -> str:
    """A hash of the model's config and a strided sample of every parameter: the same weights give the same
    hash wherever they were loaded from; a further trained checkpoint (saved over the same path) another."""
    h = hashlib.sha256(model.config.to_json_string(use_diff=False).encode())
    for name, p in sorted(model.named_parameters()):
        flat = p.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 1024)].float().cpu().numpy()
        h.update(name.encode() + str(tuple(p.shape)).encode() + sample.tobytes())
    return h.hexdigest()


def cache_file(cache_dir: str | Path, fingerprint: str, dtype: str, max_new_tokens: int) -> Path:
    return Path(cache_dir) / f"mt-bench-first-answers-{fingerprint[:16]}-{dtype}-{max_new_tokens}tok.jsonl"


def read_cache(path: Path) -> dict[int, str]:
    """Question id → first answer, from the complete lines of a cache file (a half-written last line is dropped)."""
    from prove.data.prompts import finished_ids

    if not path.is_file():
        return {}
    finished_ids(path)  # truncates a half-written last line
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        out[int(rec["id"])] = rec["answer"]
    return out


def first_answers(
    questions: Sequence[MTQuestion],
    generate: Callable[[list[dict[str, str]]], tuple[str, int]],
    cache: Path,
    meta: Mapping[str, Any],
    progress: bool = False,
) -> dict[int, str]:
    """Every question's first answer: from ``cache``, else ``generate(messages) -> (text, new tokens)`` (appended
    to ``cache`` as each finishes, with ``meta``)."""
    import sys

    from tqdm import tqdm

    have = read_cache(cache)
    todo = [q for q in questions if q.id not in have]
    if todo:
        cache.parent.mkdir(parents=True, exist_ok=True)
        with cache.open("a", encoding="utf-8") as f:
            for q in tqdm(todo, desc="mt-bench first answers (ar)", file=sys.stderr, disable=not progress):
                text, n = generate([{"role": "user", "content": q.turns[0]}])
                have[q.id] = text
                rec = {"id": q.id, "answer": text, "new_tokens": n, **meta}
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                f.flush()
    return {q.id: have[q.id] for q in questions}


def ar_generate(
    model: Any, tokenizer: Any, device: str, max_new_tokens: int
) -> Callable[[list[dict[str, str]]], tuple[str, int]]:
    """The AR greedy decode of chat messages with our engine (no stop strings: EOS or the token limit)."""
    from prove.decode.decoder import Decoder

    decoders: list[Decoder] = []  # built on the first answer not in the cache

    def generate(messages: list[dict[str, str]]) -> tuple[str, int]:
        if not decoders:
            decoders.append(Decoder(model, tokenizer, method="ar", device=device))
        out = decoders[0].generate(messages, max_new_tokens=max_new_tokens)
        return out.text, len(out.token_ids)

    return generate


@dataclass
class SuiteInputs:
    """What the named suites give a run: the records, each one's suite, a check per record (or None), and a
    record of where each suite came from (bench.json's ``suites``)."""

    records: list[PromptRecord] = field(default_factory=list)
    suites: list[str] = field(default_factory=list)
    checks: list[Callable[[str], bool] | None] = field(default_factory=list)
    info: dict[str, dict[str, Any]] = field(default_factory=dict)


def suite_names(value: Any) -> list[str]:
    """``suite=mt-bench`` or ``suite=[mt-bench,humaneval]`` as a checked list of names."""
    names = [value] if isinstance(value, str) else list(value or ())
    for n in names:
        get_suite(n)
    if len(set(names)) != len(names):
        raise ValueError(f"suite={names}: name each suite once")
    return names


def per_category_counts(value: Any, names: Sequence[str]) -> dict[str, int | None]:
    """``per_category`` as a count per suite: one value for every suite (``per_category=4``), or a mapping of suite to
    count (``per_category={mt-bench:5,humaneval:40}``; a suite it leaves out: all its prompts). Each count ≥ 1."""
    if value is None or isinstance(value, int):
        counts: dict[str, int | None] = {n: value for n in names}
    elif isinstance(value, Mapping):
        unknown = sorted(set(map(str, value)) - set(names))
        if unknown:
            raise ValueError(f"per_category names {unknown}, which suite={list(names)} does not run")
        counts = {n: value.get(n) for n in names}
    else:
        raise ValueError(f"per_category={value!r}: give a count, or a count per suite like {{mt-bench:5}}")
    bad = {n: c for n, c in counts.items() if c is not None and (not isinstance(c, int) or c < 1)}
    if bad:
        raise ValueError(
            f"per_category={value!r}: every count must be an integer ≥ 1 (or null for all): {bad}"
        )
    return counts


def check_suites(names: Sequence[str], sources: Mapping[str, str] | None = None) -> None:
    """Read every suite's file (``mt-bench-2``: MT-bench's questions) without a model: a missing package or a bad
    ``sources`` entry fails here, as one line, before anything slow starts."""
    sources = dict(sources or {})
    unknown = set(sources) - set(names)
    if unknown:
        raise ValueError(f"suite_files names {sorted(unknown)}, which suite={list(names)} does not run")
    for name in names:
        if get_suite(name).needs_answers:
            mt_bench_questions(sources.get(name))
        else:
            load_suite(name, source=sources.get(name))


def load_suites(
    names: Sequence[str],
    *,
    model: Any = None,
    tokenizer: Any = None,
    device: str = "cpu",
    dtype: str = "float32",
    per_category: int | Mapping[str, int] | None = None,
    sources: Mapping[str, str] | None = None,
    first_answer_tokens: int = 256,
    cache_dir: str | Path = "outputs/suites",
    run_code: bool = False,
    progress: bool = False,
) -> SuiteInputs:
    """The records of every suite in ``names`` (each suite's first ``per_category`` per category: one count or one
    per suite, :func:`per_category_counts`), ``sources``
    naming a local copy of a suite's file. ``mt-bench-2`` decodes (or reads from the cache) the model's AR greedy
    first answers. HumanEval's pass@1 runs model-written code: its check is given only with ``run_code``."""
    from prove.data.synthetic import score

    sources = dict(sources or {})
    unknown = set(sources) - set(names)
    if unknown:
        raise ValueError(f"suite_files names {sorted(unknown)}, which suite={list(names)} does not run")
    out = SuiteInputs()
    counts = per_category_counts(per_category, names)
    for name in names:
        src = sources.get(name)
        if not get_suite(name).needs_answers:
            loaded = load_suite(name, source=src, per_category=counts[name])
            info: dict[str, Any] = {}
        else:
            loaded, info = _second_turns(
                src, model, tokenizer, device, dtype, counts[name], first_answer_tokens, cache_dir, progress
            )
        check = loaded.check if name != "humaneval" or run_code else None
        if loaded.check is None and name == "arithmetic":
            check = score
        out.info[name] = _info(loaded, info, check is not None or not any(r.answer for r in loaded.records))
        for rec in loaded.records:
            out.records.append(rec)
            out.suites.append(name)
            out.checks.append(_bind(check, rec.answer))
    ids = [repr(r.id) for r in out.records]
    if len(set(ids)) != len(ids):
        raise ValueError("two suites share a prompt id: run them in separate benches")
    return out


def configured_sources(cfg: Any) -> dict[str, str]:
    """``suite_files=`` of a prove-bench / prove-decode config: suite name → a local copy of its file."""
    return {str(k): str(v) for k, v in (getattr(cfg, "suite_files", None) or {}).items()}


def load_configured(cfg: Any, *, model: Any, tokenizer: Any, **extra: Any) -> SuiteInputs:
    """``load_suites`` on what a prove-bench / prove-decode config names (``suite``, ``suite_files``, ``device``,
    ``dtype``, ``per_category``, ``first_answer_tokens``, ``suite_cache``); ``extra``: ``run_code``, ``progress``."""
    return load_suites(
        suite_names(cfg.suite),
        model=model,
        tokenizer=tokenizer,
        device=cfg.device,
        dtype=cfg.dtype,
        per_category=cfg.per_category,
        sources=configured_sources(cfg),
        first_answer_tokens=cfg.first_answer_tokens,
        cache_dir=cfg.suite_cache,
        **extra,
    )


def _bind(check: Callable[[str, str], bool] | None, answer: str | None) -> Callable[[str], bool] | None:
    if check is None or answer is None:
        return None
    return lambda text: bool(check(text, answer))


def _info(loaded: LoadedSuite, extra: Mapping[str, Any], scored: bool) -> dict[str, Any]:
    s = loaded.suite
    cats: dict[str, int] = {}
    for r in loaded.records:
        cats[str(r.category)] = cats.get(str(r.category), 0) + 1
    return {
        "title": s.title,
        "generated": s.generated,
        "package": s.package,
        "version": loaded.version,
        "source": loaded.source,
        "n": len(loaded.records),
        "categories": cats,
        "scored": scored,
        **extra,
    }


def _second_turns(
    source: str | None,
    model: Any,
    tokenizer: Any,
    device: str,
    dtype: str,
    per_category: int | None,
    max_new_tokens: int,
    cache_dir: str | Path,
    progress: bool,
) -> tuple[LoadedSuite, dict[str, Any]]:
    if model is None or tokenizer is None:
        raise ValueError("suite mt-bench-2 continues the model's own first answers: it needs the model")
    if max_new_tokens < 1:
        raise ValueError(f"first_answer_tokens={max_new_tokens} must be ≥ 1")
    questions = mt_bench_questions(source)
    first = load_suite("mt-bench", source=source, per_category=per_category)
    keep = {r.id for r in first_per_category(first.records, per_category)}
    questions = [q for q in questions if f"mt-bench/{q.id}" in keep]
    fingerprint = model_fingerprint(model)
    cache = cache_file(cache_dir, fingerprint, dtype, max_new_tokens)
    meta = {
        "model": getattr(model.config, "_name_or_path", None),
        "fingerprint": fingerprint,
        "dtype": dtype,
        "method": "ar",
        "max_new_tokens": max_new_tokens,
    }
    answers = first_answers(
        questions, ar_generate(model, tokenizer, device, max_new_tokens), cache, meta, progress
    )
    loaded = load_suite("mt-bench-2", source=source, per_category=per_category, first_answers=answers)
    return loaded, {
        "first_answer": {"method": "AR greedy", "max_new_tokens": max_new_tokens, "cache": str(cache)}
    }
