"""Linear layers and their weight loaders: plain, fused QKV and fused gate/up.

Each layer owns how a checkpoint tensor lands in its parameters (``weight_loader``); a model's
``packed_modules_mapping`` says which checkpoint names feed which fused layer and shard. How the
weight is stored and multiplied is the layer's ``quant_method`` (unquantized by default), so a
quantized format swaps the method, not the layer. Tensor parallelism (tp=1 for now) would slice the
loaded tensor in ``Linear.weight_loader`` / ``_FusedLinear._narrow`` and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from hotloop.kernels import dense_tune, ops, reference
from hotloop.kernels.w4a16_layout import PACK_FACTOR

ShardId = str | int
WeightLoader = Callable[..., None]


def set_weight_loader(param: nn.Parameter, loader: WeightLoader, shard_ids: Sequence[ShardId] = ()) -> None:
    """Attach ``loader`` (and, for a fused parameter, the shard ids it expects) to ``param``."""
    param.weight_loader = loader  # type: ignore[attr-defined]
    param.shard_ids = tuple(shard_ids)  # type: ignore[attr-defined]


def shard_key(param_name: str, shard_id: ShardId | None) -> str:
    """The name under which one loaded piece of a parameter is recorded (``qkv_proj.weight[k]``)."""
    return param_name if shard_id is None else f"{param_name}[{shard_id}]"


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId | None = None) -> None:
    """Copy a whole tensor into ``param`` (casting dtype), checking the shape."""
    if shard_id is not None:
        raise ValueError(f"parameter of shape {tuple(param.shape)} is not fused; got shard {shard_id!r}")
    if param.shape != loaded.shape:
        raise ValueError(
            f"weight shape {tuple(loaded.shape)} does not match parameter shape {tuple(param.shape)}"
        )
    param.data.copy_(loaded)


class LinearMethod(Protocol):
    """How a linear layer stores its weight and multiplies by it (the quantization hook)."""

    def create_weights(self, layer: Linear) -> None: ...

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor: ...


class UnquantizedLinearMethod:
    """A dense ``[out, in]`` weight in the model dtype; ``y = x @ W.T + b``."""

    def create_weights(self, layer: Linear) -> None:
        weight = nn.Parameter(
            torch.empty(layer.out_features, layer.in_features, dtype=layer.dtype), requires_grad=False
        )
        set_weight_loader(weight, layer.weight_loader, layer.shard_ids)
        layer.register_parameter("weight", weight)

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        # F.linear, or inside a CUDA graph capture the cuBLASLt algorithm timed for this shape
        return dense_tune.linear(x, cast(torch.Tensor, layer.weight), layer.bias)


class AWQLinearMethod:
    """W4A16: int4 weights in the AutoAWQ GEMM layout (``kernels/w4a16_layout.py``), one fp scale
    and zero point per ``group_size`` input channels.

    Parameters ``qweight`` int32 ``[in, out // 8]``, ``qzeros`` int32 ``[in // g, out // 8]`` and
    ``scales`` ``[in // g, out]`` (fp16 as the format stores them, so a bf16 model's dequantized
    weights are rounded once, not at the scales and again at the product). A fused layer loads each
    shard into its own columns. After loading, a CPU layer dequantizes once into a dense ``weight``
    (plain matmuls from then on); a CUDA layer keeps the packed tensors, casts the scales to the
    model dtype and runs the Triton W4A16 GEMM; with ``HOTLOOP_W4A16_KERNEL=cutlass`` it instead
    converts them once into the CUTLASS GEMM's layout (``kernels/w4a16_cutlass.py``: the same 4 bits a
    weight, zero terms in bf16; the AutoAWQ tensors are dropped) and runs that GEMM at every M.
    """

    def __init__(self, group_size: int) -> None:
        if group_size <= 0 or group_size % 16:
            raise ValueError(f"AWQ group_size={group_size} must be a positive multiple of 16")
        self.group_size = group_size

    def create_weights(self, layer: Linear) -> None:
        k, n, g = layer.in_features, layer.out_features, self.group_size
        if k % g:
            raise ValueError(
                f"AWQ group_size={g} does not divide in_features={k} (the format needs whole groups)"
            )
        if n % PACK_FACTOR:
            raise ValueError(f"AWQ needs out_features={n} to be a multiple of {PACK_FACTOR}")
        shapes = {
            "qweight": ((k, n // PACK_FACTOR), torch.int32, PACK_FACTOR),
            "qzeros": ((k // g, n // PACK_FACTOR), torch.int32, PACK_FACTOR),
            "scales": ((k // g, n), SCALES_DTYPE, 1),
        }
        for name, (shape, dtype, pack) in shapes.items():
            param = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
            set_weight_loader(param, _column_shard_loader(layer, pack), layer.shard_ids)
            layer.register_parameter(name, param)

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        weight = layer._parameters.get("weight")
        if weight is not None:  # dequantized at load (CPU)
            return F.linear(x, weight, layer.bias)
        cutlass_weight = layer.__dict__.get("cutlass_weight")  # (a plain attribute: no getattr miss)
        if cutlass_weight is not None:
            from hotloop.kernels import w4a16_cutlass

            y = w4a16_cutlass.gemm(x, cutlass_weight)
            return y if layer.bias is None else y + layer.bias
        qweight, qzeros, scales = (cast(torch.Tensor, getattr(layer, n)) for n in AWQ_PARAM_NAMES)
        if ops.use_triton(x):
            from hotloop.kernels.w4a16_gemm import w4a16_gemm

            y = w4a16_gemm(x, qweight, qzeros, scales, self.group_size)
        else:
            y = reference.w4a16_matmul(x, qweight, qzeros, scales, self.group_size)
        return y if layer.bias is None else y + layer.bias

    def apply_silu_mul(self, layer: Linear, gate_up: torch.Tensor) -> torch.Tensor | None:
        """``layer(silu_and_mul(gate_up))`` in one launch where the W4A16 kernels can fold the SiLU in
        (one row on CUDA, unless ``HOTLOOP_W4A16_FUSED_SILU=0``: ``w4a16_gemm.w4a16_silu_mul_gemm``; in the
        CUTLASS layout only with ``HOTLOOP_W4C_FUSED_SILU=1``: ``w4a16_cutlass.gemv_silu_mul``), else None
        (the caller runs the two)."""
        from hotloop.kernels import w4a16_cuda

        cutlass_weight = layer.__dict__.get("cutlass_weight")  # (a plain attribute: no getattr miss)
        if cutlass_weight is not None:  # HOTLOOP_W4A16_KERNEL=cutlass: its GEMV, if HOTLOOP_W4C_FUSED_SILU=1
            from hotloop.kernels import w4a16_cutlass

            if layer.bias is not None or gate_up.shape[0] != 1 or not w4a16_cutlass.silu_fusion():
                return None
            return w4a16_cutlass.gemv_silu_mul(gate_up, cutlass_weight)
        if not w4a16_cuda.silu_fusion():  # first: the common case costs one environment read
            return None
        if (
            layer._parameters.get("weight") is not None
            or layer.bias is not None
            or not ops.use_triton(gate_up)
        ):
            return None
        from hotloop.kernels.w4a16_gemm import w4a16_silu_mul_gemm

        qweight, qzeros, scales = (cast(torch.Tensor, getattr(layer, n)) for n in AWQ_PARAM_NAMES)
        return w4a16_silu_mul_gemm(gate_up, qweight, qzeros, scales, self.group_size)

    def process_weights_after_loading(self, layer: Linear) -> None:
        """On the CPU, replace the packed tensors by the dequantized dense weight ``[out, in]``; on
        CUDA, cast the scales to the model dtype (the kernels' activation dtype), or with
        ``HOTLOOP_W4A16_KERNEL=cutlass`` convert the three into ``layer.cutlass_weight``."""
        qweight = cast(torch.Tensor, layer.qweight)
        if qweight.is_cuda:
            from hotloop.kernels import w4a16_cutlass

            if w4a16_cutlass.selected():
                qzeros, scales = cast(torch.Tensor, layer.qzeros), cast(torch.Tensor, layer.scales)
                cw = w4a16_cutlass.convert(qweight, qzeros, scales, self.group_size, layer.dtype)
                for name in AWQ_PARAM_NAMES:
                    del layer._parameters[name]
                for name, t in zip(CUTLASS_PARAM_NAMES, (cw.w, cw.scales, cw.zeros), strict=True):
                    layer.register_parameter(name, nn.Parameter(t, requires_grad=False))  # counted as weights
                layer.__dict__["cutlass_weight"] = cw  # (a plain attribute: its tensors are the parameters)
                return
            scales = cast(torch.Tensor, layer.scales)
            if scales.dtype != layer.dtype:
                layer.scales = nn.Parameter(scales.to(layer.dtype), requires_grad=False)
            return
        qzeros, scales = cast(torch.Tensor, layer.qzeros), cast(torch.Tensor, layer.scales)
        dense = reference.w4a16_dequantize(qweight, qzeros, scales.float(), self.group_size)
        for name in AWQ_PARAM_NAMES:
            del layer._parameters[name]
        layer.register_parameter("weight", nn.Parameter(dense.t().to(layer.dtype).contiguous(), False))


AWQ_PARAM_NAMES = ("qweight", "qzeros", "scales")
CUTLASS_PARAM_NAMES = ("cutlass_w", "cutlass_scales", "cutlass_zeros")  # HOTLOOP_W4A16_KERNEL=cutlass
SCALES_DTYPE = torch.float16  # AutoAWQ's; kept until after loading


def _column_shard_loader(layer: Linear, pack: int) -> WeightLoader:
    """A loader that puts shard ``s`` of a fused AWQ layer into its columns (``pack`` per element)."""

    def load(param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId | None = None) -> None:
        if shard_id is None:
            default_weight_loader(param, loaded)
            return
        offsets = cast(dict[ShardId, tuple[int, int]], getattr(layer, "shard_offsets", {}))
        if shard_id not in offsets:
            raise ValueError(f"unknown shard {shard_id!r}; this layer has shards {list(offsets)}")
        start, size = offsets[shard_id]
        if start % pack or size % pack:
            raise ValueError(f"shard {shard_id!r} [{start}, {start + size}) is not aligned to {pack} columns")
        dst = param.data.narrow(1, start // pack, size // pack)
        if dst.shape != loaded.shape:
            raise ValueError(
                f"shard {shard_id!r}: shape {tuple(loaded.shape)} does not match expected {tuple(dst.shape)}"
            )
        dst.copy_(loaded)

    return load


def set_quant_method(layer: Linear, method: LinearMethod) -> None:
    """Swap how ``layer`` stores its weight (a module swap after building the model, gpt-fast style).

    The old weight parameters are dropped (the bias stays); the new ones are created on the current
    default device and await loading.
    """
    for name in [n for n in layer._parameters if n != "bias"]:
        del layer._parameters[name]
    layer.quant_method = method
    method.create_weights(layer)


class Linear(nn.Module):
    """``y = x W^T + b`` with weights created by ``quant_method``: x ``[T, in]`` -> ``[T, out]``."""

    shard_ids: tuple[ShardId, ...] = ()

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        dtype: torch.dtype | None = None,
        quant_method: LinearMethod | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.dtype = dtype if dtype is not None else torch.get_default_dtype()
        self.quant_method: LinearMethod = (
            quant_method if quant_method is not None else UnquantizedLinearMethod()
        )
        self.quant_method.create_weights(self)
        if bias:
            b = nn.Parameter(torch.empty(out_features, dtype=self.dtype), requires_grad=False)
            set_weight_loader(b, self.weight_loader, self.shard_ids)
            self.bias: nn.Parameter | None = b
        else:
            self.register_parameter("bias", None)

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId | None = None
    ) -> None:
        default_weight_loader(param, loaded, shard_id)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x)

    @property
    def is_dense(self) -> bool:
        """Whether the weight is one plain ``[out, in]`` tensor (unquantized, or dequantized at load)."""
        return isinstance(self._parameters.get("weight"), torch.Tensor)

    def forward_fused(
        self,
        x: torch.Tensor,
        *,
        norm_weight: torch.Tensor | None = None,
        eps: float = 1e-6,
        residual: torch.Tensor | None = None,
        silu: bool = False,
    ) -> torch.Tensor:
        """This projection with an RMSNorm before it and a SiLU-and-mul or residual add after it, in
        one launch (``ops.fused_linear``). Needs ``is_dense``."""
        if not self.is_dense:
            raise ValueError("forward_fused needs a dense weight; this layer's is quantized")
        weight = cast(torch.Tensor, self.weight)
        return ops.fused_linear(
            x, weight, self.bias, norm_weight=norm_weight, eps=eps, residual=residual, silu=silu
        )

    def forward_merged(
        self, part: torch.Tensor, lse: torch.Tensor, *, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        """This projection (and a residual add after it) of the attention output that split decode
        partials merge into (``ops.fused_linear_merged``: the merge rides in the projection's
        launch). Needs ``is_dense``."""
        if not self.is_dense:
            raise ValueError("forward_merged needs a dense weight; this layer's is quantized")
        weight = cast(torch.Tensor, self.weight)
        return ops.fused_linear_merged(part, lse, weight, self.bias, residual=residual)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        )


class _FusedLinear(Linear):
    """Several projections of the same input stacked along the output dim; loaded shard by shard."""

    def __init__(
        self,
        in_features: int,
        shards: dict[ShardId, int],
        bias: bool,
        dtype: torch.dtype | None,
        quant_method: LinearMethod | None,
    ) -> None:
        self.shard_ids = tuple(shards)
        self.output_sizes = list(shards.values())
        offsets: dict[ShardId, tuple[int, int]] = {}
        start = 0
        for sid, size in shards.items():
            offsets[sid] = (start, size)
            start += size
        self.shard_offsets = offsets
        super().__init__(in_features, start, bias, dtype, quant_method)

    def _narrow(self, param: nn.Parameter, shard_id: ShardId) -> torch.Tensor:
        if shard_id not in self.shard_offsets:
            raise ValueError(f"unknown shard {shard_id!r}; this layer has shards {list(self.shard_offsets)}")
        start, size = self.shard_offsets[shard_id]
        return param.data.narrow(0, start, size)

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId | None = None
    ) -> None:
        if shard_id is None:  # the checkpoint already stores the fused tensor
            default_weight_loader(param, loaded)
            return
        dst = self._narrow(param, shard_id)
        if dst.shape != loaded.shape:
            raise ValueError(
                f"shard {shard_id!r}: weight shape {tuple(loaded.shape)} does not match expected {tuple(dst.shape)}"
            )
        dst.copy_(loaded)

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Views of the fused output ``[T, out]``, one per shard."""
        return y.split(self.output_sizes, dim=-1)


class QKVLinear(_FusedLinear):
    """q, k and v projections in one matmul; output ``[T, (H + 2*KV) * D]`` laid out [q | k | v]."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool = False,
        dtype: torch.dtype | None = None,
        quant_method: LinearMethod | None = None,
    ) -> None:
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        shards: dict[ShardId, int] = {
            "q": num_heads * head_dim,
            "k": num_kv_heads * head_dim,
            "v": num_kv_heads * head_dim,
        }
        super().__init__(hidden_size, shards, bias, dtype, quant_method)

    def forward_rope(
        self,
        x: torch.Tensor,
        *,
        norm_weight: torch.Tensor | None,
        eps: float,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        slot_mapping: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """The projection with its input norm, the rotary embedding (full rotary) and the write of
        k and v into the float ``kv_cache`` at ``slot_mapping``, in one launch on CUDA
        (``ops.fused_qkv_rope``). Returns the rotated q ``[T, H * D]``. Needs ``is_dense``."""
        if not self.is_dense:
            raise ValueError("forward_rope needs a dense weight; this layer's is quantized")
        return ops.fused_qkv_rope(
            x,
            cast(torch.Tensor, self.weight),
            self.bias,
            norm_weight=norm_weight,
            eps=eps,
            cos=cos_sin[0],
            sin=cos_sin[1],
            slot_mapping=slot_mapping,
            k_cache=kv_cache[0],
            v_cache=kv_cache[1],
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
        )

    def forward_rope_staged(
        self,
        x: torch.Tensor,
        *,
        norm_weight: torch.Tensor | None,
        eps: float,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The projection with its input norm and the rotary embedding (full rotary), writing no
        cache: one launch on CUDA (``ops.fused_qkv_rope_staged``). Returns the rotated q
        ``[T, H * D]`` and ``kv [T, 2 KV, D]`` (k rotated, then v), for a decode kernel that
        writes them itself. Needs ``is_dense``."""
        if not self.is_dense:
            raise ValueError("forward_rope_staged needs a dense weight; this layer's is quantized")
        return ops.fused_qkv_rope_staged(
            x,
            cast(torch.Tensor, self.weight),
            self.bias,
            norm_weight=norm_weight,
            eps=eps,
            cos=cos_sin[0],
            sin=cos_sin[1],
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
        )


class MergedLinear(_FusedLinear):
    """Projections of sizes ``output_sizes`` in one matmul, shard ``i`` at index ``i`` (gate/up: 0/1)."""

    def __init__(
        self,
        in_features: int,
        output_sizes: Sequence[int],
        bias: bool = False,
        dtype: torch.dtype | None = None,
        quant_method: LinearMethod | None = None,
    ) -> None:
        shards: dict[ShardId, int] = dict(enumerate(output_sizes))
        super().__init__(in_features, shards, bias, dtype, quant_method)
