"""prove.train — stages (sft, mars, distill), Trainer subclass, losses and block masks.

One entry point, ``prove-train`` (:mod:`prove.train.cli`, Hydra over ``conf/train.yaml``), runs one
stage; :func:`prove.train.pipeline.train` is the same thing as a function of a
:class:`prove.train.config.TrainConfig`.

    prove-train recipe=tiny stage=sft          # runs/tiny/sft
    prove-train recipe=tiny stage=mars         # runs/tiny/mars, starting from runs/tiny/sft
    prove-train recipe=tiny stage=sft stage.role=verifier   # runs/tiny/verifier-sft (the tiny recipe's 2-layer verifier)
    prove-train recipe=tiny stage=distill      # runs/tiny/verifier-distill, fine-tuned on runs/tiny/mars's outputs
    make train-proposer RECIPE=qwen2.5-32b NNODES=4 HOSTFILE=hostfile
    make train-verifier RECIPE=tiny

Output layout (``run_dir = runs/<run_name>``, ``output_dir = <run_dir>/<stage>``)::

    runs/<run_name>/
      tokenizer/            the BPE trained on the data (from-scratch models only; reused by every stage and rank)
      sft/                  final checkpoint of stage sft: config.json, model.safetensors, tokenizer, prove.json
        checkpoint-<step>/  Trainer checkpoints (optimizer, scheduler, RNG): a rerun resumes from the last one
      mars/                 final checkpoint of stage mars (prove.json: block_size, mask_token, mask_token_id)
        adapter/            with peft=lora: the adapter (the merged model is at mars/)
      distill-data/         stage distill's generated set: shards/*.jsonl (resumable), dataset/ (save_to_disk),
                            generation.json (proposer + decode settings)
      <distill output>/     the distilled verifier (prove.json: distilled_from, generation, kl_weight);
                            the tiny recipe names its verifier folders verifier-sft/ and verifier-distill/
      hydra/<stage>/<time>/ the composed config and the log of each launch

Layout: :mod:`~prove.train.pipeline` runs the same steps for every stage and asks the stage's unit
(:mod:`~prove.train.stages`: sft, mars, distill behind one interface, in a registry) what differs — pre-training
work, dataset, collator, trainer, the prove.json fields. Pure parts (:mod:`~prove.train.masks`,
:mod:`~prove.train.losses`, :mod:`~prove.train.collate`) import only torch; :mod:`~prove.train.mars_step` composes
the MARS step from them once (torch and transformers only: the trainer, ``tools/bench_mars_step.py`` and
``make gpu-check`` run it); the Trainer subclasses (:mod:`~prove.train.trainer`) override ``compute_loss`` and
``log``; :mod:`~prove.train.modeling` builds the model
and tokenizer (checkpoints through :mod:`prove.data.loading`, shared with decoding), :mod:`~prove.train.rows` the
tokenized conversations, :mod:`~prove.train.saving` the checkpoint contract; :mod:`~prove.train.distill` holds
stage distill's generation with ``prove.decode`` (its prompts: :mod:`~prove.train.distill_prompts`) and its
training rows; :mod:`~prove.train.config` the schema (its cross-field rules: :mod:`~prove.train.config_rules`).
"""
