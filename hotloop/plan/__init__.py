"""Capacity planning: weight and KV bytes from a model's architecture, and what fits on a GPU."""
