"""The multi-step decode input advance against its torch reference, and the reference against
slots computed by hand from the block tables; the pending-id gather against indexing."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import interpret

from hotloop.kernels import reference


def _inputs(b: int, pad: int, bs: int, width: int, device: str, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n = b + pad
    lens = torch.randint(1, bs * width - 1, (n,), generator=gen).to(torch.int32)
    lens[b:] = 0  # padding rows of a graph: seq_len 0, slot -1
    return {
        "sampled": torch.randint(0, 50000, (b,), generator=gen),
        "input_ids": torch.randint(0, 50000, (n,), generator=gen),
        "positions": lens.long() - 1 + torch.randint(0, 3, (n,), generator=gen),  # an M-RoPE-like offset
        "slots": torch.full((n,), -1, dtype=torch.int64),
        "seq_lens": lens,
        "block_tables": torch.randperm(n * width, generator=gen).view(n, width).to(torch.int32),
        "history": torch.full((n,), -7, dtype=torch.int64),
        # each row's last input index: most rows go on, every third has reached its end
        "limits": torch.where(torch.arange(n) % 3 == 2, lens.long() - 1, lens.long() + 5),
    }


def _run(fn, t: dict[str, torch.Tensor], bs: int, device: str) -> dict[str, torch.Tensor]:  # noqa: ANN001
    t = {k: v.clone().to(device) for k, v in t.items()}
    fn(
        t["sampled"],
        t["input_ids"],
        t["positions"],
        t["slots"],
        t["seq_lens"],
        t["block_tables"],
        bs,
        t["history"],
        t["limits"],
    )
    return {k: v.cpu() for k, v in t.items()}


def test_reference_by_hand() -> None:
    bs, width, b, pad = 16, 5, 6, 2
    t = _inputs(b, pad, bs, width, "cpu", 0)
    got = _run(reference.decode_advance, t, bs, "cpu")
    ended = 0
    for i in range(b + pad):
        if i < b:
            p = int(t["seq_lens"][i])
            assert int(got["input_ids"][i]) == int(got["history"][i]) == int(t["sampled"][i])
            if p <= int(t["limits"][i]):
                assert int(got["positions"][i]) == int(t["positions"][i]) + 1
                assert int(got["slots"][i]) == int(t["block_tables"][i, p // bs]) * bs + p % bs
                assert int(got["seq_lens"][i]) == p + 1
            else:  # past its end: writes nothing, stays where it is
                ended += 1
                assert int(got["slots"][i]) == -1
                assert int(got["positions"][i]) == int(t["positions"][i])
                assert int(got["seq_lens"][i]) == p
        else:  # padding rows are left alone
            for k in ("input_ids", "positions", "slots", "seq_lens", "history"):
                assert int(got[k][i]) == int(t[k][i]), (k, i)
    assert ended == 2


def _check_kernel(device: str, b: int, pad: int, bs: int, width: int) -> None:
    from hotloop.kernels.decode_advance import decode_advance

    t = _inputs(b, pad, bs, width, "cpu", b * 31 + bs)
    want = _run(reference.decode_advance, t, bs, "cpu")
    got = _run(decode_advance, t, bs, device)
    for k in want:
        assert torch.equal(got[k], want[k]), k


@interpret
@pytest.mark.parametrize("b,pad,bs,width", [(1, 0, 16, 3), (5, 3, 64, 4), (40, 8, 16, 9)])
def test_decode_advance_interpreted(b: int, pad: int, bs: int, width: int) -> None:
    _check_kernel("cpu", b, pad, bs, width)


@pytest.mark.gpu
@pytest.mark.parametrize("b,pad", [(1, 0), (7, 1), (256, 0), (300, 12)])
@pytest.mark.parametrize("bs", [16, 64])
def test_decode_advance_gpu(b: int, pad: int, bs: int) -> None:
    _check_kernel("cuda", b, pad, bs, 33)


def test_launcher_rejects_bad_dtypes() -> None:
    pytest.importorskip("triton")
    from hotloop.kernels.decode_advance import decode_advance

    t = _inputs(4, 0, 16, 3, "cpu", 1)
    with pytest.raises(ValueError, match="seq_lens"):
        decode_advance(
            t["sampled"],
            t["input_ids"],
            t["positions"],
            t["slots"],
            t["seq_lens"].long(),
            t["block_tables"],
            16,
            t["history"],
            t["limits"],
        )


def _check_gather(device: str, n: int, size: int) -> None:
    from hotloop.kernels.gather_ids import gather_ids

    gen = torch.Generator().manual_seed(n)
    values = torch.randint(0, 1 << 40, (size,), generator=gen).to(device)
    index = torch.randint(0, size, (n,), generator=gen).to(device)
    out = torch.full((size + 3,), -1, dtype=torch.long, device=device)
    got = gather_ids(values, index, out)
    assert got.data_ptr() == out.data_ptr() and torch.equal(got.cpu(), values.cpu()[index.cpu()])
    assert bool((out[n:] == -1).all())  # nothing past n is written


@interpret
@pytest.mark.parametrize("n,size", [(1, 4), (5, 9), (40, 300)])
def test_gather_ids_interpreted(n: int, size: int) -> None:
    _check_gather("cpu", n, size)


@pytest.mark.gpu
@pytest.mark.parametrize("n,size", [(1, 1), (255, 256), (256, 256), (1000, 1024)])
def test_gather_ids_gpu(n: int, size: int) -> None:
    _check_gather("cuda", n, size)
