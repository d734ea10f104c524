"""Load chat datasets in the Dolci schema: one conversation per row, ``{id, messages, source}`` with
``messages = [{role, content, function_calls, functions}]`` (tool use: see :func:`prove.data.chat.to_template_messages`).

Dolci (allenai/Dolci-Instruct-SFT, allenai/Dolci-Think-SFT-*) is the SFT mixture ProVe trains on
(docs/design.md §2.1); any dataset with the same ``messages`` column works: a hub id, a local JSONL / JSON /
parquet file, a glob or folder of them, or a ``Dataset.save_to_disk`` folder.
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import datasets

# File suffix -> the `datasets` packaged builder that reads it.
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
# Files `save_to_disk` writes at the top of its folder (a Dataset, or a DatasetDict).
_SAVED_MARKERS = ("state.json", "dataset_info.json", "dataset_dict.json")
_FIX = "pass data.path=<jsonl/parquet/dir> or a hub id"


def load_chat_dataset(
    source: str,
    split: str = "train",
    *,
    name: str | None = None,
    num_rows: int | None = None,
) -> datasets.Dataset:
    """Load ``source`` as a ``datasets.Dataset`` whose rows carry a ``messages`` list.

    Args:
        source: a local file (``.jsonl``, ``.json``, ``.parquet``), a glob of such files, a folder
            holding them (searched recursively) or written by ``save_to_disk``, or a hub id such as
            ``allenai/Dolci-Instruct-SFT`` (loaded with ``datasets.load_dataset``).
        split: the split of a hub dataset or of a saved ``DatasetDict``. Local files have no
            splits: they are loaded whole, whatever ``split`` says.
        name: the hub dataset's config name, if it has several.
        num_rows: keep only the first ``num_rows`` rows (a quick run or a smoke test).

    Raises:
        ValueError: nothing at ``source``, an unsupported file type, no ``messages`` column, or a
            bad ``num_rows`` — each message says what to change.
    """
    if num_rows is not None and num_rows < 1:
        raise ValueError(f"num_rows must be >= 1 (got {num_rows}); leave it unset to load every row")
    ds = _load(str(source), split, name)
    if "messages" not in ds.column_names:
        raise ValueError(
            f"the dataset at {source!r} has no `messages` column (columns: {ds.column_names}); "
            "rows must follow the Dolci chat schema: messages=[{role, content}, ...]"
        )
    if num_rows is not None and num_rows < len(ds):
        ds = ds.select(range(num_rows))
    return ds


def _load(source: str, split: str, name: str | None) -> datasets.Dataset:
    import datasets

    if any(ch in source for ch in "*?["):
        files = [f for f in sorted(glob.glob(str(Path(source).expanduser()), recursive=True)) if _suffix(f)]
        if not files:
            raise ValueError(
                f"no dataset at {source!r}: the pattern matches no .jsonl/.json/.parquet file; {_FIX}"
            )
        return _load_files(files)

    path = Path(source).expanduser()
    if path.is_file():
        if not _suffix(path):
            raise ValueError(
                f"cannot read {source!r}: unsupported file type {path.suffix!r} "
                f"(use one of {sorted(BUILDERS)}); {_FIX}"
            )
        return _load_files([str(path)])
    if path.is_dir():
        if any((path / marker).is_file() for marker in _SAVED_MARKERS):
            return _load_saved(path, split)
        files = sorted(str(f) for f in path.rglob("*") if f.is_file() and _suffix(f))
        if not files:
            raise ValueError(
                f"no dataset at {source!r}: the folder holds no .jsonl/.json/.parquet file and was not "
                f"written by save_to_disk; {_FIX}"
            )
        return _load_files(files)
    if not _looks_like_hub_id(source):
        raise ValueError(f"no dataset at {source!r}: {_FIX}")
    try:
        return datasets.load_dataset(source, name, split=split)
    except (ConnectionError, FileNotFoundError) as err:  # offline, or no such hub dataset
        raise ValueError(
            f"no dataset at {source!r}: not a local path, and loading it from the hub failed ({err}); {_FIX}"
        ) from err


def _suffix(path: str | Path) -> str | None:
    suffix = Path(path).suffix.lower()
    return suffix if suffix in BUILDERS else None


def _load_files(files: list[str]) -> datasets.Dataset:
    import datasets

    builders = {BUILDERS[Path(f).suffix.lower()] for f in files}
    if len(builders) > 1:
        raise ValueError(f"cannot mix JSON and parquet files in one dataset ({len(files)} files); {_FIX}")
    return datasets.load_dataset(builders.pop(), data_files={"train": files}, split="train")


def _load_saved(path: Path, split: str) -> datasets.Dataset:
    import datasets

    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ValueError(
                f"{str(path)!r} has splits {sorted(ds)}, not {split!r}: set data.split to one of them"
            )
        ds = ds[split]
    return ds


def _looks_like_hub_id(source: str) -> bool:
    """``org/name`` or a bare ``name``: no path prefix, no data-file suffix."""
    if source.startswith(("/", ".", "~")) or "\\" in source or _suffix(source):
        return False
    parts = source.split("/")
    return 1 <= len(parts) <= 2 and all(parts)
