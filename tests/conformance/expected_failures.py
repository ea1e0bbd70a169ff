"""The conformance suite's expected failures: OpInfo entry -> the cases known to fail, why.

Each :class:`XFail` matches *failing* cases of its entry by regular expressions on the
case's fields (all given ones must match: ``re.search``). Strict both ways: a failing case
that no rule matches fails the test, and so does a rule that matched no failing case in
the run (the bug was fixed or the support added: delete the rule).

Placement strings (``combo``) list each tensor argument's placements in argument order,
``;``-separated, e.g. ``P; S(0)`` = input Partial(sum), other Shard(0).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class XFail:
    reason: str
    msg: str | None = None
    combo: str | None = None
    variant: str | None = None
    sample: str | None = None


_SCATTER_INPLACE = XFail(
    "not supported (tensor_ops `scatter`/`scatter_add`): the in-place form on a Shard target "
    "raises a clear ShardingError ('redistribute it first'): the rows it writes depend on the "
    "index values and the index/src are not aligned with the target's shards",
    msg=r"ShardingError: .*no sharding of the inputs fits Tensor\.scatter",
    variant=r"^Tensor\.scatter(_add)?_$",
)

_INDEX_INPLACE = XFail(
    "not supported, as scatter_: the in-place form on a target sharded on the indexed dim "
    "raises a clear ShardingError ('redistribute it first'): the rows it writes depend on the "
    "index values, and the index and source are not aligned with the target's shards",
    msg=r"ShardingError: .*no sharding of the inputs fits Tensor\.(index_\w+|scatter_reduce)_ ",
    variant=r"^Tensor\.(index_\w+|scatter_reduce)_$",
)

_RUNNING_STATS = XFail(
    "by design: running_mean/running_var are updated in place where they are (a moved copy's "
    "update would be lost), so they must share one placement (Replicate, or Shard(0) with the "
    "channels) and may not be Partial (the parts' update is not the update of their sum); "
    "other layouts raise a ShardingError naming the fix",
    msg=r"ShardingError: .*(running_mean and running_var are updated in place|a Partial "
    r"running_(mean|var) cannot be updated)",
)

_EMPTY_CHANNEL = XFail(
    "by design: running statistics Shard(0) of one channel over 2 ranks leave a rank an empty "
    "channel shard, which torch's batch-norm kernel rejects, and the statistics are updated in "
    "place where they are (they may not move): a ShardingError naming the fix (redistribute "
    "them first)",
    msg=r"ShardingError: .*running_mean=DTensor\[1\]\[S\(0\)\].*no sharding of the inputs fits",
)

XFAILS: dict[str, list[XFail]] = {
    "nn.functional.batch_norm": [_RUNNING_STATS],
    "nn.functional.instance_norm": [_RUNNING_STATS],
    "native_batch_norm": [_RUNNING_STATS, _EMPTY_CHANNEL],
    "_batch_norm_with_update": [_RUNNING_STATS, _EMPTY_CHANNEL],
    "_native_batch_norm_legit": [_RUNNING_STATS, _EMPTY_CHANNEL],
    **{
        k: [_INDEX_INPLACE]
        for k in (
            "index_add",
            "index_copy",
            "index_fill",
            "index_reduce.mean",
            "index_reduce.prod",
            "index_reduce.amax",
            "index_reduce.amin",
            "scatter_reduce.sum",
            "scatter_reduce.prod",
            "scatter_reduce.mean",
            "scatter_reduce.amax",
            "scatter_reduce.amin",
        )
    },  # fmt: skip
    "scatter": [_SCATTER_INPLACE],
    "scatter_add": [_SCATTER_INPLACE],
    "addbmm": [
        XFail(
            "by design: torch's Tensor.addbmm_ resizes a broadcastable self of shape (1,) or () "
            "to the (m, n) result (a quirk of its kernel; addmv_ and addr_ refuse the same "
            "call); a DTensor's in-place op keeps its target's shape and raises a ShardingError "
            "naming the out-of-place op",
            msg=r"ShardingError: .*in-place",
            variant=r"^Tensor\.addbmm_$",
            sample=r"^T\[1?\],",
        )
    ],
    "nn.functional.gaussian_nll_loss": [
        XFail(
            "by design (rule: composite): the loss clamps var in place (var.clone().clamp_(min="
            "eps) under no_grad); on a Partial var that in-place clamp is refused (a clamp of "
            "the parts is not the clamp of their sum) with a ShardingError naming the fix "
            "(redistribute var to Replicate first)",
            msg=r"ShardingError: Tensor\.clamp_\(.*in-place",
            combo=r"^[^;]*;[^;]*; [^;]*P",
        )
    ],
    "renorm": [
        XFail(
            "not supported, as PyTorch DTensor: Tensor.renorm_ on a target sharded on a dim the "
            "norm runs over (or Partial) would have to move the target; it raises a "
            "ShardingError naming the fix (redistribute it first, or the out-of-place op)",
            msg=r"ShardingError: .*no sharding of the inputs fits Tensor\.renorm_",
            variant=r"^Tensor\.renorm_$",
        )
    ],
}
