"""Engine core: request state, KV block accounting, scheduling, detokenization. Pure Python."""
