"""prove.train — stages (sft, mars, distill), Trainer subclass, losses and block masks.

One entry point, ``prove-train`` (:mod:`prove.train.cli`, Hydra over ``conf/train.yaml``), runs one
stage; :func:`prove.train.pipeline.train` is the same thing as a function of a
:class:`prove.train.config.TrainConfig`.

    prove-train recipe=tiny stage=sft          # runs/tiny/sft
    prove-train recipe=tiny stage=mars         # runs/tiny/mars, starting from runs/tiny/sft
    make train-proposer RECIPE=qwen2.5-32b NNODES=4 HOSTFILE=hostfile

Output layout (``run_dir = runs/<run_name>``, ``output_dir = <run_dir>/<stage>``)::

    runs/<run_name>/
      tokenizer/            the BPE trained on the data (from-scratch models only; reused by every stage and rank)
      sft/                  final checkpoint of stage sft: config.json, model.safetensors, tokenizer, prove.json
        checkpoint-<step>/  Trainer checkpoints (optimizer, scheduler, RNG): a rerun resumes from the last one
      mars/                 final checkpoint of stage mars (prove.json: block_size, mask_token, mask_token_id)
        adapter/            with peft=lora: the adapter (the merged model is at mars/)
      hydra/<stage>/<time>/ the composed config and the log of each launch

Pure parts (:mod:`~prove.train.masks`, :mod:`~prove.train.losses`, :mod:`~prove.train.collate`) import
only torch; the Trainer subclass (:mod:`~prove.train.trainer`) overrides ``compute_loss`` and ``log``.
"""
