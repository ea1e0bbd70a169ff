"""Random ops: dropout, ``rand_like``/``randn_like``/``randint_like``, ``bernoulli``, and
the in-place fills ``nn.init`` uses (``Tensor.uniform_``/``normal_``..., ``nn.init.*``).

A random op on a DTensor equals the single-device op for the same generator state: the
local kernel draws the GLOBAL tensor (same function, shape and dtype) inside
:mod:`hyper_shard.random`'s tracker and keeps this rank's box, so the generator also
advances exactly as on one device. Cost: each rank does the global draw (see
:mod:`hyper_shard.random`); no communication except gathering a sharded probability
tensor (``bernoulli(p)``).

YAML parameter ``mode``:

* ``like`` — the output takes the input's shape only (``rand_like``, ``bernoulli(x, p)``
  with a python ``p``): output placements are the input's, ``Partial`` read as Replicate;
* ``inplace`` — fill the input in place (``Tensor.uniform_``, ``nn.init.normal_``...):
  placements kept; a ``Partial`` input is refused (redistribute it first);
  ``no_grad: true`` runs the copy outside autograd as ``nn.init`` does;
* ``dropout`` — ``input * mask / (1 - p)``: placements kept, ``Partial(sum|avg|max|min)``
  included (the mask is the same on every rank of a partial mesh dim and non-negative);
* ``bernoulli`` — ``bernoulli(input)`` draws with the input's values as probabilities
  (the input is gathered, the output keeps its placements); with a python ``p`` it is
  ``like``, in place ``inplace``, and a DTensor ``p`` is gathered.
* ``multinomial`` — ``multinomial(input, num_samples)``: ``(*batch, categories)``
  probabilities give ``(*batch, num_samples)`` indices. The input is gathered (each rank
  draws the single-device result), the output keeps the input's batch shards (PyTorch
  DTensor's placements); a sharded category dim, or a 1-D input, gives ``Replicate``.

A fully Replicate (or Partial-only) input needs no kernel: every rank runs the plain op
on identical generator states. The kernels (:mod:`hyper_shard.kernels.random`) are
framework-neutral.

Semantics follow the functions named in ``op_specs/random.yaml``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from ..dispatch.op import DistributedOp, Layout, OpCall
from ..errors import ShardingError
from ..kernels.random import GlobalDraw, ShardedDropout
from ..placement import Partial, Placement, Replicate, Shard
from ..registry.models import RuleParams
from ..spec import DTensorSpec, TensorMeta, contiguous_stride
from . import register_rule

if TYPE_CHECKING:
    from ..mesh import DeviceMesh

__all__ = ["RandomOp", "RandomParams"]

_R = Replicate()
_MASK_SAFE = ("sum", "avg", "max", "min")


class RandomParams(RuleParams):
    mode: Literal["like", "inplace", "dropout", "bernoulli", "multinomial"]
    #: run an in-place fill's copy under no_grad (nn.init functions)
    no_grad: bool = False


@register_rule("random")
class RandomOp(DistributedOp):
    """A random op on one DTensor (see the module docstring). The output has the input's
    global shape.

    Raises:
        ShardingError: a DTensor argument other than the input (and ``p`` of
            ``bernoulli``), or an in-place fill of a ``Partial`` DTensor.
    """

    keeps_shard_order = True  # local data only: shard orders pass (dispatch/order.py)

    Params = RandomParams
    signature = ("input", "*args")

    def infer_layout(self, call: OpCall) -> Layout:
        mode = self.params.mode
        roles = call.arg_roles
        self_role = roles[0]
        for r in roles[1:]:
            if not (mode == "bernoulli" and r == "p"):
                raise ShardingError(
                    f"{call.describe()}: unexpected DTensor argument {r!r}; only the tensor the "
                    f"draw is shaped by may be a DTensor"
                )
        spec = call.specs[0]
        mesh = call.mesh
        n = mesh.ndim
        if mode == "multinomial":
            return self._multinomial(call, spec)
        inputs: list[tuple[Placement, ...] | None] = [None] * len(call.specs)
        values = False
        if mode == "bernoulli":
            if call.inplace:
                mode = "inplace"
            elif "p" in roles or "p" in call.scalars:
                mode = "like"
            else:
                mode, values = "like", True
            if "p" in roles:
                inputs[roles.index("p")] = (_R,) * n
        if mode == "inplace" and spec.has_partial():
            raise ShardingError(
                f"{call.describe()}: an in-place random fill of a Partial DTensor has no "
                f"single-device meaning per rank; redistribute it to Replicate() (or a Shard) "
                f"first"
            )
        if mode == "dropout":
            out = tuple(
                _R if type(p) is Partial and p.reduce_op not in _MASK_SAFE else p
                for p in spec.placements
            )
            if out != spec.placements:
                inputs[0] = out
        else:
            out = tuple(_R if type(p) is Partial else p for p in spec.placements)
        if values:
            inputs[0] = (_R,) * n
        layout = Layout(inputs, [out], [spec.shape])
        coord = mesh.get_coordinate()
        if coord is None or not (
            any(type(p) is Shard for p in out) or _threads(mesh)  # threads share a generator
        ):
            return layout
        # the output's shard order is the input's where its shards stay (dispatch/order.py);
        # gathered probabilities (values) give a left-to-right output
        ls, off = spec.with_placements(out, None if values else "keep").local_shape_and_offset(
            coord
        )
        box = (off, ls)
        binder = call.binder or self.binder
        plat = call.platform
        if mode == "dropout":
            layout.impl = ShardedDropout(
                call.func, binder, plat, spec.shape, box, call.inplace, mesh
            )
        else:
            layout.impl = GlobalDraw(
                call.func,
                binder,
                self_role,
                plat,
                spec.shape,
                box,
                inplace=mode == "inplace",
                no_grad=self.params.no_grad,
                from_values=values,
                mesh=mesh,
            )
        return layout

    def _multinomial(self, call: OpCall, spec: DTensorSpec) -> Layout:
        """``multinomial``: gather the probabilities, keep the batch shards (see the module
        docstring)."""
        k = call.scalars.get("num_samples")
        if not isinstance(k, int) or isinstance(k, bool):
            raise ShardingError(f"{call.describe()}: num_samples must be a python int, got {k!r}")
        nd = spec.ndim
        shape = (*spec.shape[:-1], k)
        out = tuple(p if type(p) is Shard and p.dim < nd - 1 else _R for p in spec.placements)
        mesh = call.mesh
        layout = Layout([(_R,) * mesh.ndim], [out], [shape])
        coord = mesh.get_coordinate()
        if coord is None or not (any(type(p) is Shard for p in out) or _threads(mesh)):
            return layout
        meta = TensorMeta(shape, contiguous_stride(shape), spec.dtype, spec.tensor_meta.itemsize)
        ls, off = DTensorSpec(mesh, out, meta).local_shape_and_offset(coord)
        layout.impl = GlobalDraw(
            call.func,
            call.binder or self.binder,
            call.arg_roles[0],
            call.platform,
            shape,
            (off, ls),
            inplace=False,
            from_values=True,
            mesh=mesh,
        )
        return layout


def _threads(mesh: DeviceMesh) -> bool:
    """The mesh's ranks are threads of this process sharing one generator: even an
    unsharded draw runs in the tracker, once for them all (:mod:`hyper_shard.random`)."""
    return not mesh.is_abstract and mesh.platform.ranks_are_threads()
