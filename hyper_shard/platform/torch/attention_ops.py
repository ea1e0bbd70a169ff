"""What context-parallel attention asks of torch: a custom autograd node over several
inputs, an isend/irecv pair in flight, and the CPU flash attention that returns its
log-sum-exp (the local block of ring attention). The :class:`~hyper_shard.platform.torch.
TorchPlatform` methods of the same purpose call these."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._C import DisableTorchFunctionSubclass

__all__ = ["CustomN", "PendingRecv", "post", "flash_lse", "flash_lse_backward"]

#: dtypes torch's CPU flash attention takes
_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


class CustomN(torch.autograd.Function):
    """``fwd(*inputs)`` as one node over several inputs; backward ``bwd(grad)``."""

    @staticmethod
    def forward(ctx: Any, fwd: Callable, bwd: Callable, *inputs: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.bwd = bwd
        return fwd(*inputs)  # type: ignore[no-any-return]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        with DisableTorchFunctionSubclass():
            return (None, None, *ctx.bwd(g))


class PendingRecv:
    """An isend/irecv pair in flight: ``wait()`` completes both and gives the received
    tensor."""

    __slots__ = ("reqs", "recv")

    def __init__(self, reqs: list[Any], recv: torch.Tensor) -> None:
        self.reqs, self.recv = reqs, recv

    def wait(self) -> torch.Tensor:
        for r in self.reqs:
            r.wait()
        self.reqs = []
        return self.recv


def post(send: torch.Tensor, dst: int, recv: torch.Tensor, src: int, pg: Any, tag: int) -> list:
    return [
        dist.isend(send, dst, group=pg, tag=tag),
        dist.irecv(recv, src, group=pg, tag=tag),
    ]


def _flash_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    return (
        q.device.type == "cpu"
        and q.dtype in _FLASH_DTYPES
        and q.shape[-1] == v.shape[-1]  # one head size for query, key and value
        and 0 not in (*q.shape, *k.shape)
    )


def flash_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """torch's CPU flash attention (``_scaled_dot_product_flash_attention_for_cpu``): the
    output and the log-sum-exp (float32); None off CPU, for other dtypes, a value head
    size other than the query's, or empty blocks (the kernels compose the math)."""
    if not _flash_ok(q, k, v):
        return None
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, scale=scale
    )
    return out, lse


def flash_lse_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Its backward from a given output and log-sum-exp; None where :func:`flash_lse` is."""
    if not _flash_ok(q, k, v):
        return None
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dout.to(q.dtype).contiguous(), q, k, v, out.to(q.dtype).contiguous(),
        lse.contiguous(), 0.0, causal, scale=scale,
    )  # fmt: skip
    return dq, dk, dv
