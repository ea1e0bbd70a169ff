"""A Llama-style decoder for MindSpore built from ``mint.nn`` Cells (PyNative).

The architecture and module names are Hugging Face ``LlamaForCausalLM``'s, so the
tensor-parallel plan of ``examples/llama_common.py`` applies unchanged:

* ``model.embed_tokens`` — ``mindspore.nn.Embedding`` (the ``Gather`` Primitive; MindSpore
  2.10 has no CPU kernel for ``mint.nn.Embedding``);
* ``model.layers.N`` — ``input_layernorm`` (RMSNorm), ``self_attn`` (``q/k/v/o_proj``,
  rotary position embedding, grouped-query attention with a causal mask, softmax in
  float32), ``post_attention_layernorm``, ``mlp`` (SwiGLU: ``down(silu(gate(x)) * up(x))``);
* ``model.norm`` (RMSNorm) and ``lm_head`` (``mint.nn.Linear`` without bias; ``tie=True``
  shares the embedding table, as ``tie_word_embeddings``).

With ``num_experts`` set (``--moe E``) every layer's ``mlp`` is a mixture of experts laid
out as Hugging Face's ``MixtralSparseMoeBlock``: ``mlp.gate`` (the router: softmax over
``E`` logits, the top ``k`` renormalised) and ``mlp.experts`` (stacked ``gate_up_proj``
``[E, 2I, H]`` and ``down_proj`` ``[E, H, I]``, SwiGLU;
``forward(hidden, top_k_index, top_k_weights)``), so
``hyper_shard.parallel.ExpertParallel`` applies to ``model.layers.*.mlp.experts``.

Attention and the MLP compute with local sizes (``view(b, s, -1, head_dim)``), so under
tensor parallelism each rank runs its heads on plain local tensors. With
``attn_implementation="sdpa"`` (as Hugging Face's) attention is one call of hyper_shard's
``scaled_dot_product_attention`` (``is_causal=True``; the same math on plain tensors),
looked up per call, so ``hyper_shard.experimental.context_parallel`` can run it over a
sharded sequence; ``position_ids`` then give each token's rotary position. Weights are drawn
from a numpy generator (normal, std 0.02, as Hugging Face's ``initializer_range``), so
every process builds the same model. Imports MindSpore: only the worker processes import
this module.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from mindspore import Parameter, Tensor, mint, nn, ops

__all__ = ["LlamaConfig", "LlamaForCausalLM", "MoEBlock", "MoEExperts", "build_model"]


class LlamaConfig:
    """The model's sizes (the same fields as ``transformers.LlamaConfig``)."""

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        intermediate_size: int,
        num_hidden_layers: int,
        num_attention_heads: int,
        num_key_value_heads: int,
        max_position_embeddings: int,
        rms_norm_eps: float = 1e-5,
        rope_theta: float = 10000.0,
        tie_word_embeddings: bool = False,
        num_experts: int = 0,
        num_experts_per_tok: int = 2,
        attn_implementation: str = "eager",
    ) -> None:
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.intermediate_size, self.num_hidden_layers = intermediate_size, num_hidden_layers
        self.num_attention_heads, self.num_key_value_heads = (
            num_attention_heads,
            num_key_value_heads,
        )
        self.max_position_embeddings, self.rms_norm_eps = max_position_embeddings, rms_norm_eps
        self.rope_theta, self.tie_word_embeddings = rope_theta, tie_word_embeddings
        self.head_dim = hidden_size // num_attention_heads
        self.num_experts, self.num_experts_per_tok = num_experts, num_experts_per_tok
        self.attn_implementation = attn_implementation  # "eager" or "sdpa"


