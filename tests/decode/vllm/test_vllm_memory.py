"""Every vLLM engine is sized before it starts (``prove.decode.vllm.memory``): the KV cache computed from a given
free-memory figure on the CPU, the utilization on a shared GPU, the one-line refusal of an engine that cannot fit
(before vLLM is asked for anything), and the documented override forms composing as written. No engine starts
here; the default path's real engine runs in test_vllm_engine.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prove.decode.config import VllmOptions
from prove.decode.vllm import backend as vllm_backend
from prove.decode.vllm import memory as vllm_memory
from prove.decode.vllm.memory import (
    CPU_MARGIN,
    GPU_MARGIN,
    EngineMemoryError,
    Footprint,
    GiB,
    MemoryReading,
    MiB,
    footprint,
    gpus_from_smi,
    parameter_count,
    plan_cpu,
    plan_gpu,
)

pytestmark = pytest.mark.filterwarnings("ignore:checkpoint .* records no trained block size")

ROOT = Path(__file__).resolve().parents[3]
# SmolLM2-135M-like in fp32: 46 KB of KV a token, 1,024-token sequences, 64 at most at once
FP = Footprint(weight_bytes=1 * GiB, kv_bytes_per_token=46_080, max_model_len=1024, max_num_seqs=64)


def cpu(free_gib: float, total_gib: float = 16.0) -> MemoryReading:
    return MemoryReading(int(free_gib * GiB), int(total_gib * GiB))


def test_cpu_default_kv_is_capped_by_what_the_sequences_can_fill_then_by_half_the_free_memory():
    # plenty free: the most 64 sequences of 1,024 tokens use (2.81 GiB), not half of 13 GiB
    (updates, line) = plan_cpu(FP, cpu(16))
    assert updates == {"kv_cache_memory_bytes": FP.max_kv_bytes} and "vllm.kv_cache_gb sets it" in line
    # 4 GiB free: half of what the weights (1) and the margin (2) leave, rounded down to a MiB
    (updates, _) = plan_cpu(FP, cpu(4))
    half = (4 * GiB - 1 * GiB - CPU_MARGIN) // 2
    assert updates["kv_cache_memory_bytes"] == half // MiB * MiB
    assert FP.min_kv_bytes < updates["kv_cache_memory_bytes"] < FP.max_kv_bytes
    # just above one sequence's worth left: that one sequence, not half of it (vLLM refuses less)
    tight = cpu((1 * GiB + CPU_MARGIN + FP.min_kv_bytes * 1.5) / GiB)
    assert plan_cpu(FP, tight)[0]["kv_cache_memory_bytes"] == FP.min_kv_bytes


def test_cpu_engine_that_cannot_fit_names_what_it_needs_what_is_free_and_the_knob():
    with pytest.raises(EngineMemoryError) as e:
        plan_cpu(FP, cpu(2.9, 16.71))  # 2.9 GiB < 1 weights + 2 margin + 0.04 of KV
    msg = str(e.value)
    assert "2.90 GiB is free of 16.71 GiB" in msg and "weights 1.00 GiB" in msg
    assert "vllm.max_model_len" in msg
    # the knob is spelt as the command line that started it spells it
    with pytest.raises(EngineMemoryError, match=r"lower distill\.vllm\.max_model_len"):
        plan_cpu(FP, cpu(2.9), prefix="distill.vllm.")


def test_cpu_explicit_kv_cache_is_kept_and_checked():
    assert plan_cpu(FP, cpu(8), kv_bytes=2 * GiB)[0] == {"kv_cache_memory_bytes": 2 * GiB}
    with pytest.raises(EngineMemoryError, match=r"lower vllm\.kv_cache_gb") as e:
        plan_cpu(FP, cpu(4.5), kv_bytes=2 * GiB)  # 1 + 2 + 2 > 4.5
    assert "needs 5.00 GiB" in str(e.value)
    half = FP.min_kv_bytes // 2 - 1
    with pytest.raises(
        EngineMemoryError,
        match=rf"holds {half // FP.kv_bytes_per_token} tokens, less than one sequence of max_model_len=1024",
    ):
        plan_cpu(FP, cpu(8), kv_bytes=half)  # vLLM would refuse it in its subprocess


def test_cpu_utilization_is_vllms_own_sizing_and_checked_as_vllm_checks_it():
    # vLLM: utilization × the node's total must be free at start, or its engine process dies
    assert plan_cpu(FP, cpu(10, 16), utilization=0.5) == ({}, "vLLM's own sizing: 0.5 of 16.00 GiB")
    with pytest.raises(EngineMemoryError, match=r"vllm\.engine_args\.gpu_memory_utilization=0\.92 reserves"):
        plan_cpu(FP, cpu(15.11, 16.71), utilization=0.92)  # the issue's own figures


def test_gpu_default_is_vllms_where_free_and_lowered_on_a_gpu_in_use():
    gpu = MemoryReading(80 * GiB, 80 * GiB, "GPU 0")
    assert plan_gpu(FP, [gpu])[0] == {}  # a free GPU: vLLM's 0.92, nothing changed
    shared = [gpu, MemoryReading(40 * GiB, 80 * GiB, "GPU 1")]  # tensor parallel over 2, the second half used
    (updates, line) = plan_gpu(FP, shared)
    assert updates == {"gpu_memory_utilization": 0.48} and "GPU 1 has 40.00 GiB free" in line  # (40 − 1) / 80
    with pytest.raises(
        EngineMemoryError, match=r"engine_args\.gpu_memory_utilization=0\.9 claims 72\.00 GiB of GPU 1"
    ):
        plan_gpu(FP, shared, utilization=0.9)
    big = Footprint(
        weight_bytes=38 * GiB, kv_bytes_per_token=FP.kv_bytes_per_token, max_model_len=1024, max_num_seqs=1
    )
    with pytest.raises(EngineMemoryError, match=r"does not fit on GPU 1.*vllm\.tensor_parallel_size"):
        plan_gpu(big, shared)  # 38 + 1 margin + KV > the 39 left
    # a set KV cache is passed on and must fit inside the claim
    assert plan_gpu(FP, [gpu], kv_bytes=4 * GiB)[0] == {"kv_cache_memory_bytes": 4 * GiB}
    with pytest.raises(EngineMemoryError, match="raise vllm.engine_args.gpu_memory_utilization"):
        plan_gpu(FP, [gpu], kv_bytes=4 * GiB, utilization=0.06)  # 4.8 GiB < 1 + 4 + 1
    assert GPU_MARGIN == 1 * GiB


def test_nvidia_smi_readings_follow_cuda_visible_devices():
    out = "0, GPU-aaa, 81000, 81559\n1, GPU-bbb, 1000, 81559\n2, GPU-ccc, 40000, 81559\n"
    assert [g.where for g in gpus_from_smi(out, None, 2)] == ["GPU 0", "GPU 1"]
    picked = gpus_from_smi(out, "2,0", 2)
    assert [g.where for g in picked] == ["GPU 2", "GPU 0"] and picked[0].free == 40000 * MiB
    assert [g.where for g in gpus_from_smi(out, "GPU-bbb", 1)] == ["GPU 1"]


def test_footprint_counts_the_weights_from_the_checkpoint_in_the_engines_dtype(checkpoints):
    from transformers import AutoConfig, AutoModelForCausalLM

    mars = checkpoints["mars"]
    config = AutoConfig.from_pretrained(mars)
    n = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(mars).parameters())
    assert parameter_count(mars, config) == n  # from the safetensors headers, tied head counted once
    estimate = parameter_count("some/hub-id", config)  # no folder: from the config alone
    assert abs(estimate - n) / n < 0.05
    one = footprint([(mars, config)], dtype="float32", max_model_len=None, max_num_seqs=4)
    two = footprint([(mars, config)] * 2, dtype="bfloat16", max_model_len=256, max_num_seqs=4)
    assert one.weight_bytes == 4 * n and two.weight_bytes == 2 * 2 * n  # twice the model, half the bytes
    head_dim = config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim
    assert one.kv_bytes_per_token == 4 * per_token and two.kv_bytes_per_token == 2 * 2 * per_token
    assert one.max_model_len == config.max_position_embeddings and two.max_model_len == 256
    tp = footprint(
        [(mars, config)], dtype="float32", max_model_len=None, max_num_seqs=4, tensor_parallel_size=2
    )
    assert tp.weight_bytes == 2 * n  # one GPU's share


def test_the_decoder_plans_before_vllm_is_asked_for_anything(checkpoints, monkeypatch):
    def no_engine(args):
        raise AssertionError("vLLM must not start for an engine that cannot fit")

    monkeypatch.setattr(vllm_backend, "start_llm", no_engine)
    mars = checkpoints["mars"]
    options = VllmOptions(max_num_seqs=8, max_model_len=512)
    monkeypatch.setattr(vllm_memory, "read_cpu_memory", lambda node=0: cpu(6))
    dec = vllm_backend.VllmDecoder(mars, method="prove-lossless", options=options, start=False)
    fp = footprint([(mars, _config(mars))] * 2, dtype="float32", max_model_len=512, max_num_seqs=8)
    # the checkpoint drafts for itself: its weights and KV counted twice, all 8 sequences of 512 tokens fit
    assert dec.engine_args["kv_cache_memory_bytes"] == fp.max_kv_bytes
    assert "8 sequences of 512 tokens" in dec.memory_plan
    monkeypatch.setattr(vllm_memory, "read_cpu_memory", lambda node=0: cpu(1.0))
    with pytest.raises(EngineMemoryError, match=r"1\.00 GiB is free"):
        vllm_backend.VllmDecoder(mars, method="ar", options=options)
    # prove-serve: the same plan, its knobs top-level keys, before it hands over to vLLM's server
    from prove.decode.vllm.serve import ServeConfig, server_argv

    with pytest.raises(EngineMemoryError, match=r"lower max_model_len"):
        server_argv(ServeConfig(model=mars, method="ar", max_model_len=512))
    monkeypatch.setattr(vllm_memory, "read_cpu_memory", lambda node=0: cpu(6))
    argv, args = server_argv(ServeConfig(model=mars, method="ar", max_model_len=512, kv_cache_gb=0.5))
    assert args["kv_cache_memory_bytes"] == GiB // 2 and "--kv-cache-memory-bytes" in argv
    # vLLM's legacy variable overrides every argument, so it is what gets checked
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "8")
    with pytest.raises(EngineMemoryError, match=r"KV cache 8\.00 GiB"):
        vllm_backend.VllmDecoder(mars, method="ar", options=options, start=False)


def test_prove_decode_refuses_an_engine_that_cannot_fit_in_one_line(checkpoints, tmp_path):
    import subprocess
    import sys

    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    cmd = [
        sys.executable,
        "-m",
        "prove.decode.cli",
        "backend=vllm",
        f"model={checkpoints['mars']}",
        "method=ar",
    ]
    cmd += [f"prompts={prompts}", f"output={tmp_path / 'o.jsonl'}", "vllm.kv_cache_gb=100000"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("prove-decode: error:")]
    assert len(errors) == 1 and "lower vllm.kv_cache_gb" in errors[0] and "GiB is free of" in errors[0]
    assert "Engine core" not in run.stderr and not (tmp_path / "o.jsonl").exists()  # vLLM never started


def _config(path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)


# -- the override forms the docs show ---------------------------------------------------------------------------

DOCUMENTED = [
    "decode/config.py",
    "train/config.py",
    "docs/training.md",
    "docs/vllm.md",
    "docs/decoding.md",
    "conf/decode/serve.yaml",
    "decode/vllm/serve.py",
    "Makefile",
    "README.md",
]
OVERRIDE = re.compile(r"(?<![\w.{])\+{0,2}((?:distill\.)?(?:vllm\.)?(?:engine_args\.\w+|kv_cache_gb)=[\w.]+)")


def _documented_overrides() -> list[str]:
    found = []
    for name in DOCUMENTED:
        found += OVERRIDE.findall((ROOT / name).read_text())
    return sorted({f for f in found if "KEY=" not in f})  # engine_args.KEY=VALUE: the pattern itself


def test_docs_show_one_engine_args_form():
    for name in DOCUMENTED + ["decode/bench/vllm_rows.py"]:
        text = (ROOT / name).read_text()
        # the command-line dict form (an unquoted key); Python's engine_args={"key": ...} is fine
        assert not re.search(r"engine_args=\{\s*\w", text), (
            f"{name} shows the dict form: write engine_args.KEY=VALUE"
        )
    assert len(_documented_overrides()) >= 6


@pytest.mark.parametrize("override", _documented_overrides())
def test_each_documented_override_composes(override):
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from prove.decode.config import register_configs

    if override.startswith("distill."):
        from prove.train.config import register_configs as register_train

        register_train()
        module, name, base = "prove.conf", "train", ["recipe=tiny", "stage=distill"]
    elif override.startswith("vllm."):
        register_configs()
        module, name, base = "prove.conf.decode", "decode", ["model=m", "prompts=p", "output=o"]
    else:
        from hydra.core.config_store import ConfigStore
        from prove.common.schema import schema_node
        from prove.decode.vllm.serve import ServeConfig

        ConfigStore.instance().store(name="serve_schema", node=schema_node(ServeConfig))
        module, name, base = "prove.conf.decode", "serve", ["model=m"]
    key, value = override.split("=")
    forms = [override, "+" + override] if "engine_args" in override else [override]
    for form in forms:  # with or without Hydra's +
        with initialize_config_module(module, version_base=None):
            cfg = compose(name, overrides=[*base, form])
        got = OmegaConf.select(cfg, key)
        assert got == value or float(got) == float(value)
        OmegaConf.to_object(cfg)  # the dataclass builds: its checks run
    prefix = re.sub(r"(engine_args\.\w+|kv_cache_gb)$", "", key)
    with initialize_config_module(module, version_base=None), pytest.raises(Exception, match="kv_cache_gbx"):
        compose(name, overrides=[*base, f"{prefix}kv_cache_gbx=1"])  # every other key stays closed


# -- against vLLM 0.32's own arithmetic and readings (issue: a floor vLLM refused, node 0 only, dtype for int8) ------


@pytest.mark.slow
def test_the_kv_floor_is_the_least_vllm_itself_accepts(tmp_path, qwen2_factory):
    """vLLM's own ``check_enough_kv_cache_memory`` on the engine config it builds (prove-lossless shape: the model
    drafts for itself, one KV pool for both) accepts the planner's least KV cache and refuses one byte less. The old
    floor (``max_model_len`` tokens, not whole blocks and the null block) is below it and fails here; so does a
    block size that is not the one vLLM's CPU platform resolves."""
    pytest.importorskip("vllm")
    import torch
    from transformers import AutoConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_utils import check_enough_kv_cache_memory
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    model = qwen2_factory(320, layers=2, hidden=64, heads=2, kv_heads=1, intermediate=128)
    model.save_pretrained(tmp_path)
    path, length = str(tmp_path), 500  # not a multiple of the block
    spec = {"method": "draft_model", "model": path, "num_speculative_tokens": 4}
    config = EngineArgs(
        model=path, skip_tokenizer_init=True, dtype="float32", max_model_len=length, enforce_eager=True,
        kv_cache_memory_bytes=2**28, speculative_config=spec,
    ).create_engine_config()  # fmt: skip
    assert config.cache_config.block_size == vllm_memory.VLLM_CPU_BLOCK_SIZE
    hf = AutoConfig.from_pretrained(path)
    fp = footprint([(path, hf)] * 2, dtype="float32", max_model_len=length, max_num_seqs=4)
    layer = FullAttentionSpec(
        block_size=config.cache_config.block_size, num_kv_heads=hf.num_key_value_heads,
        head_size=hf.hidden_size // hf.num_attention_heads, dtype=torch.float32,
    )  # fmt: skip
    layers = {f"model.{m}.layers.{i}": layer for m in range(2) for i in range(hf.num_hidden_layers)}
    layouts = [[x.name for x in CPUAttentionBackend.supported_kv_cache_layouts()]]
    resolve_kv_cache_layout(config, layouts, layers.values())
    check_enough_kv_cache_memory(config, layers, fp.min_kv_bytes)
    with pytest.raises(ValueError, match="To serve at least one request"):
        check_enough_kv_cache_memory(config, layers, fp.min_kv_bytes - 1)
    assert fp.kv_bytes_per_token * length < fp.min_kv_bytes  # what the planner allowed before


