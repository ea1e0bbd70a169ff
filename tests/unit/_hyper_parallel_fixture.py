"""hyper-parallel's shipped op specs, written from a reading of the public repository
``mindspore-ai/hyper-parallel`` (``hyper_parallel/core/shard/ops/yaml/*.yaml``): every
file with its entries as (op name, distributed_op_file, distributed_op_class), the extra
keys its files carry (``dist_op_name``, ``infer_layout_suffix``, ``template_name``) and the
``__default__`` blocks, so the directory written from it has hyper-parallel's form. Files
of several versions are included (the repository renamed some), so a few op names appear
in two files, as they would if both versions were pointed at.

Every stored version of the directory was read (84 file names over the repository's
history, 1-16 versions each); a file whose older version differs in its pairs or names is
kept a second time as ``NAME.vN.yaml`` (``reduce_ops.v2.yaml``: ``max`` ->
``MaxDistributedOp``; ``gather_ops.v1.yaml``: ``GatherD`` -> ``GatherDistributedOp``;
``torch_flash_attention_score.v1.yaml``: the NPU ``FlashAttentionScoreDistributedOp``...).
``module_classes.yaml`` names, under the op names their classes register, the classes of
hyper-parallel's ``parallel_*`` modules (``parallel_argmax_with_value_ops``,
``parallel_slice_ext``, ``parallel_reduce``'s ``ProdExt``/``AllExt``/``Min``,
``parallel_swiglu``...) that the early-2026 directory names in versions whose file text the
index does not keep, so that every class the directory can name is in the fixture."""

from __future__ import annotations

from typing import Any

EW = ("parallel_elementwise", "ElementWiseDistributedOp")
Entry = tuple[str, str, str, dict[str, Any]]


def _many(names: list[str], file: str, cls: str, **extra: Any) -> list[Entry]:
    return [(n, file, cls, dict(extra)) for n in names]


