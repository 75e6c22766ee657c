"""Executor: turns a scheduler output into model inputs, runs the model, samples the next tokens."""