def _sysfs(root: Path, *, node_kb: dict, cgroup: dict[str, str]) -> Path:
    node = root / "devices/system/node/node0"
    node.mkdir(parents=True)
    node.joinpath("meminfo").write_text("".join(f"Node 0 {k}: {v} kB\n" for k, v in node_kb.items()))
    for name, text in cgroup.items():
        (root / "fs/cgroup" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "fs/cgroup" / name).write_text(text + "\n")
    return root


def test_cpu_memory_is_read_as_vllm_reads_it(tmp_path):
    """The node's MemFree + file pages + reclaimable slab, clamped to a container's cgroup limit as vLLM 0.32's
    ``get_memory_node_info`` clamps it — cgroup v2 and v1 (v1 was not read: a v1 container's limit was missed), v1's
    "unlimited" sentinel ignored; and, where vLLM is installed, the same figures as vLLM's own on this machine."""
    node = {"MemTotal": 16 * 2**20, "MemFree": 2 * 2**20, "Active(file)": 2**20, "Inactive(file)": 2**20}
    node["SReclaimable"] = 2**20
    bare = vllm_memory.read_cpu_memory(0, sys_root=_sysfs(tmp_path / "bare", node_kb=node, cgroup={}))
    assert (bare.total, bare.free) == (16 * GiB, 5 * GiB) and bare.where == "CPU memory (node 0)"
    v1 = {"memory/memory.limit_in_bytes": str(8 * GiB), "memory/memory.usage_in_bytes": str(6 * GiB)}
    got = vllm_memory.read_cpu_memory(0, sys_root=_sysfs(tmp_path / "v1", node_kb=node, cgroup=v1))
    assert (got.total, got.free) == (8 * GiB, 2 * GiB)
    v1["memory/memory.limit_in_bytes"] = str(2**63 - 4096)  # v1's "no limit"
    got = vllm_memory.read_cpu_memory(0, sys_root=_sysfs(tmp_path / "v1-unlimited", node_kb=node, cgroup=v1))
    assert (got.total, got.free) == (16 * GiB, 5 * GiB)
    v2 = {"memory.max": str(12 * GiB), "memory.current": str(10 * GiB)}
    got = vllm_memory.read_cpu_memory(0, sys_root=_sysfs(tmp_path / "v2", node_kb=node, cgroup=v2))
    assert (got.total, got.free) == (12 * GiB, 2 * GiB)
    pytest.importorskip("vllm")
    from vllm.utils.cpu_resource_utils import get_memory_node_info, get_visible_memory_node

    nodes = get_visible_memory_node()
    assert vllm_memory.cpu_rank_nodes(1) == nodes[:1]
    for n in nodes:
        ours, theirs = vllm_memory.read_cpu_memory(n), get_memory_node_info(n)
        assert ours.total == theirs.total_memory
        assert (
            abs(ours.free - theirs.available_memory) < 0.05 * ours.total
        )  # read a moment apart on a busy box


