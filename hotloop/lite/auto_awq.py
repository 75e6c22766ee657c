"""``hotloop lite auto_awq`` and ``hotloop lite calibrate``: the block-by-block quantization driver.

For each decoder block: run it over the calibration samples, capturing the input of every linear
layer (step 1); search and fold per-channel scales (2); search weight clipping (3); quantize int4
per group with zero points (4). Then write the AutoAWQ GEMM checkpoint (5). The calibration forward
passes use hotloop's own turbo layers: they cover every turbo architecture (InternLM2 included,
which transformers only runs as remote code), fused q/k/v and gate/up share one scale as they share
one input, and the math is the one that serves the checkpoint.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from hotloop.layers.linear import Linear
from hotloop.lite import awq, calib_data
from hotloop.lite.blocks import BlockRunner, channel_stats
from hotloop.lite.export import (
    CheckpointWriter,
    copy_side_files,
    export_tensor,
    source_tensor_names,
    write_config,
)
from hotloop.lite.quantize import QuantizedWeight, quantize_weight
from hotloop.models.loader import format_bytes, load_hf_config, load_model
from hotloop.models.resolve import resolve_model_path
from hotloop.utils.logging import get_logger

logger = get_logger(__name__)

METHODS = ("awq", "rtn")
GROUP_SIZES = (128, 64, 32)
STATS_FILE = "inputs_stats.pt"
SEARCH_LOG = "awq_search.json"


@dataclass(frozen=True, slots=True)
class AWQOptions:
    """The ``hotloop lite auto_awq`` options (``method='rtn'``: plain round-to-nearest, no data)."""

    calib_dataset: str = "pydoc"
    calib_samples: int = 128
    calib_seqlen: int = 512
    w_bits: int = 4
    w_group_size: int = 128
    batch_size: int = 8
    device: str = "auto"
    search_scale: bool = False
    method: str = "awq"
    clip_tokens: int = 512

    def __post_init__(self) -> None:
        if self.w_bits != 4:
            raise ValueError(f"w_bits={self.w_bits}: only 4-bit weights are supported (AutoAWQ GEMM)")
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} must be one of {METHODS}")
        if self.w_group_size <= 0 or self.w_group_size % 16:
            raise ValueError(f"w_group_size={self.w_group_size} must be a positive multiple of 16")
        for flag, value, least in (
            ("--calib-samples", self.calib_samples, 1),
            ("--batch-size", self.batch_size, 1),
            ("--calib-seqlen", self.calib_seqlen, 2),
        ):
            if value < least:
                raise ValueError(f"{flag} {value}: must be >= {least}")
        if self.clip_tokens < 1:
            raise ValueError(f"--clip-tokens {self.clip_tokens}: clip_tokens must be >= 1")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"--device {self.device!r}: device must be auto, cpu, cuda or cuda:N")


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={name!r}, but torch sees no CUDA device; use --device cpu")
    return torch.device(name)


def _compute_dtype(device: torch.device, hf_config: Any) -> torch.dtype:
    """float32 on the CPU; on the GPU the model's 16-bit dtype (float16 unless it is bfloat16)."""
    if device.type == "cpu":
        return torch.float32
    declared = str(getattr(hf_config, "torch_dtype", None) or getattr(hf_config, "dtype", "")).lower()
    return torch.bfloat16 if "bfloat16" in declared else torch.float16


def _load_source(model: str | None, device: torch.device) -> tuple[Path, nn.Module, Any]:
    path = resolve_model_path(model)
    hf_config = load_hf_config(path)
    if getattr(hf_config, "quantization_config", None):
        raise ValueError(f"{path} is already quantized (config.json has a quantization_config)")
    net = load_model(path, _compute_dtype(device, hf_config), "cpu")
    return path, net, hf_config


def check_group_size(model: nn.Module, group_size: int) -> None:
    """Every linear's in_features must be a multiple of the group size (AutoAWQ and vLLM require it)."""
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, Linear)]
    bad = [(n, m.in_features) for n, m in linears if m.in_features % group_size]
    if not bad:
        return
    fits = [g for g in GROUP_SIZES if all(m.in_features % g == 0 for _n, m in linears)]
    fix = f"use --w-group-size {fits[0]}" if fits else "no standard group size divides every layer"
    name, k = bad[0]
    raise ValueError(
        f"--w-group-size {group_size} does not divide in_features={k} of {name}; the AWQ format "
        f"(AutoAWQ, vLLM, hotloop) needs whole groups: {fix}"
    )


def _tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def _samples(path: Path, opts: AWQOptions, text: str | None = None) -> torch.Tensor:
    """The calibration windows; ``text``: the calibration text when it was read already."""
    positions = getattr(load_hf_config(path), "max_position_embeddings", None)
    if isinstance(positions, int) and opts.calib_seqlen > positions:
        raise ValueError(
            f"--calib-seqlen {opts.calib_seqlen} exceeds the model's max_position_embeddings={positions}: "
            f"use at most {positions} (512 is AWQ's usual length)"
        )
    if text is None:
        text = calib_data.load_text(opts.calib_dataset, "calib")
    try:
        samples = calib_data.token_windows(_tokenizer(path), text, opts.calib_samples, opts.calib_seqlen)
    except ValueError as e:  # (the counts are checked already: the text is too short)
        raise ValueError(
            f"--calib-seqlen {opts.calib_seqlen}: --calib-dataset {opts.calib_dataset!r} is too short "
            f"(its calibration part: {e}); pass a longer text or a smaller --calib-seqlen"
        ) from None
    logger.info("calibration: %d samples x %d tokens of %s", *samples.shape, opts.calib_dataset)
    return samples


