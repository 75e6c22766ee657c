"""Turbo models vs Hugging Face transformers: logits of paged prefill, decode and chunked prefill.

Every architecture is built tiny and random with transformers, saved, loaded with ``load_model``
and driven through a paged KV cache (block size 4, shuffled non-contiguous blocks, cache filled
with garbage so a read of an unwritten slot shows). Its logits at every fed position must match
transformers' full-sequence forward within ATOL/RTOL (float32).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from hotloop.layers.attention import AttentionMetadata
from hotloop.models.loader import load_model

ATOL = 1e-4
RTOL = 1e-4
BLOCK_SIZE = 4
NUM_BLOCKS = 48

SMALL: dict[str, Any] = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
)


def _small(**overrides: Any) -> dict[str, Any]:
    return {**SMALL, **overrides}


CONFIGS: dict[str, Any] = {
    "llama-gqa": lambda: LlamaConfig(**_small()),
    "llama-mha-tied": lambda: LlamaConfig(**_small(num_key_value_heads=4, tie_word_embeddings=True)),
    "llama-3heads-1kv-hd32-bias": lambda: LlamaConfig(
        **_small(
            num_attention_heads=3, num_key_value_heads=1, head_dim=32, hidden_size=48, num_hidden_layers=3
        ),
        attention_bias=True,
        mlp_bias=True,
    ),
    "llama-rope-llama3": lambda: LlamaConfig(
        **_small(),
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "llama-rope-linear": lambda: LlamaConfig(
        **_small(), rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.5}
    ),
    "llama-rope-dynamic": lambda: LlamaConfig(
        **_small(), rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    ),
    "mistral-full": lambda: MistralConfig(**_small(), sliding_window=None),
    "mistral-window5": lambda: MistralConfig(**_small(), sliding_window=5),
    "qwen2-bias-tied-window-off": lambda: Qwen2Config(
        **_small(), tie_word_embeddings=True, use_sliding_window=False, sliding_window=4
    ),
    "qwen2-window-some-layers": lambda: Qwen2Config(
        **_small(num_hidden_layers=3), use_sliding_window=True, sliding_window=6, max_window_layers=1
    ),
    "qwen3-qknorm": lambda: Qwen3Config(**_small(head_dim=32)),
    "qwen3-qknorm-bias-mha": lambda: Qwen3Config(
        **_small(num_attention_heads=3, num_key_value_heads=3, head_dim=16), attention_bias=True
    ),
}


@torch.no_grad()
def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Weights large enough that attention is far from uniform; norm weights away from 1."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=gen)
        p.copy_(1.0 + 0.2 * noise if "norm" in name else 0.12 * noise)


def _hf_model(config: Any, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize(model, seed)
    return model.eval()


@torch.no_grad()
def _hf_logits(model: Any, tokens: list[int]) -> torch.Tensor:
    return model(torch.tensor([tokens])).logits[0].float()


class PagedRunner:
    """Drives a hotloop model step by step the way the executor does, owning a small paged cache."""

    def __init__(self, model: Any, seed: int = 0) -> None:
        self.model = model
        args = model.args
        gen = torch.Generator().manual_seed(seed)
        shape = (NUM_BLOCKS, BLOCK_SIZE, args.num_kv_heads, args.head_dim)
        self.kv_caches = [
            (torch.randn(shape, generator=gen) * 50, torch.randn(shape, generator=gen) * 50)
            for _ in range(args.num_layers)
        ]
        self.free = list(range(NUM_BLOCKS))
        random.Random(seed).shuffle(self.free)
        self.tables: dict[str, list[int]] = {}
        self.lens: dict[str, int] = {}

    @torch.no_grad()
    def step(self, batch: list[tuple[str, list[int]]]) -> dict[str, tuple[int, torch.Tensor]]:
        """batch: (sequence, new tokens) -> per sequence (first position, logits ``[n, vocab]``)."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        for seq, tokens in batch:
            start = self.lens.get(seq, 0)
            end = start + len(tokens)
            table = self.tables.setdefault(seq, [])
            while len(table) * BLOCK_SIZE < end:
                table.append(self.free.pop())
            for pos in range(start, end):
                slots.append(table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
            ids += tokens
            positions += range(start, end)
            query_lens.append(len(tokens))
            seq_lens.append(end)
            self.lens[seq] = end
        width = max(len(self.tables[seq]) for seq, _ in batch)
        tables = torch.zeros(len(batch), width, dtype=torch.int32)
        for row, (seq, _) in enumerate(batch):
            tables[row, : len(self.tables[seq])] = torch.tensor(self.tables[seq], dtype=torch.int32)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            block_tables=tables,
            query_lens=query_lens,
            seq_lens=seq_lens,
        )
        hidden = self.model(torch.tensor(ids), torch.tensor(positions), self.kv_caches, meta)
        logits = self.model.compute_logits(hidden)
        assert logits.dtype == torch.float32 and logits.shape == (len(ids), self.model.args.vocab_size)
        out, row = {}, 0
        for (seq, tokens), end in zip(batch, seq_lens, strict=True):
            out[seq] = (end - len(tokens), logits[row : row + len(tokens)])
            row += len(tokens)
        return out