def test_each_cpu_rank_is_checked_against_the_numa_node_vllm_binds_it_to(tmp_path, checkpoints, monkeypatch):
    """Rank r on the r-th node this process may use (vLLM's automatic binding): a second node short of memory
    refuses the engine naming that node, though node 0 has room (node 0 alone was read); more ranks than nodes is
    refused as vLLM refuses it (checked against vLLM's own binding where it is installed)."""
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nMems_allowed_list:\t0-1\n")
    assert vllm_memory.cpu_rank_nodes(2, proc_status=status) == [0, 1]
    status.write_text("Mems_allowed_list:\t0\n")
    with pytest.raises(EngineMemoryError, match="tensor_parallel_size=2 on the CPU: vLLM binds each rank"):
        vllm_memory.cpu_rank_nodes(2, proc_status=status)
    monkeypatch.setattr(vllm_memory, "cpu_rank_nodes", lambda ranks: list(range(ranks)))

    def reading(node=0):
        free = 16 if node == 0 else 2.5
        return MemoryReading(int(free * GiB), 16 * GiB, f"CPU memory (node {node})")

    monkeypatch.setattr(vllm_memory, "read_cpu_memory", reading)
    from transformers import AutoConfig

    mars = checkpoints["mars"]
    models = [(mars, AutoConfig.from_pretrained(mars))]
    args = {"dtype": "float32", "max_model_len": 256, "max_num_seqs": 4}
    plan = vllm_memory.plan_engine_memory
    assert plan({**args, "tensor_parallel_size": 1}, models, on_cpu=True, user_args={}, kv_cache_gb=None)
    with pytest.raises(EngineMemoryError, match=r"2.50 GiB is free of 16.00 GiB in CPU memory \(node 1\)"):
        plan({**args, "tensor_parallel_size": 2}, models, on_cpu=True, user_args={}, kv_cache_gb=1.0)
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    from vllm.utils.cpu_resource_utils import get_visible_memory_node
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    ranks = len(get_visible_memory_node()) + 1
    parallel = SimpleNamespace(local_world_size=ranks, data_parallel_rank_local=None, _api_process_count=1)
    with pytest.raises(AssertionError, match="Not enough allowed NUMA nodes"):
        OMPProcessManager(SimpleNamespace(parallel_config=parallel, kv_transfer_config=None))
    monkeypatch.undo()
    with pytest.raises(EngineMemoryError, match=f"tensor_parallel_size={ranks} on the CPU"):
        vllm_memory.cpu_rank_nodes(ranks)


