"""Model building blocks: linear (with weight loaders), attention over the paged cache, norms, rotary."""