#: file name -> (the __default__ (file, class) or None, entries)
FILES: dict[str, tuple[tuple[str, str] | None, list[Entry]]] = {
    "element_wise_ops.yaml": (
        EW,
        [
            *_many(
                [
                    "ReLU", "FloorDiv", "RealDiv", "AddScalar", "SubScalar", "Sigmoid", "Silu",
                    "Cos", "Sin", "Log", "Neg", "Exp", "NotEqual", "Cast", "Contiguous",
                    "Square", "ToDtype", "Tile", "OnesLikeExt", "dropout",
                ],
                *EW,
            ),
            (
                "CellBackwardHook",
                "parallel_tuple_elementwise",
                "TupleElementWiseDistributedOp",
                {"infer_layout_suffix": "WithTupleExpand"},
            ),
        ],
    ),
    "element_wise_ops_with_shape.yaml": (
        EW,
        [
            *_many(
                ["LessEqual", "GreaterEqual", "ne", "LogicalOr", "Minimum", "Mod", "remainder", "Div"],
                *EW,
                infer_layout_suffix="WithShape",
            ),
            *_many(["AddExt", "Add", "Sub", "SubExt"], "parallel_elementwise", "AddDistributedOp"),
            ("Mul", "parallel_elementwise", "ElementWiseWithPartialDistributedOp", {}),
        ],
    ),
    "torch_element_wise.yaml": (
        EW,
        [
            *_many(
                [
                    "relu", "clamp", "clamp_max", "clamp_min", "__invert__", "gelu", "abs",
                    "long", "int", "float", "rsqrt", "sigmoid", "silu", "softplus", "cos", "sin",
                    "log", "neg", "exp", "cast", "contiguous", "square", "zeros_like",
                    "empty_like",
                ],
                *EW,
            ),
            ("__rsub__", "parallel_elementwise", "SubDistributedOp", {}),
            ("clone", "parallel_elementwise", "ElementWiseWithPartialDistributedOp", {}),
        ],
    ),
    "torch_element_wise_with_shape.yaml": (
        EW,
        [
            *_many(["add", "add_"], "parallel_elementwise", "AddDistributedOp"),
            *_many(
                [
                    "sub", "sub_", "__and__", "__eq__", "__floordiv__", "__or__", "ge", "gt", "le",
                    "lt", "pow", "masked_fill", "masked_fill_", "div", "floor_div", "real_div",
                    "not_equal",
                ],
                *EW,
            ),
            ("mul", "parallel_elementwise", "ElementWiseWithPartialDistributedOp", {}),
        ],
    ),
    "torch_element_wise_ops.yaml": (None, [("dropout", *EW, {})]),
    "torch_element_wise_ops_with_shape.yaml": (
        EW,
        [
            *_many(["ne", "remainder", "div_", "isnan", "isinf"], *EW),
            ("mul_", "parallel_elementwise", "ElementWiseWithPartialDistributedOp", {}),
        ],
    ),
    "reduce_ops.yaml": (
        None,
        [
            ("SumExt", "parallel_reduce", "SumExtDistributedOp", {}),
            ("MeanExt", "parallel_reduce", "MeanExtDistributedOp", {}),
            ("ReduceMax", "parallel_reduce", "ReduceMaxDistributedOp", {}),
        ],
    ),
    "torch_reduce.yaml": (
        None,
        [
            ("sum", "parallel_reduce", "SumExtDistributedOp", {}),
            ("mean", "parallel_reduce", "MeanExtDistributedOp", {}),
        ],
    ),
    "matmul_ops.yaml": (
        None,
        [
            ("MatMulExt", "parallel_matmul", "MatMulExtDistributedOp", {}),
            ("MatMul", "parallel_matmul", "MatMulDistributedOp", {}),
            ("BatchMatMulExt", "parallel_matmul", "BatchMatMulExtDistributedOp", {}),
            ("BatchMatMul", "parallel_matmul", "BatchMatMulDistributedOp", {}),
            ("Dense", "parallel_matmul", "LinearDistributedOp", {}),
        ],
    ),
    "reshape_ops.yaml": (
        None,
        _many(
            ["Reshape", "reshape", "view"],
            "parallel_reshape",
            "ReshapeDistributedOp",
            template_name="without_parse",
            infer_layout_suffix="Reshape",
        ),
    ),
    "torch_reshape_ops.yaml": (
        None,
        _many(["reshape", "view"], "parallel_reshape", "ReshapeDistributedOp", template_name="without_parse"),
    ),
    "transpose_ops.yaml": (
        None,
        _many(["Transpose", "permute", "transpose"], "parallel_transpose", "TransposeDistributedOp"),
    ),
    "torch_transpose_ops.yaml": (
        None,
        _many(["permute", "transpose"], "parallel_transpose", "TransposeDistributedOp"),
    ),
    "gather_ops.yaml": (
        None,
        [
            *_many(["IndexSelect", "index_select"], "parallel_gather", "IndexSelectDistributedOp"),
            ("GatherD", "parallel_gather", "GatherDDistributedOp", {}),
            ("GatherNd", "parallel_gather", "GatherNdDistributedOp", {"infer_layout_suffix": "WithShape"}),
        ],
    ),
    "torch_gather.yaml": (None, [("gather", "parallel_gather", "GatherDDistributedOp", {})]),
    "torch_index_select_ops.yaml": (
        None,
        [("index_select", "parallel_gather", "IndexSelectDistributedOp", {})],
    ),
    "split_ops.yaml": (
        None,
        [
            ("Split", "parallel_split", "SplitDistributedOp", {"infer_layout_suffix": "WithShape"}),
            ("SplitTensor", "parallel_split", "SplitTensorDistributedOp", {"infer_layout_suffix": "WithShape"}),
            ("SplitWithSize", "parallel_split", "SplitWithSizeDistributedOp", {}),
            ("SplitTensorView", "parallel_split", "SplitTensorViewDistributedOp", {"infer_layout_suffix": "WithShape"}),
            ("SplitWithSizeView", "parallel_split", "SplitWithSizeViewDistributedOp", {}),
            ("split", "parallel_split", "SplitDistributedOp", {"infer_layout_suffix": "WithShape"}),
        ],
    ),
    "torch_split_ops.yaml": (
        None,
        [
            ("split", "parallel_split", "SplitDistributedOp", {}),
            ("tensor_split", "parallel_split", "TensorSplitDistributedOp", {}),
        ],
    ),
    "chunk_view_ops.yaml": (None, [("ChunkView", "parallel_chunk_view", "ChunkViewDistributedOp", {})]),
    "unbind_ops.yaml": (None, [("unbind", "parallel_unbind", "UnbindDistributedOp", {})]),
    "concat_ops.yaml": (
        None,
        _many(["Concat", "cat"], "parallel_concat", "ConcatDistributedOp", infer_layout_suffix="WithTupleExpand"),
    ),
    "torch_concat_ops.yaml": (None, _many(["cat", "concat"], "parallel_concat", "ConcatDistributedOp")),
    "torch_stack.yaml": (
        None,
        [("stack", "parallel_stack", "StackDistributedOp", {"infer_layout_suffix": "WithTupleExpand"})],
    ),
    "torch_vstack.yaml": (None, [("vstack", "parallel_vstack", "VstackDistributedOp", {})]),
    "squeeze.yaml": (
        None,
        _many(["squeeze", "Squeeze"], "parallel_squeeze", "SqueezeDistributedOp", infer_layout_suffix="WithShape"),
    ),
    "torch_squeeze.yaml": (
        None,
        [("squeeze", "parallel_squeeze", "SqueezeDistributedOp", {"infer_layout_suffix": "WithShape"})],
    ),
    "expand_dims_ops.yaml": (
        None,
        _many(["ExpandDims", "ExpandDimsView"], "parallel_expand_dims", "ExpandDimsDistributedOp"),
    ),
    "torch_unsqueeze.yaml": (None, [("unsqueeze", "parallel_expand_dims", "ExpandDimsDistributedOp", {})]),
    "torch_expand.yaml": (
        None,
        [
            ("expand", "parallel_expand", "ExpandDistributedOp", {}),
            ("expand_as", "parallel_expand", "ExpandAsDistributedOp", {"infer_layout_suffix": "WithShape"}),
        ],
    ),
    "torch_flatten.yaml": (None, [("flatten", "parallel_flatten", "FlattenDistributedOp", {})]),
    "torch_atleast_1d.yaml": (None, [("atleast_1d", "parallel_atleast_1d", "Atleast1DDistributedOp", {})]),
    "torch_repeat.yaml": (None, [("repeat", "parallel_repeat", "RepeatDistributedOp", {})]),
    "torch_repeat_interleave.yaml": (
        None,
        [("repeat_interleave", "parallel_repeat_interleave", "RepeatInterleaveDistributedOp", {})],
    ),
    "torch_pad.yaml": (None, [("pad", "parallel_pad", "PadDistributedOp", {})]),
    "tril_ops.yaml": (None, _many(["TrilExt", "tril"], "parallel_tril", "TrilDistributedOp")),
    "torch_getitem_ops.yaml": (None, [("__getitem__", "parallel_getitem", "GetItemDistributedOp", {})]),
    "torch_setitem_ops.yaml": (None, [("__setitem__", "parallel_setitem", "SetItemDistributedOp", {})]),
    "slice_ops.yaml": (
        None,
        [("Slice", "parallel_slice", "SliceDistributedOp", {"template_name": "without_parse"})],
    ),
    "torch_scatter.yaml": (None, [("scatter", "parallel_scatter", "ScatterDistributedOp", {})]),
    "scatter_update_ops.yaml": (
        None,
        [("ScatterUpdate", "parallel_scatter_update", "ScatterUpdateDistributedOp", {})],
    ),
    "inplace_scatter_value_ops.yaml": (
        None,
        [
            (
                "InplaceScatterValue",
                "parallel_inplace_scatter_value",
                "InplaceScatterValueDistributedOp",
                {},
            )
        ],
    ),
    "torch_index_add.yaml": (
        None,
        _many(["index_add", "index_add_"], "parallel_index_add", "IndexAddDistributedOp"),
    ),
    "torch_masked_scatter.yaml": (
        None,
        [("masked_scatter", "parallel_masked_scatter", "MaskedScatterDistributedOp", {})],
    ),
    "torch_nonzero.yaml": (None, [("nonzero", "parallel_nonzero", "NonzeroDistributedOp", {})]),
    "torch_isin.yaml": (None, [("isin", "parallel_isin", "IsinDistributedOp", {})]),
    "one_hot_ext_ops.yaml": (None, [("OneHotExt", "parallel_one_hot_ext", "OneHotExtDistributedOp", {})]),
    "cumsum_ops.yaml": (None, [("CumsumExt", "parallel_cumsum", "CumsumDistributedOp", {})]),
    "torch_cumsum.yaml": (None, [("cumsum", "parallel_cumsum", "CumsumDistributedOp", {})]),
    "topk_ops.yaml": (None, _many(["TopkExt", "topk"], "parallel_topk", "TopKDistributedOp")),
    "torch_topk_ops.yaml": (None, [("topk", "parallel_topk", "TopKDistributedOp", {})]),
    "sort_ops.yaml": (None, [("sort", "parallel_sort", "SortDistributedOp", {})]),
    "argsort.yaml": (None, [("ArgSort", "parallel_argsort", "ArgsortDistributedOp", {})]),
    "torch_argsort.yaml": (None, [("argsort", "parallel_argsort", "ArgsortDistributedOp", {})]),
    "histc_ext.yaml": (None, _many(["HistcExt", "histc"], "parallel_histc_ext", "HistcExtDistributedOp")),
    "torch_histc_ext.yaml": (None, [("histc", "parallel_histc_ext", "HistcExtDistributedOp", {})]),
    "norm_ops.yaml": (
        None,
        [
            ("RmsNorm", "parallel_norm", "NormDistributedOp", {}),
            ("layer_norm", "parallel_norm", "LayerNormDistributedOp", {}),
        ],
    ),
    "torch_norm_ops.yaml": (
        None,
        [
            ("npu_rms_norm", "parallel_norm", "NormDistributedOp", {}),
            ("layer_norm", "parallel_norm", "LayerNormDistributedOp", {}),
        ],
    ),
    "activation_with_axis_ops.yaml": (
        None,
        _many(
            ["Softmax", "Swiglu", "softmax"],
            "parallel_activation_with_axis",
            "ActivationWithAxisDistributedOp",
        ),
    ),
    "torch_activation_with_axis_ops.yaml": (
        None,
        [("softmax", "parallel_activation_with_axis", "ActivationWithAxisDistributedOp", {})],
    ),
    "embedding_ops.yaml": (
        None,
        _many(["Embedding", "embedding"], "parallel_embedding", "EmbeddingDistributedOp"),
    ),
    "torch_embedding_ops.yaml": (
        None,
        [("embedding", "parallel_embedding", "EmbeddingDistributedOp", {})],
    ),
    "torch_outer.yaml": (None, [("outer", "parallel_outer", "OuterDistributedOp", {})]),
    "torch_new_ones_ops.yaml": (None, [("new_ones", "parallel_new_ones", "NewOnesDistributedOp", {})]),
    "torch_scaled_dot_product_attention.yaml": (
        None,
        [
            (
                "scaled_dot_product_attention",
                "parallel_scaled_dot_product_attention",
                "ScaledDotProductAttentionDistributedOp",
                {},
            )
        ],
    ),
    "flash_attention_score.yaml": (
        None,
        [
            (
                "FlashAttentionScore",
                "parallel_ms_flash_attention_score",
                "FlashAttentionScoreDistributedOp",
                {},
            )
        ],
    ),
    "torch_flash_attention_score.yaml": (
        None,
        [
            (
                "npu_fusion_attention",
                "parallel_npu_flash_attention_score",
                "NPUFlashAttentionScoreDistributedOp",
                {},
            )
        ],
    ),
    "npu_sparse_flash_attention_ops.yaml": (
        None,
        _many(
            ["npu_sparse_flash_attention", "SparseFlashAttention"],
            "parallel_npu_sparse_flash_attention",
            "SparseFlashAttentionDistributedOp",
        ),
    ),
    "paged_attention_ops.yaml": (
        None,
        _many(
            [
                "PagedAttention", "paged_attention", "ms_custom_ops.PagedAttention",
                "ms_custom_ops.paged_attention", "ms_custom_ops.gen_ops_def.paged_attention",
                "ms_custom_ops.gen_ops_def.PagedAttention",
            ],
            "parallel_paged_attention",
            "PagedAttentionDistributedOp",
        ),
    ),
    "rotary_position_embedding_ops.yaml": (
        None,
        [
            (
                "RotaryPositionEmbedding",
                "parallel_rotary_position_embedding",
                "RotaryPositionEmbeddingDistributedOp",
                {},
            )
        ],
    ),
    "torch_rotary_position_embedding_ops.yaml": (
        None,
        [
            (
                "npu_rotary_mul",
                "parallel_rotary_position_embedding",
                "RotaryPositionEmbeddingDistributedOp",
                {},
            )
        ],
    ),
    "multinomial_ops.yaml": (None, [("multinomial", "parallel_multinomial", "MultinomialDistributedOp", {})]),
    "all_gather_matmul_ops.yaml": (
        None,
        [("AllGatherMatmul", "parallel_all_gather_matmul", "AllGatherMatmulDistributedOp", {})],
    ),
    "matmul_reduce_scatter_ops.yaml": (
        None,
        [
            (
                "MatmulReduceScatter",
                "parallel_matmul_reduce_scatter",
                "MatmulReduceScatterDistributedOp",
                {},
            )
        ],
    ),
    "torch_conv1d.yaml": (None, [("conv1d", "parallel_conv1d", "Conv1dDistributedOp", {})]),
    "torch_conv3d.yaml": (None, [("conv3d", "parallel_conv3d", "Conv3dDistributedOp", {})]),
    "lightning_indexer_ops.yaml": (
        None,
        [("LightningIndexer", "parallel_lightning_indexer", "LightningIndexerDistributedOp", {})],
    ),
    "npu_mhc_head_ops.yaml": (None, [("npu_mhc_head", "parallel_mhc_head", "NpuMhcHeadDistributedOp", {})]),
    "npu_mhc_post_ops.yaml": (None, [("npu_mhc_post", "parallel_mhc_post", "NpuMhcPostDistributedOp", {})]),
    "npu_mhc_pre_cmhc_ops.yaml": (
        None,
        [("npu_mhc_pre_cmhc", "parallel_mhc_pre_cmhc", "NpuMhcPreCmhcDistributedOp", {})],
    ),
    "npu_mhc_pre_sinkhorn_ops.yaml": (
        None,
        [("npu_mhc_pre_sinkhorn", "parallel_mhc_pre_sinkhorn", "NpuMhcPreSinkhornDistributedOp", {})],
    ),
    "npu_situ_glu_ops.yaml": (None, [("npu_situ_glu", "parallel_situ_glu", "NpuSituGluDistributedOp", {})]),
    "npu_sparse_lightning_indexer_grad_kl_loss_ops.yaml": (
        None,
        [
            (
                "npu_sparse_lightning_indexer_grad_kl_loss",
                "parallel_npu_sparse_lightning_indexer_grad_kl_loss",
                "NpuSparseLightningIndexerGradKlLossDistributedOp",
                {},
            )
        ],
    ),
    "npu_dense_lightning_indexer_grad_kl_loss_ops.yaml": (
        None,
        [
            (
                "npu_dense_lightning_indexer_grad_kl_loss",
                "parallel_npu_dense_lightning_indexer_grad_kl_loss",
                "NpuDenseLightningIndexerGradKlLossDistributedOp",
                {},
            )
        ],
    ),
    "npu_dense_lightning_indexer_softmax_lse_ops.yaml": (
        None,
        [
            (
                "npu_dense_lightning_indexer_softmax_lse",
                "parallel_npu_dense_lightning_indexer_softmax_lse",
                "NpuDenseLightningIndexerSoftmaxLseDistributedOp",
                {},
            )
        ],
    ),
    # -- older versions whose pairs or names differ from the files above
    "reduce_ops.v2.yaml": (
        None,
        [
            ("SumExt", "parallel_reduce", "SumExtDistributedOp", {}),
            ("MeanExt", "parallel_reduce", "MeanExtDistributedOp", {}),
            ("ReduceMax", "parallel_reduce", "ReduceMaxDistributedOp", {}),
            ("max", "parallel_reduce", "MaxDistributedOp", {}),
        ],
    ),
    "gather_ops.v1.yaml": (
        None,
        [
            ("IndexSelect", "parallel_gather", "IndexSelectDistributedOp", {}),
            ("GatherD", "parallel_gather", "GatherDistributedOp", {}),
            ("GatherNd", "parallel_gather", "GatherNdDistributedOp", {"infer_layout_suffix": "WithShape"}),
        ],
    ),
    "torch_flash_attention_score.v1.yaml": (
        None,
        [
            (
                "npu_fusion_attention",
                "parallel_npu_flash_attention_score",
                "FlashAttentionScoreDistributedOp",
                {},
            )
        ],
    ),
    "transpose_ops.v1.yaml": (
        None,
        _many(
            ["Transpose", "TransposeExtView", "permute", "transpose"],
            "parallel_transpose",
            "TransposeDistributedOp",
        ),
    ),
    "rotary_position_embedding_ops.v2.yaml": (
        None,
        _many(
            ["RotaryPositionEmbedding", "npu_rotary_mul"],
            "parallel_rotary_position_embedding",
            "RotaryPositionEmbeddingDistributedOp",
        ),
    ),
    "unbind_ops.v1.yaml": (
        None,
        [("unbind", "parallel_unbind", "UnbindDistributedOp", {"infer_layout_suffix": "WithShape"})],
    ),
    "element_wise_ops.v1.yaml": (  # the first directory (dist_parallel/.../yaml): no default
        None,
        _many(["AddExt", "Add", "SubExt", "Sub", "Mul", "Div", "ReLU", "Tile"], *EW),
    ),
    # -- classes of hyper-parallel's parallel_* modules, under the op names they register
    "module_classes.yaml": (
        None,
        [
            ("ArgMaxWithValue", "parallel_argmax_with_value_ops", "ArgMaxWithValueDistributedOp", {}),
            ("SliceExt", "parallel_slice_ext", "SliceExtDistributedOp", {}),
            ("prod", "parallel_reduce", "ProdExtDistributedOp", {}),
            ("ProdExt", "parallel_reduce", "ProdExtDistributedOp", {}),
            ("all", "parallel_reduce", "AllExtDistributedOp", {}),
            ("min", "parallel_reduce", "MinDistributedOp", {}),
            ("Swiglu", "parallel_swiglu", "SwiGLUDistributedOp", {}),
            ("CellBackwardHook", "parallel_cell_backward_hook", "CellBackwardHookDistributedOp", {}),
            ("LessEqual", "parallel_elementwise", "LessEqualDistributedOp", {}),
        ],
    ),
}  # fmt: skip


def triples() -> list[tuple[str, str, str]]:
    """Every (op name, distributed_op_file, distributed_op_class) of the fixture."""
    return [(n, f, c) for _, entries in FILES.values() for n, f, c, _ in entries]


def write_dir(path: Any) -> None:
    """Write the fixture as hyper-parallel's YAML directory (``__default__`` blocks where
    its files have them; entries then omit the default file/class, as hyper-parallel's
    do)."""
    import yaml

    path.mkdir(parents=True, exist_ok=True)
    for fname, (default, entries) in FILES.items():
        doc: dict[str, Any] = {}
        if default is not None:
            doc["__default__"] = {
                "distributed_op_class": default[1],
                "distributed_op_file": default[0],
            }
        for name, file, cls, extra in entries:
            body: dict[str, Any] = {"dist_op_name": f"_{name.lower().strip('_')}_dist_op"}
            if default is None or (file, cls) != default:
                body["distributed_op_class"] = cls
                body["distributed_op_file"] = file
            body.update(extra)
            doc[name] = body
        (path / fname).write_text(yaml.safe_dump(doc, sort_keys=False))
