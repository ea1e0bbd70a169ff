"""hyper-parallel's op specs, loaded unchanged: its built-in op classes mapped onto ours.

hyper-parallel (``mindspore-ai/hyper-parallel``) ships a YAML directory
(``hyper_parallel/core/shard/ops/yaml/*.yaml``) whose entries name an op (a MindSpore
Primitive such as ``ReLU``, or a torch function's short name such as ``relu``) and the
class that shards it: ``distributed_op_file: parallel_elementwise``,
``distributed_op_class: ElementWiseDistributedOp``. Those modules are hyper-parallel's
own; a user pointing ``HYPER_PARALLEL_OPS_YAML_DIR`` at that directory (or at a copy with
their additions) gets, for each of its built-in ``(distributed_op_file,
distributed_op_class)`` pairs, the hyper_shard rule with the same meaning:

* an op that a built-in hyper_shard entry already binds keeps the built-in binding (the
  same rule, checked by the conformance suites): the hyper-parallel entry adds nothing,
  and is no duplicate;
* any other op gets a fresh instance of the built-in entry in :data:`CLASS_TO_ENTRY`
  (e.g. ``ElementWiseDistributedOp`` -> the ``exp`` entry's pointwise rule,
  ``ReshapeDistributedOp`` -> ``reshape``'s view rule), named after the hyper-parallel
  entry;
* a pair with no hyper_shard equivalent (NPU-only fused kernels, ``FlashAttentionScore``,
  ``GatherNd``...) loads as an op that raises :class:`~hyper_shard.errors.ShardingError`
  when called, naming the class and how to bind the op;
* a class of a hyper-parallel ``parallel_*`` module that this table does not know (one
  hyper-parallel added later) loads the same way, so one new class never fails the whole
  directory; a ``parallel_*`` module the user installed (importable) is imported as any
  user module, and its missing class fails at load;
* names a framework does not have (hyper-parallel's YAML spans versions: ``Silu``,
  ``torch.floor_div``) are skipped by the platform binders instead of failing the table
  (``lenient_names``).

Only the loader consults this module (three hooks: :func:`build` for an entry's op,
:func:`merge` for duplicates, :func:`special_name` for ``__invert__``-style op names); user classes in the seed format (any other file or class)
load as before.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from typing import Any

from ..errors import ShardingError
from .classes import seed_names

__all__ = [
    "CLASS_TO_ENTRY",
    "NAME_TO_ENTRY",
    "build",
    "merge",
    "special_name",
    "is_builtin_pair",
    "unsupported_op_class",
]

#: hyper-parallel's built-in (distributed_op_file, distributed_op_class) pairs -> the
#: built-in hyper_shard entry with the same sharding semantics (None: no equivalent)
CLASS_TO_ENTRY: dict[tuple[str, str], str | None] = {
    # elementwise: plain, linear (add/sub: Partial + Partial stays Partial), bilinear (mul)
    ("parallel_elementwise", "ElementWiseDistributedOp"): "exp",
    ("parallel_elementwise", "AddDistributedOp"): "add",
    ("parallel_elementwise", "SubDistributedOp"): "sub",
    ("parallel_elementwise", "ElementWiseWithPartialDistributedOp"): "mul",
    ("parallel_tuple_elementwise", "TupleElementWiseDistributedOp"): None,
    ("parallel_elementwise", "LessEqualDistributedOp"): "exp",
    ("parallel_cell_backward_hook", "CellBackwardHookDistributedOp"): None,
    # reductions (max/min: torch.max's three forms; ArgMaxWithValue: MindSpore's (index,
    # value) form, which the max entry binds)
    ("parallel_reduce", "SumExtDistributedOp"): "sum",
    ("parallel_reduce", "MeanExtDistributedOp"): "mean",
    ("parallel_reduce", "ReduceMaxDistributedOp"): "amax",
    ("parallel_reduce", "ProdExtDistributedOp"): "prod",
    ("parallel_reduce", "AllExtDistributedOp"): "all",
    ("parallel_reduce", "MaxDistributedOp"): "max",
    ("parallel_reduce", "MinDistributedOp"): "min",
    ("parallel_argmax_with_value_ops", "ArgMaxWithValueDistributedOp"): "max",
    ("parallel_cumsum", "CumsumDistributedOp"): "cumsum",
    # products
    ("parallel_matmul", "MatMulExtDistributedOp"): "matmul",
    ("parallel_matmul", "MatMulDistributedOp"): "matmul_transposed",
    ("parallel_matmul", "BatchMatMulExtDistributedOp"): "bmm",
    ("parallel_matmul", "BatchMatMulDistributedOp"): "matmul_transposed",
    ("parallel_matmul", "LinearDistributedOp"): "linear",
    ("parallel_outer", "OuterDistributedOp"): "outer",
    ("parallel_new_ones", "NewOnesDistributedOp"): "new_factory",
    ("parallel_all_gather_matmul", "AllGatherMatmulDistributedOp"): None,
    ("parallel_matmul_reduce_scatter", "MatmulReduceScatterDistributedOp"): None,
    # views and shape ops
    ("parallel_reshape", "ReshapeDistributedOp"): "reshape",
    ("parallel_transpose", "TransposeDistributedOp"): "permute",
    ("parallel_squeeze", "SqueezeDistributedOp"): "squeeze",
    ("parallel_expand_dims", "ExpandDimsDistributedOp"): "unsqueeze",
    ("parallel_expand", "ExpandDistributedOp"): "expand",
    ("parallel_expand", "ExpandAsDistributedOp"): "expand_as",
    ("parallel_flatten", "FlattenDistributedOp"): "flatten",
    ("parallel_atleast_1d", "Atleast1DDistributedOp"): None,
    # split / concat / stack family
    ("parallel_split", "SplitDistributedOp"): "split",
    ("parallel_split", "SplitTensorDistributedOp"): "split",
    ("parallel_split", "SplitWithSizeDistributedOp"): "split",
    ("parallel_split", "SplitTensorViewDistributedOp"): "split",
    ("parallel_split", "SplitWithSizeViewDistributedOp"): "split",
    ("parallel_split", "TensorSplitDistributedOp"): None,
    ("parallel_chunk_view", "ChunkViewDistributedOp"): "chunk",
    ("parallel_unbind", "UnbindDistributedOp"): "unbind",
    ("parallel_concat", "ConcatDistributedOp"): "cat",
    ("parallel_stack", "StackDistributedOp"): "stack",
    ("parallel_vstack", "VstackDistributedOp"): None,
    ("parallel_repeat", "RepeatDistributedOp"): "repeat",
    ("parallel_repeat_interleave", "RepeatInterleaveDistributedOp"): "repeat_interleave",
    ("parallel_pad", "PadDistributedOp"): "pad",
    ("parallel_tril", "TrilDistributedOp"): "tril",
    # indexing
    ("parallel_gather", "IndexSelectDistributedOp"): "index_select",
    ("parallel_gather", "GatherDDistributedOp"): "gather",
    ("parallel_gather", "GatherDistributedOp"): "gather",  # its older name (index-shaped output)
    ("parallel_gather", "GatherNdDistributedOp"): None,
    ("parallel_getitem", "GetItemDistributedOp"): "getitem",
    ("parallel_setitem", "SetItemDistributedOp"): "setitem",
    ("parallel_slice", "SliceDistributedOp"): None,
    ("parallel_slice_ext", "SliceExtDistributedOp"): "slice_dim",  # (input, dim, start, end, step)
    ("parallel_scatter", "ScatterDistributedOp"): "scatter",
    ("parallel_scatter_update", "ScatterUpdateDistributedOp"): None,
    ("parallel_inplace_scatter_value", "InplaceScatterValueDistributedOp"): None,
    ("parallel_index_add", "IndexAddDistributedOp"): None,
    ("parallel_masked_scatter", "MaskedScatterDistributedOp"): None,
    ("parallel_nonzero", "NonzeroDistributedOp"): None,
    ("parallel_isin", "IsinDistributedOp"): None,
    ("parallel_one_hot_ext", "OneHotExtDistributedOp"): None,
    # sorting
    ("parallel_topk", "TopKDistributedOp"): "topk",
    ("parallel_sort", "SortDistributedOp"): "sort",
    ("parallel_argsort", "ArgsortDistributedOp"): "argsort",
    ("parallel_histc_ext", "HistcExtDistributedOp"): None,
    # normalisation, softmax, embedding
    ("parallel_norm", "NormDistributedOp"): "rms_norm_gamma",
    ("parallel_norm", "LayerNormDistributedOp"): "layer_norm",
    ("parallel_activation_with_axis", "ActivationWithAxisDistributedOp"): "softmax",
    ("parallel_swiglu", "SwiGLUDistributedOp"): "glu",  # halves its axis
    ("parallel_embedding", "EmbeddingDistributedOp"): "embedding",
    # attention
    ("parallel_scaled_dot_product_attention", "ScaledDotProductAttentionDistributedOp"): (
        "scaled_dot_product_attention"
    ),
    ("parallel_ms_flash_attention_score", "FlashAttentionScoreDistributedOp"): None,
    ("parallel_npu_flash_attention_score", "NPUFlashAttentionScoreDistributedOp"): None,
    ("parallel_npu_flash_attention_score", "FlashAttentionScoreDistributedOp"): None,
    ("parallel_npu_sparse_flash_attention", "SparseFlashAttentionDistributedOp"): None,
    ("parallel_paged_attention", "PagedAttentionDistributedOp"): None,
    ("parallel_rotary_position_embedding", "RotaryPositionEmbeddingDistributedOp"): None,
    # random
    ("parallel_multinomial", "MultinomialDistributedOp"): None,
    # convolutions and NPU-only fused kernels
    ("parallel_conv1d", "Conv1dDistributedOp"): None,
    ("parallel_conv3d", "Conv3dDistributedOp"): None,
    ("parallel_lightning_indexer", "LightningIndexerDistributedOp"): None,
    ("parallel_mhc_head", "NpuMhcHeadDistributedOp"): None,
    ("parallel_mhc_post", "NpuMhcPostDistributedOp"): None,
    ("parallel_mhc_pre_cmhc", "NpuMhcPreCmhcDistributedOp"): None,
    ("parallel_mhc_pre_sinkhorn", "NpuMhcPreSinkhornDistributedOp"): None,
    ("parallel_situ_glu", "NpuSituGluDistributedOp"): None,
    (
        "parallel_npu_sparse_lightning_indexer_grad_kl_loss",
        "NpuSparseLightningIndexerGradKlLossDistributedOp",
    ): None,
    (
        "parallel_npu_dense_lightning_indexer_grad_kl_loss",
        "NpuDenseLightningIndexerGradKlLossDistributedOp",
    ): None,
    (
        "parallel_npu_dense_lightning_indexer_softmax_lse",
        "NpuDenseLightningIndexerSoftmaxLseDistributedOp",
    ): None,
}


#: ops whose hyper-parallel class is shared with ops of another layout (``Swiglu`` halves
#: its axis like ``glu``, where ``Softmax`` keeps it)
NAME_TO_ENTRY: dict[str, str] = {"Swiglu": "glu"}


def special_name(name: str, body: Any, default: Any) -> bool:
    """True if ``name`` (``__x__``) is a misspelt special key of an op-spec file, False if
    it is an op: hyper-parallel names operators so (``__invert__: {distributed_op_class:
    ...}``), or any entry in a file whose ``__default__`` gives a ``distributed_op_class``."""
    if not (name.startswith("__") and name.endswith("__") and "." not in name):
        return False
    seed = "distributed_op_class"
    return not (
        (isinstance(body, dict) and seed in body) or (isinstance(default, dict) and seed in default)
    )


#: hyper-parallel names its op modules ``parallel_<op>`` (``distributed_op_file``)
HP_MODULE_PREFIX = "parallel_"


def _pair(entry: Any) -> tuple[str, str] | None:
    """The ``(distributed_op_file, distributed_op_class)`` of a seed-format entry, or None."""
    if not getattr(entry, "distributed_op_class", None) or entry.distributed_op_module:
        return None
    file = (entry.distributed_op_file or "").removesuffix(".py")
    return (file, entry.distributed_op_class) if file else None


def _importable(module: str) -> bool:
    """True if ``module`` can be imported here (installed, or in
    ``HYPER_PARALLEL_OPS_PYTHON_PATH``, which the loader has appended to ``sys.path``)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def is_builtin_pair(entry: Any) -> bool:
    """True for a seed-format entry naming one of hyper-parallel's own classes: a pair of
    :data:`CLASS_TO_ENTRY`, or any class of a ``parallel_*`` module that is not importable
    here (hyper-parallel's module, not installed: a class it added after this table was
    written). A ``parallel_*`` module of the user's own (importable) loads as usual."""
    pair = _pair(entry)
    if pair is None:
        return False
    return pair in CLASS_TO_ENTRY or (
        pair[0].startswith(HP_MODULE_PREFIX) and not _importable(pair[0])
    )


