"""Training loops (pretrain, GRPO) and their pieces; loops never import the lab."""
