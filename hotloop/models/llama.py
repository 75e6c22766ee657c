"""The Llama-family decoder: Llama and Mistral here; Qwen2, Qwen3 and InternLM2 configure it.

One pre-norm decoder with small switches (``DecoderArgs``): q/k/v and o biases, MLP bias, per-head
q/k RMSNorm, per-layer sliding window. Projections are fused (qkv, gate/up); the checkpoint's
separate tensors reach them through ``packed_modules_mapping`` and each layer's weight loader.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
from torch import nn

from hotloop.kernels import ops
from hotloop.layers.activation import SiluAndMul
from hotloop.layers.attention import AttentionMetadata, PagedAttention
from hotloop.layers.embedding import LMHead, VocabEmbedding
from hotloop.layers.linear import Linear, MergedLinear, QKVLinear, ShardId, default_weight_loader, shard_key
from hotloop.layers.norm import RMSNorm
from hotloop.layers.rotary import RopeConfig, RotaryEmbedding
from hotloop.utils.logging import get_logger

logger = get_logger(__name__)

KVCache = tuple[torch.Tensor, torch.Tensor]
CosSin = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True, slots=True)
class DecoderArgs:
    """The shape and switches of one decoder, resolved from a Hugging Face config."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope: RopeConfig
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sliding_windows: tuple[int | None, ...] = ()

    @classmethod
    def from_hf(cls, cfg: Any, **switches: Any) -> DecoderArgs:
        act = getattr(cfg, "hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ValueError(f"hidden_act={act!r} is not supported by the turbo decoder (only 'silu')")
        num_heads = int(cfg.num_attention_heads)
        num_layers = int(cfg.num_hidden_layers)
        return cls(
            hidden_size=int(cfg.hidden_size),
            intermediate_size=int(cfg.intermediate_size),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or num_heads),
            head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // num_heads),
            vocab_size=int(cfg.vocab_size),
            rms_norm_eps=float(getattr(cfg, "rms_norm_eps", 1e-6)),
            rope=RopeConfig.from_hf(cfg),
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            sliding_windows=layer_sliding_windows(cfg, num_layers),
            **switches,
        )


def layer_sliding_windows(cfg: Any, num_layers: int) -> tuple[int | None, ...]:
    """Each layer's attention window (None: full). Honours ``use_sliding_window`` and ``layer_types``."""
    window = getattr(cfg, "sliding_window", None)
    if not window or getattr(cfg, "use_sliding_window", True) is False:
        return (None,) * num_layers
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types:
        return tuple(int(window) if t == "sliding_attention" else None for t in layer_types)
    return (int(window),) * num_layers