_UNSUPPORTED: list[type] = []


def unsupported_op_class() -> type:
    """The op of a hyper-parallel class with no hyper_shard equivalent (yet, or not known
    to this table): it loads, and raises a :class:`~hyper_shard.errors.ShardingError`
    naming the class and how to bind the op when called (defined lazily: the registry is
    imported before the dispatch layer)."""
    if not _UNSUPPORTED:
        from ..dispatch.op import DistributedOp, Layout, OpCall

        class UnsupportedHyperParallelOp(DistributedOp):
            lenient_names = True

            def __init__(
                self, name: str, params: Any = None, origin: str = "", known: bool = True
            ) -> None:
                super().__init__(name, {})
                self.origin, self.known = origin, known

            def infer_layout(self, call: OpCall) -> Layout:
                what = (
                    "which has no hyper_shard rule"
                    if self.known
                    else "a hyper-parallel class hyper_shard does not map (not in "
                    "hyper_shard/registry/hyper_parallel.py)"
                )
                raise ShardingError(
                    f"{call.describe()}: entry {self.name!r} names hyper-parallel's "
                    f"{self.origin}, {what}; bind the op yourself: an entry "
                    f"'{self.name}: {{rule: <a hyper_shard rule, e.g. pointwise>, override: "
                    f"true}}' (or 'class: module:Class') in a YAML directory listed after "
                    f"this one in HYPER_PARALLEL_OPS_YAML_DIR (docs/custom_ops.md; "
                    f"'hyper-shard ops list' shows the rules), or redistribute the inputs "
                    f"to Replicate() and call the op on to_local() tensors"
                )

        _UNSUPPORTED.append(UnsupportedHyperParallelOp)
    return _UNSUPPORTED[0]


