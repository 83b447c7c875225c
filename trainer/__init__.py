"""Trainer: the policy model, tokenizer, weight versions."""