class RMSNorm(nn.Cell):
    """``x / sqrt(mean(x^2, -1) + eps) * weight`` (as ``LlamaRMSNorm``)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = Parameter(Tensor(np.ones(dim, np.float32)), name="weight")
        self.eps = eps

    def construct(self, x: Any) -> Any:
        var = mint.mean(x * x, -1, True)
        return x * mint.rsqrt(var + self.eps) * self.weight


def rotate_half(x: Any) -> Any:
    half = x.shape[-1] // 2
    return mint.cat((-x[..., half:], x[..., :half]), -1)


class Attention(nn.Cell):
    """Multi-head attention with rotary embeddings and grouped-query key/value heads."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.head_dim = hd
        self.groups = cfg.num_attention_heads // cfg.num_key_value_heads
        self.scale = 1.0 / math.sqrt(hd)
        self.sdpa = cfg.attn_implementation == "sdpa"
        self.q_proj = mint.nn.Linear(d, cfg.num_attention_heads * hd, bias=False)
        self.k_proj = mint.nn.Linear(d, cfg.num_key_value_heads * hd, bias=False)
        self.v_proj = mint.nn.Linear(d, cfg.num_key_value_heads * hd, bias=False)
        self.o_proj = mint.nn.Linear(cfg.num_attention_heads * hd, d, bias=False)

    def construct(
        self, hidden_states: Any, cos: Any = None, sin: Any = None, mask: Any = None
    ) -> Any:
        b, s = hidden_states.shape[0], hidden_states.shape[1]
        q = self.q_proj(hidden_states).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, s, -1, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.sdpa:  # one call, looked up per call (context_parallel patches it)
            from hyper_shard.platform.mindspore import functional

            out = functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=self.scale, enable_gqa=self.groups > 1
            )
            return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))
        if self.groups > 1:  # grouped-query attention: key/value head i // groups
            k = ops.repeat_interleave(k, self.groups, 1)
            v = ops.repeat_interleave(v, self.groups, 1)
        scores = mint.matmul(q, k.transpose(2, 3)) * self.scale + mask
        out = mint.matmul(mint.softmax(scores, -1), v)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Cell):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = mint.nn.Linear(d, f, bias=False)
        self.up_proj = mint.nn.Linear(d, f, bias=False)
        self.down_proj = mint.nn.Linear(f, d, bias=False)

    def construct(self, x: Any) -> Any:
        return self.down_proj(mint.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class MoERouter(nn.Cell):
    """``weight [E, H]``: ``(logits [T, E], top-k weights [T, k] renormalised, indices)``."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.top_k, self.num_experts = cfg.num_experts_per_tok, cfg.num_experts
        self.weight = Parameter(
            Tensor(np.zeros((cfg.num_experts, cfg.hidden_size), np.float32)), name="weight"
        )

    def construct(self, h: Any) -> Any:
        logits = mint.matmul(h, self.weight.T)
        top, idx = ops.topk(mint.softmax(logits, -1), self.top_k)
        return logits, top / top.sum(-1, keepdims=True), idx


class MoEExperts(nn.Cell):
    """``E`` SwiGLU experts stacked: ``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``.
    ``construct(hidden [T, H], top_k_index [T, k], top_k_weights [T, k]) -> [T, H]``: every
    expert on every token, weighted by the router where it chose that expert (dense:
    ``E`` times the work of routing, for a small reference model)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        e, d, f = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
        self.num_experts = e
        self.gate_up_proj = Parameter(
            Tensor(np.zeros((e, 2 * f, d), np.float32)), name="gate_up_proj"
        )
        self.down_proj = Parameter(Tensor(np.zeros((e, d, f), np.float32)), name="down_proj")
        self.act_fn = mint.nn.functional.silu

    def construct(self, h: Any, top_k_index: Any, top_k_weights: Any) -> Any:
        out = ops.zeros_like(h)
        for e in range(self.num_experts):
            w = (top_k_weights * (top_k_index == e).astype(top_k_weights.dtype)).sum(-1)
            gate, up = mint.chunk(mint.matmul(h, self.gate_up_proj[e].T), 2, -1)
            y = mint.matmul(self.act_fn(gate) * up, self.down_proj[e].T)
            out = out + w.reshape(-1, 1) * y
        return out


class MoEBlock(nn.Cell):
    """``experts(x, *gate(x))`` on the flattened tokens (as ``MixtralSparseMoeBlock``)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate = MoERouter(cfg)
        self.experts = MoEExperts(cfg)

    def construct(self, x: Any) -> Any:
        h = x.reshape(-1, x.shape[-1])
        _, weights, index = self.gate(h)
        return self.experts(h, index, weights).reshape(x.shape)


class DecoderLayer(nn.Cell):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoEBlock(cfg) if cfg.num_experts else MLP(cfg)

    def construct(self, x: Any, cos: Any, sin: Any, mask: Any) -> Any:
        h = self.input_layernorm(x)
        x = x + self.self_attn(hidden_states=h, cos=cos, sin=sin, mask=mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Cell):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.CellList([DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def construct(self, input_ids: Any, cos: Any, sin: Any, mask: Any) -> Any:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.norm(x)


class LlamaForCausalLM(nn.Cell):
    """``logits = lm_head(model(input_ids))``: ``input_ids (b, s)`` int32 -> ``(b, s, V)``
    (``position_ids (1 or b, s)``: each token's position; default ``0 .. s-1``)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = mint.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        s, hd = cfg.max_position_embeddings, cfg.head_dim
        inv = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
        freqs = np.arange(s, dtype=np.float64)[:, None] * inv[None]
        emb = np.concatenate([freqs, freqs], -1)
        self.cos = Tensor(np.cos(emb).astype(np.float32))  # (s, head_dim)
        self.sin = Tensor(np.sin(emb).astype(np.float32))
        causal = np.triu(np.full((s, s), -np.inf, np.float32), 1)
        self.mask = Tensor(causal)  # additive: -inf above the diagonal

    def construct(self, input_ids: Any, position_ids: Any = None) -> Any:
        s = input_ids.shape[1]
        if position_ids is None:
            h = self.model(input_ids, self.cos[:s], self.sin[:s], self.mask[:s, :s])
        else:  # (1 or b, s) positions: rotary tables gathered, (.., 1, s, head_dim)
            cos = ops.gather(self.cos, position_ids, 0).unsqueeze(1)
            sin = ops.gather(self.sin, position_ids, 0).unsqueeze(1)
            h = self.model(input_ids, cos, sin, self.mask[:s, :s])  # (sdpa: unused)
        return self.lm_head(h)


def build_model(cfg: LlamaConfig, seed: int) -> LlamaForCausalLM:
    """The model with weights drawn from ``numpy.random.RandomState(seed)`` (normal, std
    0.02; norms at 1), identical in every process."""
    net = LlamaForCausalLM(cfg)
    rs = np.random.RandomState(seed)
    emb = net.model.embed_tokens
    emb.embedding_table = Parameter(
        Tensor(rs.normal(0, 0.02, (cfg.vocab_size, cfg.hidden_size)).astype(np.float32)),
        name=emb.embedding_table.name,
    )
    for _, cell in net.cells_and_names():
        if isinstance(cell, mint.nn.Linear):
            w = rs.normal(0, 0.02, tuple(cell.weight.shape)).astype(np.float32)
            cell.weight = Parameter(Tensor(w), name=cell.weight.name)
    for layer in net.model.layers:
        if isinstance(layer.mlp, MoEBlock):  # router and experts drawn the same way
            for cell, names in (
                (layer.mlp.gate, ("weight",)),
                (layer.mlp.experts, ("gate_up_proj", "down_proj")),
            ):
                for name in names:
                    p = getattr(cell, name)
                    w = rs.normal(0, 0.02, tuple(p.shape)).astype(np.float32)
                    setattr(cell, name, Parameter(Tensor(w), name=p.name))
    if cfg.tie_word_embeddings:
        net.lm_head.weight = emb.embedding_table
    return net
