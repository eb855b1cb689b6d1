"""Studies over several runs: the ablation driver (pretrain and sweep each variant) and the representation
analysis of [CLS] vectors."""
