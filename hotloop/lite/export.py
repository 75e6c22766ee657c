"""Writing the quantized model as an AutoAWQ GEMM checkpoint under the source checkpoint's names.

Every tensor of the source checkpoint is traced to the parameter (and rows of it) that the model's
loader would put it in, by sending a column of row numbers through the model's own ``remap_weights``
and ``packed_modules_mapping``. So fused q/k/v and gate/up split back into their checkpoint
tensors, and InternLM2's packed ``wqkv`` is re-packed, with no per-architecture code here.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from hotloop.kernels.w4a16_layout import pack_int4
from hotloop.lite.quantize import QuantizedWeight
from hotloop.models.loader import safetensors_files
from hotloop.utils.logging import get_logger

logger = get_logger(__name__)

OUT_DTYPE = torch.float16
MAX_SHARD_BYTES = 4 * 2**30
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")
_SKIP_FILES = {"config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json"}


def source_tensor_names(src: Path) -> Iterator[tuple[str, tuple[int, ...]]]:
    """``(name, shape)`` of every tensor in the source checkpoint, without reading the data."""
    from safetensors import safe_open

    for file in safetensors_files(src):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, tuple(f.get_slice(name).get_shape())


def read_source_tensor(src: Path, name: str) -> torch.Tensor:
    from safetensors import safe_open

    for file in safetensors_files(src):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            if name in f.keys():
                return f.get_tensor(name)
    raise KeyError(name)


def param_of(model: nn.Module, ckpt_name: str) -> tuple[str, Any]:
    """The model parameter name and shard a (remapped) checkpoint name loads into."""
    mapping: dict[str, tuple[str, Any]] = getattr(model, "packed_modules_mapping", {})
    for part, (fused, shard) in mapping.items():
        marker = f".{part}."
        if marker in ckpt_name:
            return ckpt_name.replace(marker, f".{fused}.", 1), shard
    return ckpt_name, None


def trace_rows(model: nn.Module, name: str, num_rows: int) -> tuple[str, torch.Tensor | None] | None:
    """Where checkpoint tensor ``name`` lands: (parameter name, its rows in checkpoint order).

    Rows are None when the tensor is a whole parameter. None when nothing loads it (skipped
    buffers, a tied head's copy).
    """
    index = torch.arange(num_rows, dtype=torch.float64)[:, None]
    pieces = list(cast(Any, model).remap_weights([(name, index)]))
    targets = []
    for piece_name, rows in pieces:
        pname, shard = param_of(model, piece_name)
        targets.append((pname, shard, rows[:, 0].long()))
    pnames = {t[0] for t in targets}
    if len(pnames) != 1:
        raise ValueError(f"checkpoint tensor {name!r} feeds several parameters {sorted(pnames)}")
    pname = pnames.pop()
    if pname not in dict(model.named_parameters()):
        return None
    if len(targets) == 1 and targets[0][1] is None:
        return pname, None
    module = model.get_submodule(pname.rsplit(".", 1)[0])
    offsets: dict[Any, tuple[int, int]] = cast(Any, module).shard_offsets
    fused_row = torch.empty(num_rows, dtype=torch.long)
    for _pname, shard, ckpt_rows in targets:
        start, size = offsets[shard]
        fused_row[ckpt_rows] = torch.arange(start, start + size)
    return pname, fused_row


class CheckpointWriter:
    """Collects output tensors and writes them in safetensors shards of at most ``MAX_SHARD_BYTES``."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.files: list[tuple[str, list[str]]] = []
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        t = tensor.detach().cpu().contiguous()
        nbytes = t.numel() * t.element_size()
        if self.pending and self.pending_bytes + nbytes > MAX_SHARD_BYTES:
            self._flush()
        self.pending[name] = t
        self.pending_bytes += nbytes
        self.total_bytes += nbytes

    def _flush(self) -> None:
        from safetensors.torch import save_file

        name = f"model-{len(self.files) + 1:05d}.safetensors"
        save_file(self.pending, str(self.out_dir / name), metadata={"format": "pt"})
        self.files.append((name, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> None:
        if self.pending or not self.files:
            self._flush()
        n = len(self.files)
        if n == 1:
            (self.out_dir / self.files[0][0]).rename(self.out_dir / "model.safetensors")
            return
        weight_map: dict[str, str] = {}
        for i, (old, names) in enumerate(self.files):
            new = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            (self.out_dir / old).rename(self.out_dir / new)
            weight_map.update(dict.fromkeys(names, new))
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
        (self.out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def export_tensor(
    writer: CheckpointWriter,
    model: nn.Module,
    src: Path,
    name: str,
    shape: tuple[int, ...],
    quantized: dict[str, QuantizedWeight],
) -> bool:
    """Write checkpoint tensor ``name`` (quantized when its layer was); False if it belongs to none."""
    traced = trace_rows(model, name, shape[0]) if shape else None
    if traced is None:
        writer.add(name, read_source_tensor(src, name).to(OUT_DTYPE))
        return True
    pname, rows = traced
    module_name, leaf = pname.rsplit(".", 1)
    if leaf == "weight" and module_name in quantized:
        qw = quantized[module_name]
        q, z, s = (
            (qw.q, qw.zeros, qw.scales) if rows is None else (qw.q[rows], qw.zeros[rows], qw.scales[rows])
        )
        base = name[: -len("weight")]
        writer.add(base + "qweight", pack_int4(q.t().contiguous()))
        writer.add(base + "qzeros", pack_int4(z.t().contiguous()))
        writer.add(base + "scales", s.t().contiguous().to(OUT_DTYPE))
        return True
    value = dict(model.named_parameters())[pname].data
    value = value if rows is None else value[rows]
    if tuple(value.shape) != shape:
        raise ValueError(f"{name}: traced to {pname} of shape {tuple(value.shape)}, expected {shape}")
    writer.add(name, value.to(OUT_DTYPE))
    return True


def write_config(src: Path, out: Path, group_size: int, bits: int) -> None:
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "awq",
        "bits": bits,
        "group_size": group_size,
        "zero_point": True,
        "version": "gemm",
        "modules_to_not_convert": None,
    }
    config["torch_dtype"] = "float16"
    if "dtype" in config:
        config["dtype"] = "float16"
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def copy_side_files(src: Path, out: Path) -> list[str]:
    """Tokenizer, generation config, chat template...: every small non-weight file of the folder."""
    copied = []
    for f in sorted(src.iterdir()):
        if f.is_file() and f.name not in _SKIP_FILES and not f.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(f, out / f.name)
            copied.append(f.name)
    return copied
