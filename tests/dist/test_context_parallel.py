"""``hyper_shard.experimental.context_parallel`` (PyTorch's context-parallel API) against
one process, on real gloo ranks (a mesh of 2): a small causal attention model over
sequence pieces gives the single-device loss and, once the ranks' parameter gradients are
summed (what FSDP/DDP do), the single-device gradients; the buffers are restored after."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import hyper_shard as hs
from hyper_shard.experimental import context_parallel

pytestmark = pytest.mark.multiproc


class _CausalLM(nn.Module):
    def __init__(self, vocab: int = 11, dim: int = 8, heads: int = 2, max_len: int = 16):
        super().__init__()
        self.heads = heads
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, s = tokens.shape
        h = self.tok(tokens) + self.pos(positions)
        q, k, v = self.qkv(h).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # looked up per call
        return self.out(a.transpose(1, 2).reshape(b, s, -1) + h)


def check_context_parallel(rank, world, seq):
    torch.manual_seed(0)
    ref = _CausalLM()
    model = _CausalLM()
    model.load_state_dict(ref.state_dict())
    tokens = torch.randint(0, 11, (2, seq))
    labels = torch.randint(0, 11, (2, seq))
    positions = torch.arange(seq).expand(2, seq).contiguous()
    ref_loss = F.cross_entropy(ref(tokens, positions).flatten(0, 1), labels.flatten())
    ref_loss.backward()

    mesh = hs.init_device_mesh("cpu", (world,))
    saved = [t.clone() for t in (tokens, labels, positions)]
    with context_parallel(mesh, buffers=[tokens, labels, positions], buffer_seq_dims=[1, 1, 1]):
        pieces = torch.arange(seq).chunk(world)
        assert tokens.shape == (2, len(pieces[rank]))
        assert torch.equal(positions[0], pieces[rank])
        logits = model(tokens, positions)
        local = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
        (local / (2 * seq)).backward()
    total = local.detach().clone()
    dist.all_reduce(total)
    torch.testing.assert_close(total / (2 * seq), ref_loss.detach(), rtol=1e-5, atol=1e-6)
    for p, r in zip(model.parameters(), ref.parameters()):
        g = p.grad.clone()
        dist.all_reduce(g)
        torch.testing.assert_close(g, r.grad, rtol=1e-4, atol=1e-5)
    for t, s in zip((tokens, labels, positions), saved):
        assert torch.equal(t, s)  # restored
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention
    # a buffer left as its piece; PyTorch's argument errors
    ids = torch.arange(seq).view(1, seq).clone()
    with context_parallel(mesh, buffers=[ids], buffer_seq_dims=[1], no_restore_buffers={ids}):
        pass
    assert torch.equal(ids[0], torch.arange(seq).chunk(world)[rank])
    with pytest.raises(ValueError, match="same number of elements"):
        with context_parallel(mesh, buffers=[ids], buffer_seq_dims=[]):
            pass
    with pytest.raises(ValueError, match="subset"):
        with context_parallel(
            mesh, buffers=[ids], buffer_seq_dims=[1], no_restore_buffers={labels}
        ):
            pass
    return 1


@pytest.mark.parametrize("seq", [8, 7])  # even pieces, and uneven ones
def test_context_parallel(dist2, seq):
    assert dist2.run(check_context_parallel, seq) == [1, 1]
