"""Training loops (pretrain, GRPO), the run scaffold they share, and their pieces; loops never
import the lab."""