_BUILTINS: dict[str, Any] = {}


def _builtin_entries() -> dict[str, Any]:
    if not _BUILTINS:
        from .loader import builtin_dirs, load_dir

        for d in builtin_dirs():
            for le in load_dir(d):
                _BUILTINS[le.name] = le
    return _BUILTINS


def _builtin_names(key: str) -> dict[str, list[str]]:
    """Short function name -> the built-in entries' names on platform ``key`` ending with it."""
    out: dict[str, list[str]] = {}
    for le in _builtin_entries().values():
        for n in le.bindings.get(key, ()):
            out.setdefault(n.rsplit(".", 1)[-1], []).append(n)
    return out


def build(file: str, name: str, entry: Any) -> Any:
    """The op of a seed-format entry naming a hyper-parallel built-in class (see the
    module docstring), or None for any other entry (the loader builds it as usual)."""
    pair = _pair(entry)
    if pair is None or not is_builtin_pair(entry):
        return None
    target = NAME_TO_ENTRY.get(name, CLASS_TO_ENTRY.get(pair))
    origin = f"{pair[1]} ({pair[0]})"
    if target is None:
        return unsupported_op_class()(name, origin=origin, known=pair in CLASS_TO_ENTRY)
    proto = _builtin_entries()[target].op
    op = type(proto)(name, proto.params)
    op.lenient_names = True  # type: ignore[attr-defined]
    return op


def merge(entries: Iterable[Any], loaded: dict[str, Any]) -> list[Any]:
    """``entries`` of one directory without what earlier entries already define: a
    hyper-parallel entry whose name is taken is dropped, and its platform names already
    bound elsewhere are removed (the earlier binding, built-in first, keeps them)."""
    bound = {(k, n) for le in loaded.values() for k, ns in le.bindings.items() for n in ns}
    out: list[Any] = []
    for le in entries:
        if getattr(le.op, "lenient_names", False) and is_builtin_pair(le.entry):
            if le.name in loaded or any(o.name == le.name for o in out):
                continue
            derived = seed_names(le.name)
            for k, names in le.bindings.items():
                if names == derived.get(k) and "." not in le.name:
                    # a short name means every function of that name (hyper-parallel keys
                    # torch ops by __name__): the built-ins' functions of that name
                    same = _builtin_names(k).get(le.name)
                    if same:
                        names[:] = same
                names[:] = [n for n in names if (k, n) not in bound]
        bound |= {(k, n) for k, ns in le.bindings.items() for n in ns}
        out.append(le)
    return out