def test_quantized_weights_are_sized_as_stored(tmp_path, checkpoints):
    """A quantized checkpoint (``quantization_config``) is loaded as stored: its weights are its tensors' bytes as
    safetensors itself reads them, not its parameters × the engine's dtype (4x too many for int8 in fp32); any
    other checkpoint is cast to the engine's dtype."""
    from types import SimpleNamespace

    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    tensors = {
        "w.qweight": torch.zeros(64, 32, dtype=torch.int8),
        "w.fp8": torch.zeros(16, 16, dtype=torch.float8_e4m3fn),
        "w.scales": torch.ones(64, dtype=torch.bfloat16),
        "w.packed": torch.zeros(8, 4, dtype=torch.int32),
    }
    save_file(tensors, tmp_path / "model.safetensors")
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        stored = sum(f.get_tensor(k).nbytes for k in f.keys())
    quantized = SimpleNamespace(quantization_config={"quant_method": "compressed-tensors"})
    assert vllm_memory.weight_bytes(str(tmp_path), quantized, 4) == stored
    numel = sum(t.numel() for t in tensors.values())
    assert vllm_memory.weight_bytes(str(tmp_path), SimpleNamespace(), 4) == 4 * numel
    from transformers import AutoConfig

    mars = checkpoints["mars"]
    config = AutoConfig.from_pretrained(mars)
    assert vllm_memory.weight_bytes(mars, config, 2) == 2 * parameter_count(mars, config)
