"""prove.train — stages (sft, mars, distill), Trainer subclass, losses and block masks."""