def _progress(total: int, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="block")


# Captured linear inputs of a decoder layer, by module path inside it.
LINEAR_INPUTS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def calibrate(model: str | None, work_dir: str | Path, opts: AWQOptions | None = None) -> Path:
    """Save per-channel ``absmean`` / ``absmax`` of every linear layer's input; returns the file."""
    opts = opts or AWQOptions()
    device = _device(opts.device)
    text = calib_data.load_text(opts.calib_dataset, "calib")  # (a bad --calib-dataset fails before loading)
    path, net, _cfg = _load_source(model, device)
    runner = BlockRunner(net, _samples(path, opts, text), opts.batch_size, device)
    stats: dict[str, dict[str, torch.Tensor]] = {}
    with _progress(runner.num_layers, "calibrate") as bar:
        for i, layer in enumerate(runner.layers):
            layer.to(device)
            for name, x in runner.run_layer(i, LINEAR_INPUTS).items():
                stats[f"model.layers.{i}.{name}"] = channel_stats(x)
            layer.to("cpu")
            bar.update()
    out = Path(work_dir)
    out.mkdir(parents=True, exist_ok=True)
    file = out / STATS_FILE
    torch.save({"stats": stats, "options": asdict(opts), "model": str(path)}, file)
    logger.info("saved input statistics of %d linear layers to %s", len(stats), file)
    return file


def _quantize_layer(
    layer: Any, prefix: str, opts: AWQOptions, runner: BlockRunner | None
) -> tuple[dict[str, QuantizedWeight], list[dict[str, Any]]]:
    """Scale, clip and quantize one decoder layer in place (on the device); returns its int4 weights."""
    g, bits = opts.w_group_size, opts.w_bits
    log: list[dict[str, Any]] = []
    if runner is not None:
        index = int(prefix.rsplit(".", 1)[-1])
        inputs = runner.run_layer(index, LINEAR_INPUTS)
        groups, skipped = awq.decoder_scale_groups(layer, runner)
        if skipped and index == 0:
            for reason in skipped:
                logger.info("%s", reason)
        divided: dict[str, torch.Tensor] = {}
        for group in groups:
            x = inputs[group.input_key]
            s, ratio, loss = awq.search_scale(group, x, g, bits, opts.search_scale)
            awq.apply_scale(group, s)
            divided[group.input_key] = s
            log.append({"group": f"{prefix}: {group.name}", "ratio": ratio, "loss": loss})
        for key in LINEAR_INPUTS:
            lin = layer.get_submodule(key)
            x = inputs[key]
            step = max(1, x.shape[0] // opts.clip_tokens)
            xs = x[::step][: opts.clip_tokens]
            if key in divided:
                xs = xs / divided[key].to(xs.dtype)
            rows = slice(None)
            if key == "self_attn.qkv_proj":  # q and k meet in a softmax: their output MSE misleads
                start, size = lin.shard_offsets["v"]
                rows = slice(start, start + size)
            w = lin.weight.data[rows]
            awq.apply_clip(w, awq.search_clip(w, xs, g, bits), g)
        del inputs
    quantized = {}
    for key in LINEAR_INPUTS:
        lin = layer.get_submodule(key)
        quantized[f"{prefix}.{key}"] = _to_cpu(quantize_weight(lin.weight.data, g, bits))
    return quantized, log


def _to_cpu(qw: QuantizedWeight) -> QuantizedWeight:
    return QuantizedWeight(qw.q.cpu(), qw.zeros.cpu(), qw.scales.cpu(), qw.group_size)


def auto_awq(model: str | None, work_dir: str | Path, opts: AWQOptions | None = None) -> Path:
    """Quantize ``model`` (a folder, ``.gguf`` or None for the default) into ``work_dir``.

    Writes safetensors, config.json with the AWQ ``quantization_config``, and the tokenizer files.
    """
    opts = opts or AWQOptions()
    t0 = time.perf_counter()
    device = _device(opts.device)
    text = None
    if opts.method == "awq":  # (a bad --calib-dataset fails before loading; rtn reads none)
        text = calib_data.load_text(opts.calib_dataset, "calib")
    path, net, _cfg = _load_source(model, device)
    check_group_size(net, opts.w_group_size)
    out = Path(work_dir)
    out.mkdir(parents=True, exist_ok=True)
    runner = None
    if opts.method == "awq":
        runner = BlockRunner(net, _samples(path, opts, text), opts.batch_size, device)
    layers: Any = cast(Any, net).model.layers
    quantized: dict[str, QuantizedWeight] = {}
    search_log: list[dict[str, Any]] = []
    desc = f"{opts.method} {'search' if opts.search_scale else 'fixed'}" if runner else "rtn"
    with _progress(len(layers), desc) as bar:
        for i, layer in enumerate(layers):
            layer.to(device)
            q, log = _quantize_layer(layer, f"model.layers.{i}", opts, runner)
            layer.to("cpu")
            quantized.update(q)
            search_log += log
            bar.update()
    writer = CheckpointWriter(out)
    source_bytes = 0
    for name, shape in source_tensor_names(path):
        source_bytes += _numel(shape) * 2
        export_tensor(writer, net, path, name, shape, quantized)
    writer.close()
    write_config(path, out, opts.w_group_size, opts.w_bits)
    copy_side_files(path, out)
    (out / SEARCH_LOG).write_text(json.dumps({"options": asdict(opts), "groups": search_log}, indent=1))
    logger.info(
        "wrote %s: weights take %s (%s at 16 bits) in %.0f s",
        out,
        format_bytes(writer.total_bytes),
        format_bytes(source_bytes),
        time.perf_counter() - t0,
    )
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
