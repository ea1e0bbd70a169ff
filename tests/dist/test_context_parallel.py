"""``hyper_shard.experimental.context_parallel`` (PyTorch's context-parallel API) against
one process, on real gloo ranks (a mesh of 2): a small causal attention model over
sequence pieces gives the single-device loss and, once the ranks' parameter gradients are
summed (what FSDP/DDP do), the single-device gradients — for every attention method
(the cost model's choice, ring, all-to-all, all-gather) and both sequence layouts
(head-tail load-balanced, contiguous; uneven pieces). The buffers are restored after,
``context_parallel_unshard`` undoes the layout, and bad input (a length the forced
load-balanced layout cannot split, heads the all-to-all form cannot split) raises on
every rank with the process group still usable."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import hyper_shard as hs
from hyper_shard.errors import ShardingError
from hyper_shard.experimental import (
    context_parallel,
    context_parallel_unshard,
    get_context_parallel_method,
    set_context_parallel_method,
    set_load_balance,
    set_rotate_method,
)
from hyper_shard.kernels.attention_layout import HEAD_TAIL, PLAIN

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


def _one_case(rank, world, seq, method, balance, heads=2):
    torch.manual_seed(0)
    ref = _CausalLM(heads=heads)
    model = _CausalLM(heads=heads)
    model.load_state_dict(ref.state_dict())
    tokens = torch.randint(0, 11, (2, seq))
    labels = torch.randint(0, 11, (2, seq))
    positions = torch.arange(seq).expand(2, seq).contiguous()
    ref_loss = F.cross_entropy(ref(tokens, positions).flatten(0, 1), labels.flatten())
    ref_loss.backward()

    mesh = hs.init_device_mesh("cpu", (world,))
    set_context_parallel_method(method)
    set_load_balance(balance)
    layout = HEAD_TAIL if balance is not False and seq % (2 * world) == 0 else PLAIN
    saved = [t.clone() for t in (tokens, labels, positions)]
    with context_parallel(mesh, buffers=[tokens, labels, positions], buffer_seq_dims=[1, 1, 1]):
        sizes = layout.sizes(seq, world)
        mine = torch.tensor(layout.order(seq, world)).narrow(0, sum(sizes[:rank]), sizes[rank])
        assert torch.equal(positions[0], mine)  # the layout's piece, in place
        assert torch.equal(tokens, saved[0][:, mine]) and torch.equal(labels, saved[1][:, mine])
        logits = model(tokens, positions)
        local = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
        (local / (2 * seq)).backward()
        whole = context_parallel_unshard(mesh, [logits.detach()], [1])[0]
    total = local.detach().clone()
    dist.all_reduce(total)
    torch.testing.assert_close(total / (2 * seq), ref_loss.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(whole, ref(saved[0], saved[2]).detach(), rtol=1e-5, atol=1e-5)
    for p, r in zip(model.parameters(), ref.parameters()):
        g = p.grad.clone()
        dist.all_reduce(g)
        torch.testing.assert_close(g, r.grad, rtol=1e-4, atol=1e-5)
    for t, s in zip((tokens, labels, positions), saved):
        assert torch.equal(t, s)  # restored
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention


def check_context_parallel(rank, world):
    torch.set_num_threads(1)
    n = 0
    try:
        for method in ("auto", "ring", "ulysses", "allgather"):
            for seq, balance in ((8, None), (7, None), (8, False), (12, True)):
                _one_case(rank, world, seq, method, balance)
                n += 1
        set_rotate_method("alltoall")  # PyTorch's name for the ring rotation
        assert get_context_parallel_method() == "ring"
        _one_case(rank, world, 8, "ring", None)
        with pytest.raises(NotImplementedError, match="kv shards rotation"):
            set_rotate_method("ring")
        with pytest.raises(ValueError, match="use one of auto, allgather, ring, ulysses"):
            set_context_parallel_method("zigzag")
    finally:
        set_context_parallel_method("auto")
        set_load_balance(None)
    return n


def check_arguments_and_bad_input(rank, world):
    torch.set_num_threads(1)
    mesh = hs.init_device_mesh("cpu", (world,))
    seq = 8
    # a buffer left as its piece; unshard gives the whole sequence back, layout undone
    ids = torch.arange(seq).view(1, seq).clone()
    with context_parallel(mesh, buffers=[ids], buffer_seq_dims=[1], no_restore_buffers={ids}):
        pass
    assert torch.equal(ids[0], torch.tensor(HEAD_TAIL.order(seq, world)).chunk(world)[rank])
    assert torch.equal(context_parallel_unshard(mesh, [ids], [1])[0], torch.arange(seq)[None])
    labels = torch.zeros(1, seq)
    with pytest.raises(ValueError, match="same number of elements"):
        with context_parallel(mesh, buffers=[ids], buffer_seq_dims=[]):
            pass
    with pytest.raises(ValueError, match="subset"):
        with context_parallel(
            mesh, buffers=[ids], buffer_seq_dims=[1], no_restore_buffers={labels}
        ):
            pass
    with pytest.raises(ValueError, match="Parameter"):
        with context_parallel(mesh, buffers=[nn.Parameter(torch.zeros(2, 4))], buffer_seq_dims=[1]):
            pass
    try:
        # the forced load-balanced layout cannot split 7 into 2 x 2 chunks: every rank
        # raises before anything moves, and the buffer is untouched
        set_load_balance(True)
        odd = torch.arange(7).view(1, 7).clone()
        with pytest.raises(ValueError, match=r"2 x 2 = 4 equal chunks.*length is 7"):
            with context_parallel(mesh, buffers=[odd], buffer_seq_dims=[1]):
                pass
        assert torch.equal(odd, torch.arange(7).view(1, 7))
        set_load_balance(None)
        # a sequence that leaves a rank no token: every rank raises before anything moves
        # (rank 1 used to fail in the model's forward on its empty piece while rank 0
        # waited in attention's size all-gather: a hang)
        one = torch.arange(1).view(1, 1).clone()
        with pytest.raises(ValueError, match=r"as \[1, 0\]: rank 1 would hold no token"):
            with context_parallel(mesh, buffers=[one], buffer_seq_dims=[1]):
                pass
        assert torch.equal(one, torch.arange(1).view(1, 1))
        # the all-to-all form cannot split 3 heads over 2 ranks: every rank raises
        set_context_parallel_method("ulysses")
        q = torch.randn(1, 3, 4, 4)
        with pytest.raises(ShardingError, match="3 query heads per rank do not split over 2"):
            with context_parallel(mesh, buffers=[], buffer_seq_dims=[]):
                F.scaled_dot_product_attention(q, q, q, is_causal=True)
    finally:
        set_context_parallel_method("auto")
        set_load_balance(None)
    t = torch.ones(1)
    dist.all_reduce(t)  # the group still works: nothing hung
    return int(t.item())


def test_context_parallel(dist2):
    assert dist2.run(check_context_parallel, timeout=600) == [16, 16]


def test_arguments_and_bad_input(dist2):
    assert dist2.run(check_arguments_and_bad_input) == [2, 2]