class LlamaAttention(nn.Module):
    def __init__(self, args: DecoderArgs, layer_idx: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_heads = args.num_heads
        self.num_kv_heads = args.num_kv_heads
        self.head_dim = args.head_dim
        self.qkv_proj = QKVLinear(
            args.hidden_size, args.head_dim, args.num_heads, args.num_kv_heads, args.qkv_bias, dtype
        )
        self.o_proj = Linear(args.num_heads * args.head_dim, args.hidden_size, args.o_bias, dtype)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if args.qk_norm:
            self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps, dtype)
            self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps, dtype)
        window = args.sliding_windows[layer_idx] if args.sliding_windows else None
        self.attn = PagedAttention(
            args.num_heads, args.num_kv_heads, args.head_dim, args.head_dim**-0.5, window
        )

    def forward(
        self, h: torch.Tensor, cos_sin: CosSin, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        q, k, v = self.project(h)
        return self.o_proj(self.attn(q, k, v, kv_cache, meta, cos_sin))

    def project(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``h [T, hidden]`` -> q ``[T, H*D]``, k and v ``[T, KV*D]`` (q/k normed when the model has it)."""
        return self.split_heads(self.qkv_proj(h))

    def split_heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The fused projection's output ``[T, (H + 2*KV)*D]`` -> q, k, v (q/k normed when the model has it)."""
        T = qkv.shape[0]
        q, k, v = self.qkv_proj.split(qkv)  # [T, H*D], [T, KV*D], [T, KV*D]
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q.view(T, self.num_heads, self.head_dim))
            k = self.k_norm(k.view(T, self.num_kv_heads, self.head_dim))
        return q.reshape(T, -1), k.reshape(T, -1), v


class LlamaMLP(nn.Module):
    def __init__(self, args: DecoderArgs, dtype: torch.dtype) -> None:
        super().__init__()
        inter = args.intermediate_size
        self.gate_up_proj = MergedLinear(args.hidden_size, [inter, inter], args.mlp_bias, dtype)
        self.act_fn = SiluAndMul()
        self.down_proj = Linear(inter, args.hidden_size, args.mlp_bias, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        fused = getattr(self.down_proj.quant_method, "apply_silu_mul", None)  # W4A16, one row
        if fused is not None:
            y = fused(self.down_proj, gate_up)
            if y is not None:
                return cast(torch.Tensor, y)
        return self.down_proj(self.act_fn(gate_up))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, args: DecoderArgs, layer_idx: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(args, layer_idx, dtype)
        self.mlp = LlamaMLP(args, dtype)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, dtype)

    def forward(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        cos_sin: CosSin,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this layer's MLP output, the residual stream before it); the next norm adds them."""
        q, k, v, residual = self.pre_attention(h, residual)
        o = self.self_attn.attn(q, k, v, kv_cache, meta, cos_sin)
        return self.post_attention(o, residual)

    # The layer in three parts, so that the parts around attention can be captured in CUDA graphs
    # (``executor/piecewise_graph.py``) while attention, whose launch depends on the batch, runs eagerly.
    def pre_attention(
        self, h: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input norm, adding the residual) and q/k/v projection -> ``(q, k, v, residual)``."""
        if residual is None:
            residual = h
            h = self.input_layernorm(h)
        else:
            h, residual = self.input_layernorm(h, residual)
        q, k, v = self.self_attn.project(h)
        return q, k, v, residual

    def post_attention(self, o: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention output ``o [T, H*D]`` -> (MLP output, residual stream before it)."""
        h = self.self_attn.o_proj(o)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual

    def forward_one_row(
        self, h: torch.Tensor, cos_sin: CosSin, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        """One row (batch-1 decode): the residual stream ``h [1, hidden]`` -> the stream after this
        layer, in four projection launches with the two norms, SiLU and both residual adds fused in
        (``Linear.forward_fused``); the same roundings as ``forward``."""
        attn, mlp = self.self_attn, self.mlp
        norm1, norm2 = self.input_layernorm, self.post_attention_layernorm
        rope = self._rope_in_projection(h, cos_sin, kv_cache, meta)
        if rope == "cache":
            q = attn.qkv_proj.forward_rope(
                h, norm_weight=norm1.weight, eps=norm1.eps, cos_sin=cos_sin, slot_mapping=meta.slot_mapping,
                kv_cache=kv_cache,
            )  # fmt: skip
            res = attn.attn.attend_unmerged(q, kv_cache, meta) if ops.one_row_merge() else None
            if res is not None and res.part is not None and res.lse is not None:
                # the splits merge in the o projection's launch (ops.one_row_merge)
                h = attn.o_proj.forward_merged(res.part, res.lse, residual=h)
                act = mlp.gate_up_proj.forward_fused(h, norm_weight=norm2.weight, eps=norm2.eps, silu=True)
                return mlp.down_proj.forward_fused(act, residual=h)
            o = attn.attn.attend(q, kv_cache, meta) if res is None else res.out.reshape(q.shape)
        elif rope == "staged":
            q, kv = attn.qkv_proj.forward_rope_staged(
                h, norm_weight=norm1.weight, eps=norm1.eps, cos_sin=cos_sin
            )
            o = attn.attn.attend_staged(q, kv, kv_cache, meta, cos_sin)
        else:
            qkv = attn.qkv_proj.forward_fused(h, norm_weight=norm1.weight, eps=norm1.eps)
            q, k, v = attn.split_heads(qkv)
            o = attn.attn(q, k, v, kv_cache, meta, cos_sin)
        h = attn.o_proj.forward_fused(o, residual=h)
        act = mlp.gate_up_proj.forward_fused(h, norm_weight=norm2.weight, eps=norm2.eps, silu=True)
        return mlp.down_proj.forward_fused(act, residual=h)

    def _rope_in_projection(
        self, h: torch.Tensor, cos_sin: CosSin, kv_cache: KVCache, meta: AttentionMetadata
    ) -> str | None:
        """Whether ``forward_one_row`` fuses the rotary embedding into the q/k/v projection
        (``ops.one_row_rope``; no q/k norm, full rotary, and on CUDA a decode-only batch), and where
        the step's K/V go: "cache" (the projection writes them: a float cache, or a quantized one
        with ``ops.one_row_rope_quant``), "staged" (an int8 cache whose decode kernel writes them,
        ``PagedAttention.writes_in_decode``), or None (no fusion)."""
        attn = self.self_attn
        if not (
            ops.one_row_rope()
            and attn.q_norm is None
            and 2 * cos_sin[0].shape[-1] == attn.head_dim
            and (meta.decode_only or meta.seq_lens_t is None)
        ):
            return None
        if kv_cache[0].dtype == h.dtype:
            return "cache"
        if kv_cache[0].dtype == torch.uint8:
            if ops.use_triton(h) and attn.attn.writes_in_decode(kv_cache, meta, h.dtype):
                return "staged"
            if ops.one_row_rope_quant():
                return "cache"
        return None

    def dense(self) -> bool:
        """Whether every projection has a dense weight (``forward_one_row`` needs it)."""
        attn, mlp = self.self_attn, self.mlp
        return all(x.is_dense for x in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj))


class LlamaModel(nn.Module):
    def __init__(self, args: DecoderArgs, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(args.vocab_size, args.hidden_size, dtype)
        self.layers = nn.ModuleList(LlamaDecoderLayer(args, i, dtype) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, dtype)
        self.rotary_emb = RotaryEmbedding(args.head_dim, args.rope)
        self._dense: bool | None = None

    def dense(self) -> bool:
        """Whether every layer's projections are dense (decided once, after loading)."""
        if self._dense is None:
            self._dense = all(cast(LlamaDecoderLayer, layer).dense() for layer in self.layers)
        return self._dense

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``inputs_embeds`` ``[T, hidden]`` replaces the token embeddings (images merged in)."""
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"got {len(kv_caches)} KV caches for {len(self.layers)} layers")
        h = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds  # [T, hidden]
        cos_sin = self.rotary_emb.cos_sin(positions)  # shared by every layer
        if ops.one_row_fusion(h) and self.dense():
            for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
                h = cast(LlamaDecoderLayer, layer).forward_one_row(h, cos_sin, kv_cache, meta)
            return self.norm(h)
        residual: torch.Tensor | None = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h, residual = layer(h, residual, cos_sin, kv_cache, meta)
        if residual is None:
            return self.norm(h)
        return self.norm(h, residual)[0]


class LlamaForCausalLM(nn.Module):
    """Llama (1/2/3.x). Subclasses change ``decoder_args`` and, for other layouts, ``remap_weights``."""

    packed_modules_mapping: ClassVar[dict[str, tuple[str, ShardId]]] = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }
    # Checkpoint tensors that are buffers we recompute, not weights.
    ignored_weight_suffixes: ClassVar[tuple[str, ...]] = (
        "rotary_emb.inv_freq",
        "rotary_emb.cos_cached",
        "rotary_emb.sin_cached",
    )

    def __init__(self, hf_config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = hf_config
        self.args = self.decoder_args(hf_config)
        self.model = LlamaModel(self.args, dtype)
        tie_to = self.model.embed_tokens if self.args.tie_word_embeddings else None
        self.lm_head = LMHead(self.args.vocab_size, self.args.hidden_size, dtype, tie_to=tie_to)

    @classmethod
    def decoder_args(cls, hf_config: Any) -> DecoderArgs:
        bias = bool(getattr(hf_config, "attention_bias", False))
        return DecoderArgs.from_hf(
            hf_config, qkv_bias=bias, o_bias=bias, mlp_bias=bool(getattr(hf_config, "mlp_bias", False))
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """input_ids, positions ``[T]`` -> final-normed hidden states ``[T, hidden]``."""
        return self.model(input_ids, positions, kv_caches, meta)

    def compute_logits(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        """``[N, hidden]`` -> float32 ``[N, vocab]`` (``float32=False``: the model dtype allowed,
        the same values before their exact widening; ``ops.lm_head_logits``)."""
        return self.lm_head(hidden, float32)

    def remap_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterable[tuple[str, torch.Tensor]]:
        """Checkpoint names -> Llama names; identity here, InternLM2 overrides it."""
        return weights

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load Hugging Face checkpoint tensors; returns the keys loaded (``shard_key`` names).

        The loader compares the returned keys with every parameter (and every shard of a fused
        one) to report what is missing. Tensors matching no parameter are logged and skipped.
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        unexpected: list[str] = []
        for ckpt_name, tensor in self.remap_weights(weights):
            if ckpt_name.endswith(self.ignored_weight_suffixes):
                continue
            if self.lm_head.tied and ckpt_name == "lm_head.weight":
                continue  # some tied checkpoints store the copy anyway
            name, shard = self._param_name(ckpt_name)
            param = params.get(name)
            if param is None:
                unexpected.append(ckpt_name)
                continue
            loader = getattr(param, "weight_loader", default_weight_loader)
            try:
                loader(param, tensor, shard)
            except ValueError as e:
                raise ValueError(f"checkpoint tensor {ckpt_name!r} -> parameter {name!r}: {e}") from None
            loaded.add(shard_key(name, shard))
        if unexpected:
            shown = ", ".join(unexpected[:10]) + (" ..." if len(unexpected) > 10 else "")
            logger.warning(
                "%d checkpoint tensors match no parameter and were skipped: %s", len(unexpected), shown
            )
        return loaded

    def _param_name(self, ckpt_name: str) -> tuple[str, ShardId | None]:
        for ckpt_part, (fused, shard) in self.packed_modules_mapping.items():
            marker = f".{ckpt_part}."
            if marker in ckpt_name:
                return ckpt_name.replace(marker, f".{fused}.", 1), shard
        return ckpt_name, None


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral: Llama plus an optional sliding window (``sliding_window``, read per layer)."""
