"""Model zoo (one architecture per file), registry, weight loaders and the embedded default model."""