def _run_schedule(runner: PagedRunner, seqs: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    """Batched prefill of different lengths, batched decodes, then chunked prefills mixed with decodes."""
    a, b, c, d = seqs["a"], seqs["b"], seqs["c"], seqs["d"]
    schedule = [
        [("a", a[:14]), ("b", b[:6]), ("c", c[:11])],
        [("a", a[14:15]), ("b", b[6:7]), ("c", c[11:12])],
        [("a", a[15:16]), ("b", b[7:8]), ("c", c[12:13])],
        [("c", c[13:14]), ("a", a[16:17])],
        [("a", a[17:23]), ("d", d[:8]), ("b", b[8:9])],  # a: chunk over its cached prefix
        [("d", d[8:15]), ("c", c[14:15])],
        [("c", c[15:17]), ("d", d[15:21])],
    ]
    got: dict[str, list[torch.Tensor]] = {name: [] for name in seqs}
    for batch in schedule:
        for seq, (start, logits) in runner.step(batch).items():
            assert start == sum(len(x) for x in got[seq])
            got[seq].append(logits)
    return {name: torch.cat(parts) for name, parts in got.items()}


def _check_parity(hf: Any, model: Any, vocab: int, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    lengths = {"a": 23, "b": 9, "c": 17, "d": 21}
    seqs = {k: torch.randint(0, vocab, (n,), generator=gen).tolist() for k, n in lengths.items()}
    got = _run_schedule(PagedRunner(model, seed), seqs)
    for name, tokens in seqs.items():
        want = _hf_logits(hf, tokens)
        assert got[name].shape == want.shape, name
        err = (got[name] - want).abs().max().item()
        assert torch.allclose(got[name], want, atol=ATOL, rtol=RTOL), f"seq {name}: max abs err {err:.2e}"
        assert want.std() > 0.3  # the comparison is not between near-constant logits


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers(name: str, tmp_path: Path) -> None:
    config = CONFIGS[name]()
    hf = _hf_model(config)
    hf.save_pretrained(tmp_path)
    model: Any = load_model(tmp_path, torch.float32, "cpu")
    saved = json.loads((tmp_path / "config.json").read_text())
    assert type(model).__name__ == saved["architectures"][0]
    _check_parity(hf, model, config.vocab_size)


def test_mistral_window_is_active(tmp_path: Path) -> None:
    """Guard for the window test: the same weights without the window give different logits."""
    hf = _hf_model(MistralConfig(**_small(), sliding_window=5))
    hf.save_pretrained(tmp_path)
    model: Any = load_model(tmp_path, torch.float32, "cpu")
    assert [layer.self_attn.attn.sliding_window for layer in model.model.layers] == [5, 5]
    tokens = torch.randint(0, 256, (20,), generator=torch.Generator().manual_seed(1)).tolist()
    hf.config.sliding_window = None
    full = _hf_logits(hf, tokens)
    runner = PagedRunner(model)
    ((_, windowed),) = runner.step([("x", tokens)]).values()
    assert (windowed[8:] - full[8:]).abs().max() > 1e-2


def test_qwen2_layer_windows(tmp_path: Path) -> None:
    hf = _hf_model(CONFIGS["qwen2-window-some-layers"]())
    hf.save_pretrained(tmp_path)
    model: Any = load_model(tmp_path, torch.float32, "cpu")
    assert [layer.self_attn.attn.sliding_window for layer in model.model.layers] == [None, 6, 6]
    hf = _hf_model(CONFIGS["qwen2-bias-tied-window-off"]())
    hf.save_pretrained(tmp_path)
    model = load_model(tmp_path, torch.float32, "cpu")
    assert all(layer.self_attn.attn.sliding_window is None for layer in model.model.layers)


# ---- InternLM2: transformers has no class; re-lay a Llama checkpoint into InternLM2's layout ----


def _to_internlm2(
    state: dict[str, torch.Tensor], heads: int, kv_heads: int, head_dim: int
) -> dict[str, torch.Tensor]:
    group = heads // kv_heads
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        t = t.detach().clone()
        if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            continue
        if ".self_attn.q_proj." in name:
            q, k, v = t, state[name.replace("q_proj", "k_proj")], state[name.replace("q_proj", "v_proj")]
            tail = q.shape[1:]
            blocks = [
                q.reshape(kv_heads, group, head_dim, *tail),
                k.reshape(kv_heads, 1, head_dim, *tail),
                v.reshape(kv_heads, 1, head_dim, *tail),
            ]
            wqkv = torch.cat(blocks, dim=1).reshape(-1, *tail)
            out[name.replace(".self_attn.q_proj.", ".attention.wqkv.")] = wqkv.contiguous()
            continue
        name = (
            name.replace("model.embed_tokens.", "model.tok_embeddings.")
            .replace(".self_attn.o_proj.", ".attention.wo.")
            .replace(".mlp.gate_proj.", ".feed_forward.w1.")
            .replace(".mlp.up_proj.", ".feed_forward.w3.")
            .replace(".mlp.down_proj.", ".feed_forward.w2.")
            .replace(".input_layernorm.", ".attention_norm.")
            .replace(".post_attention_layernorm.", ".ffn_norm.")
        )
        out["output.weight" if name == "lm_head.weight" else name] = t.contiguous()
    return out


@pytest.mark.parametrize(
    "heads,kv_heads,bias,rope_scaling",
    [(6, 2, False, None), (6, 6, True, {"type": "dynamic", "factor": 2.0})],
    ids=["gqa3", "mha-bias-dynamic"],
)
def test_internlm2_matches_llama(
    heads: int, kv_heads: int, bias: bool, rope_scaling: dict[str, Any] | None, tmp_path: Path
) -> None:
    head_dim = 96 // heads  # InternLM2 has no head_dim key
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": 1000000.0}
    if rope_scaling:
        rope = {"rope_type": rope_scaling["type"], "factor": rope_scaling["factor"], "rope_theta": 1000000.0}
    llama = LlamaConfig(
        **_small(num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, hidden_size=96),
        attention_bias=bias,
        rope_parameters=rope,
    )
    hf = _hf_model(llama, seed=3)
    state = _to_internlm2(dict(hf.state_dict()), heads, kv_heads, head_dim)
    save_file(state, str(tmp_path / "model.safetensors"))
    config = {
        "architectures": ["InternLM2ForCausalLM"],
        "model_type": "internlm2",
        "auto_map": {"AutoConfig": "configuration_internlm2.InternLM2Config"},
        "vocab_size": llama.vocab_size,
        "hidden_size": 96,
        "intermediate_size": llama.intermediate_size,
        "num_hidden_layers": llama.num_hidden_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": llama.max_position_embeddings,
        "rms_norm_eps": llama.rms_norm_eps,
        "rope_theta": 1000000.0,
        "rope_scaling": rope_scaling,
        "bias": bias,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = load_model(tmp_path, torch.float32, "cpu")
    assert type(model).__name__ == "InternLM2ForCausalLM"
    _check_parity(hf, model, llama.vocab_size)
