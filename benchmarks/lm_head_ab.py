"""``hotloop bench latency`` with the LM head's GEMV launch replaced by the fastest one a
``dense_gemv.py --sections lm_head`` run found for the model's hidden size (an A/B of a launch choice
before it becomes ``dense_gemv.lm_head_config``'s default).

    python benchmarks/lm_head_ab.py DENSE_GEMV.json MODEL -- LATENCY_ARGS...   (the arguments after `latency`)

``MODEL`` names the entry of the JSON (``smollm2-135m``, ``llama3-8b``); the replacement applies
to that model's hidden size only. Prints the launch it uses, then runs the latency benchmark.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    if len(sys.argv) < 3 or "--" not in sys.argv:
        raise SystemExit(__doc__)
    sep = sys.argv.index("--")
    path, model = sys.argv[1], sys.argv[2]
    import os

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from dense_gemv import MODELS

    from hotloop.bench.offline import main as latency_main
    from hotloop.kernels import dense_gemv as dg

    models = json.load(open(path)).get("models", {})
    if model not in MODELS or "lm_head" not in models.get(model, {}):
        raise SystemExit(f"{path} has no lm_head section for {model!r} (one of {sorted(models)} with one)")
    best = models[model]["lm_head"]["best"]
    hidden = MODELS[model][0]
    cfg = dg.GemvConfig(best["block_n"], best["block_k"], best["num_warps"])
    default = dg.lm_head_config

    def chosen(k: int) -> dg.GemvConfig:
        return cfg if k == hidden else default(k)

    dg.lm_head_config = chosen
    print(
        f"LM head launch for K={hidden}: {cfg} (default {default(hidden)}); {best['us']:.1f} us in the sweep"
    )
    return latency_main(["latency", *sys.argv[sep + 1 :]])


if __name__ == "__main__":
    sys.exit(main())
