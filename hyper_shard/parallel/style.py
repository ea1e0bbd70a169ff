"""Tensor-parallel styles (as ``torch.distributed.tensor.parallel``), framework-neutral.

A style is data — which parameter of which module kind gets which placement, and the
layouts of the module's inputs and outputs — plus the neutral conversions a forward hook
runs (``from_local`` / ``redistribute`` / ``to_local``). The framework's module system
(parameters, hooks, ``nn.Linear``/``nn.Embedding`` detection) is reached through
:mod:`hyper_shard.parallel._adapter`, so the same classes serve torch and MindSpore.

Every style takes the keyword arguments of its PyTorch namesake and behaves the same; one
difference: an input that is already a DTensor is redistributed whenever its placements
differ from the desired ones (PyTorch compares the *declared* input layout instead).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from ..dtensor import DTensor, distribute_tensor
from ..mesh import DeviceMesh
from ..placement import Placement, Replicate, Shard
from ._adapter import adapter_for
from ._convert import from_local_even, full_tensor, redistribute, to_local
from .distribute import distribute_module

__all__ = [
    "LayoutLengthError",
    "ParallelStyle",
    "ColwiseParallel",
    "RowwiseParallel",
    "SequenceParallel",
    "PrepareModuleInput",
    "PrepareModuleOutput",
    "PrepareModuleInputOutput",
]


class LayoutLengthError(ValueError, AssertionError):
    """Layout tuples of a style that do not pair up (a ``ValueError``, and an
    ``AssertionError`` as PyTorch raises for the same mistake, so either ``except`` works)."""


class ParallelStyle:
    """Base class of the styles: ``_apply(module, device_mesh)`` parallelizes ``module`` in
    place and returns it (as PyTorch's ``ParallelStyle``). ``src_data_rank`` is the rank
    whose parameter values every rank takes (None: keep each rank's own)."""

    src_data_rank: int | None = 0

    def _apply(self, module: Any, device_mesh: DeviceMesh) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement _apply")


def _check_mesh(style: ParallelStyle, mesh: DeviceMesh) -> None:
    if mesh.ndim != 1:
        raise ValueError(
            f"{type(style).__name__}: tensor parallelism takes a 1-D DeviceMesh, got shape "
            f"{mesh.shape}; slice it first, e.g. mesh['tp']"
        )


def _as_dtensor(x: Any, mesh: DeviceMesh, layout: Placement, what: Any) -> Any:
    if isinstance(x, DTensor):
        return x
    if not mesh.platform.is_tensor(x):
        raise TypeError(f"{what()}: expected a tensor or DTensor, got {type(x).__name__}")
    return from_local_even(x, mesh, (layout,))


def _convert(
    x: Any,
    mesh: DeviceMesh,
    layout: Placement,
    desired: Placement | None,
    use_local: bool,
    what: Any,
) -> Any:
    """Wrap ``x`` as a DTensor with ``layout`` (if plain), move it to ``desired``, and
    return it (or its local tensor)."""
    try:
        dt = _as_dtensor(x, mesh, layout, what)
    except IndexError as e:  # a layout's dim out of range for this input: name the module
        raise IndexError(f"{what()} (shape {tuple(x.shape)}): {e}") from e
    if desired is not None:
        if use_local and type(desired) is Replicate:
            return full_tensor(dt)
        dt = redistribute(dt, (desired,))
    return to_local(dt) if use_local else dt


def _partition(
    style: ParallelStyle,
    placements: Mapping[str, Mapping[str, Placement]],
    kind: str,
    name: str,
    module: Any,
    mesh: DeviceMesh,
) -> None:
    """Distribute the parameters of ``module`` (the style's own module only) by role."""
    if name != "":
        return
    ad = adapter_for(module)
    for role, attr in ad.param_roles(module, kind).items():
        pl = placements[kind].get(role)
        if pl is None:
            continue
        p = getattr(module, attr)
        dt = distribute_tensor(
            mesh.platform.detach(p), mesh, [pl], src_data_rank=style.src_data_rank
        )
        ad.set_param(module, attr, dt, ad.requires_grad(p))
        if type(pl) is Replicate:  # PyTorch's Replicate .grad (platform/torch/grad_sync.py)
            ad.whole_replicate_grad(getattr(module, attr))


def _module_kind(style: ParallelStyle, module: Any, allowed: tuple[str, ...]) -> str:
    kind = adapter_for(module).module_kind(module)
    if kind not in allowed:
        raise NotImplementedError(
            f"{type(style).__name__} currently only supports nn.Linear and nn.Embedding; got "
            f"{type(module).__name__}. Use PrepareModuleInput/PrepareModuleOutput for other "
            f"modules, or parallelize its Linear/Embedding children"
        )
    return kind


def _output_fn(
    style: Any,
    layouts: tuple[Placement, ...],
    use_local: bool,
    mod: Any,
    out: Any,
    mesh: DeviceMesh,
) -> Any:
    if not isinstance(out, DTensor):
        raise TypeError(
            f"{type(style).__name__}: the output of {type(mod).__name__} should be a DTensor, got "
            f"{type(out).__name__}"
        )
    if use_local and all(type(p) is Replicate for p in layouts):
        return full_tensor(out)
    out = redistribute(out, layouts)
    return to_local(out) if use_local else out


class ColwiseParallel(ParallelStyle):
    """Column-wise partitioning of ``nn.Linear`` (weight ``Shard(0)``, bias ``Shard(0)``) or
    ``nn.Embedding`` (weight ``Shard(1)``), as PyTorch's ``ColwiseParallel``.

    Keyword Args:
        input_layouts: the layout of a plain input tensor (default ``Replicate()``); it is
            wrapped as a DTensor with it, then made ``Replicate()``.
        output_layouts: the output's layout (default ``Shard(-1)``: each rank holds its
            columns of the global ``[..., out_features]`` output).
        use_local_output: return the local tensor (default True) instead of the DTensor.
    """

    _placements: Mapping[str, Mapping[str, Placement]] = {
        "linear": {"weight": Shard(0), "bias": Shard(0)},
        "embedding": {"weight": Shard(1)},
    }
    #: (input, output) layouts when the caller gives none
    _default_layouts: tuple[Placement, Placement] = (Replicate(), Shard(-1))

    def __init__(
        self,
        *,
        input_layouts: Placement | None = None,
        output_layouts: Placement | None = None,
        use_local_output: bool = True,
    ) -> None:
        super().__init__()
        default_in, default_out = self._default_layouts
        self.input_layouts = (input_layouts or default_in,)
        self.output_layouts = (output_layouts or default_out,)
        self.desired_input_layouts: tuple[Placement, ...] = (self._desired_input("linear"),)
        self.use_local_output = use_local_output

    def _prepare_input_fn(
        self, desired: Placement, mod: Any, inputs: tuple, mesh: DeviceMesh
    ) -> Any:
        def what() -> str:
            return f"{type(self).__name__} input of {type(mod).__name__}"

        x = _convert(inputs[0], mesh, self.input_layouts[0], desired, False, what)
        return (x, *inputs[1:])

    def _desired_input(self, kind: str) -> Placement:
        return Replicate()

    def _apply(self, module: Any, device_mesh: DeviceMesh) -> Any:
        _check_mesh(self, device_mesh)
        kind = _module_kind(self, module, ("linear", "embedding"))
        desired = self._desired_input(kind)
        self.desired_input_layouts = (desired,)
        return distribute_module(
            module,
            device_mesh,
            partial(_partition, self, self._placements, kind),
            partial(self._prepare_input_fn, desired),
            partial(_output_fn, self, self.output_layouts, self.use_local_output),
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(input_layouts={self.input_layouts}, output_layouts="
            f"{self.output_layouts}, use_local_output={self.use_local_output})"
        )


class RowwiseParallel(ColwiseParallel):
    """Row-wise partitioning of ``nn.Linear`` (weight ``Shard(1)``, bias ``Replicate()``) or
    ``nn.Embedding`` (weight ``Shard(0)``: vocab-parallel), as PyTorch's ``RowwiseParallel``.

    Keyword Args:
        input_layouts: the layout of a plain input (default ``Shard(-1)`` for a Linear: the
            output of a paired ``ColwiseParallel``); an Embedding's token ids are made
            ``Replicate()``.
        output_layouts: the output's layout (default ``Replicate()``: the partial sums are
            all-reduced; ``Shard(1)`` reduce-scatters them over the sequence).
        use_local_output: return the local tensor (default True) instead of the DTensor.
    """

    _placements: Mapping[str, Mapping[str, Placement]] = {
        "linear": {"weight": Shard(1), "bias": Replicate()},
        "embedding": {"weight": Shard(0)},
    }

    _default_layouts: tuple[Placement, Placement] = (Shard(-1), Replicate())

    def _desired_input(self, kind: str) -> Placement:
        return Shard(-1) if kind == "linear" else Replicate()

    def _prepare_input_fn(
        self, desired: Placement, mod: Any, inputs: tuple, mesh: DeviceMesh
    ) -> Any:
        x, lay = inputs[0], self.input_layouts[0]
        w = getattr(mod, "weight", None)
        if (
            type(desired) is Shard
            and type(lay) is Shard
            and isinstance(w, DTensor)
            and not isinstance(x, DTensor)
            and mesh.platform.is_tensor(x)
        ):
            # a plain input sharded on its features: the Linear's in_features is the true
            # global width, so uneven shards (15 features on 2 ranks: 8 + 7) are read
            # right where PyTorch assumes local width x mesh size and fails
            shape = mesh.platform.shape(x)
            d = lay.dim % len(shape) if shape else 0
            k = w._spec.shape[1]
            if shape and d == len(shape) - 1 and shape[d] * mesh.size() != k:
                try:
                    dt = from_local_even(x, mesh, (lay,), dim_size=(d, k))
                except ValueError as e:
                    raise ValueError(
                        f"{type(self).__name__} input of {type(mod).__name__} "
                        f"(in_features {k}): {e}"
                    ) from e
                return (redistribute(dt, (desired,)), *inputs[1:])
        return super()._prepare_input_fn(desired, mod, inputs, mesh)


class SequenceParallel(ParallelStyle):
    """Sequence parallelism for modules that act on each position independently
    (``nn.LayerNorm``, RMSNorm, ``nn.Dropout``), as PyTorch's ``SequenceParallel``: the
    parameters are replicated (broadcast from ``src_data_rank``), a plain input is read as
    this rank's ``Shard(sequence_dim)`` piece (a DTensor input is redistributed to it), and
    the output stays sharded on the sequence dim.

    Keyword Args:
        sequence_dim: the sequence dimension of the input (default 1).
        use_local_output: return the local tensor instead of the DTensor (default False).
    """

    def __init__(self, *, sequence_dim: int = 1, use_local_output: bool = False) -> None:
        super().__init__()
        self.sequence_sharding = (Shard(sequence_dim),)
        self.use_local_output = use_local_output

    def _replicate_fn(self, name: str, module: Any, mesh: DeviceMesh) -> None:
        ad = adapter_for(module)
        for pname, p in ad.direct_params(module):
            if p is None or isinstance(p, DTensor):
                continue
            dt = distribute_tensor(
                mesh.platform.detach(p), mesh, [Replicate()], src_data_rank=self.src_data_rank
            )
            ad.set_param(module, pname, dt, ad.requires_grad(p))

    def _prepare_input_fn(self, mod: Any, inputs: tuple, mesh: DeviceMesh) -> Any:
        def what() -> str:
            return f"SequenceParallel input of {type(mod).__name__}"

        sd = self.sequence_sharding[0]
        return (_convert(inputs[0], mesh, sd, sd, False, what), *inputs[1:])

    def _prepare_output_fn(self, mod: Any, out: Any, mesh: DeviceMesh) -> Any:
        return to_local(out) if self.use_local_output and isinstance(out, DTensor) else out

    def _apply(self, module: Any, device_mesh: DeviceMesh) -> Any:
        _check_mesh(self, device_mesh)
        return distribute_module(
            module,
            device_mesh,
            self._replicate_fn,
            self._prepare_input_fn,
            self._prepare_output_fn,
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(sequence_dim={self.sequence_sharding[0].dim}, "
            f"use_local_output={self.use_local_output})"
        )


def _as_tuple(x: Any) -> tuple | None:
    if x is None:
        return None
    return (x,) if isinstance(x, Placement) else tuple(x)


class PrepareModuleInput(ParallelStyle):
    """Convert a module's inputs to DTensors and redistribute them at run time (as
    PyTorch's ``PrepareModuleInput``).

    Keyword Args:
        input_layouts: one layout per positional input (``None`` for inputs left alone); a
            plain tensor is wrapped with it.
        desired_input_layouts: the layout each input is redistributed to (same length).
        input_kwarg_layouts: ``{kwarg name: layout}`` for keyword inputs.
        desired_input_kwarg_layouts: ``{kwarg name: desired layout}``.
        use_local_output: hand the module local tensors instead of DTensors (default False).

    Raises:
        LayoutLengthError: ``desired_input_layouts`` missing or of another length than
            ``input_layouts`` (or the kwarg dicts of different lengths); a ``ValueError``
            and an ``AssertionError`` (PyTorch's type), with PyTorch's message.
        ValueError: at run time, a module called with another number of positional inputs
            than ``input_layouts`` ("module inputs and input_layouts should have same
            length!", as PyTorch).
    """

    def __init__(
        self,
        *,
        input_layouts: Placement | tuple[Placement | None, ...] | None = None,
        desired_input_layouts: Placement | tuple[Placement | None, ...] | None = None,
        input_kwarg_layouts: dict[str, Placement] | None = None,
        desired_input_kwarg_layouts: dict[str, Placement] | None = None,
        use_local_output: bool = False,
    ) -> None:
        self.input_layouts = _as_tuple(input_layouts)
        self.desired_input_layouts = _as_tuple(desired_input_layouts)
        self.use_local_output = use_local_output
        if self.input_layouts is not None:
            if self.desired_input_layouts is None:
                raise LayoutLengthError(
                    "PrepareModuleInput: desired module inputs should not be None! (give "
                    "desired_input_layouts, one per input_layouts entry; None leaves an input "
                    "as it is)"
                )
            if len(self.input_layouts) != len(self.desired_input_layouts):
                raise LayoutLengthError(
                    f"PrepareModuleInput: input_layouts and desired_input_layouts should have "
                    f"same length! (got {self.input_layouts} and {self.desired_input_layouts})"
                )
        self.with_kwargs = input_kwarg_layouts is not None
        self.input_kwarg_layouts = dict(input_kwarg_layouts or {})
        self.desired_input_kwarg_layouts = dict(desired_input_kwarg_layouts or {})
        if self.with_kwargs and len(self.input_kwarg_layouts) != len(
            self.desired_input_kwarg_layouts
        ):
            raise LayoutLengthError(
                "PrepareModuleInput: input_kwarg_layouts and desired_input_kwarg_layouts should "
                "have same length!"
            )

    def _prepare_arg(
        self,
        x: Any,
        mesh: DeviceMesh,
        layout: Placement | None,
        desired: Placement | None,
        what: Any,
    ) -> Any:
        if layout is None:
            return x
        return _convert(x, mesh, layout, desired, self.use_local_output, what)

    def _prepare_inputs(self, mod: Any, inputs: tuple, mesh: DeviceMesh) -> tuple:
        if self.input_layouts is None:
            return inputs
        if len(inputs) != len(self.input_layouts):
            raise ValueError(
                f"PrepareModuleInput: module inputs and input_layouts should have same length! "
                f"({type(mod).__name__} was called with {len(inputs)} positional inputs but "
                f"input_layouts has {len(self.input_layouts)}; give one layout per positional "
                f"input, None for those left alone, and keyword inputs through "
                f"input_kwarg_layouts)"
            )
        assert self.desired_input_layouts is not None
        return tuple(
            self._prepare_arg(
                x,
                mesh,
                lay,
                des,
                lambda i=i: f"PrepareModuleInput input {i} of {type(mod).__name__}",
            )
            for i, (x, lay, des) in enumerate(
                zip(inputs, self.input_layouts, self.desired_input_layouts)
            )
        )

    def _hook(self, mesh: DeviceMesh, mod: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        args = self._prepare_inputs(mod, args, mesh)
        if self.with_kwargs and kwargs:
            kwargs = {
                k: self._prepare_arg(
                    v,
                    mesh,
                    self.input_kwarg_layouts.get(k),
                    self.desired_input_kwarg_layouts.get(k),
                    lambda k=k: f"PrepareModuleInput keyword input {k!r} of {type(mod).__name__}",
                )
                for k, v in kwargs.items()
            }
        return args, kwargs

    def _apply(self, module: Any, device_mesh: DeviceMesh) -> Any:
        _check_mesh(self, device_mesh)
        adapter_for(module).register_input_hook(module, partial(self._hook, device_mesh))
        return module

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(input_layouts={self.input_layouts}, desired_input_layouts="
            f"{self.desired_input_layouts}, input_kwarg_layouts={self.input_kwarg_layouts}, "
            f"desired_input_kwarg_layouts={self.desired_input_kwarg_layouts}, use_local_output="
            f"{self.use_local_output})"
        )


class PrepareModuleOutput(ParallelStyle):
    """Convert a module's outputs to DTensors and redistribute them (as PyTorch's
    ``PrepareModuleOutput``).

    Keyword Args:
        output_layouts: one layout per output (``None`` for outputs left alone); a plain
            output tensor is wrapped with it.
        desired_output_layouts: the layout each output is redistributed to.
        use_local_output: return local tensors (default True).

    Raises:
        LayoutLengthError: the two layout tuples differ in length (PyTorch's message).
        ValueError: at run time, a module returning another number of outputs than
            ``output_layouts``.
    """

    def __init__(
        self,
        *,
        output_layouts: Placement | tuple[Placement | None, ...],
        desired_output_layouts: Placement | tuple[Placement, ...],
        use_local_output: bool = True,
    ) -> None:
        self.output_layouts = _as_tuple(output_layouts) or ()
        self.desired_output_layouts = _as_tuple(desired_output_layouts) or ()
        self.use_local_output = use_local_output
        if len(self.output_layouts) != len(self.desired_output_layouts):
            raise LayoutLengthError(
                f"PrepareModuleOutput: output_layouts and desired_output_layouts should have "
                f"same length! (got {self.output_layouts} and {self.desired_output_layouts})"
            )

    def _prepare_out(self, mesh: DeviceMesh, mod: Any, args: tuple, outputs: Any) -> Any:
        single = not isinstance(outputs, tuple)
        outs = (outputs,) if single else outputs
        if len(outs) != len(self.output_layouts):
            raise ValueError(
                f"PrepareModuleOutput: module outputs and output_layouts should have same "
                f"length! ({type(mod).__name__} returned {len(outs)} outputs but "
                f"output_layouts has {len(self.output_layouts)})"
            )
        res = []
        for i, (o, lay, des) in enumerate(
            zip(outs, self.output_layouts, self.desired_output_layouts)
        ):
            if lay is None:
                res.append(o)
                continue

            def what(i: int = i) -> str:
                return f"PrepareModuleOutput output {i} of {type(mod).__name__}"

            res.append(_convert(o, mesh, lay, des, self.use_local_output, what))
        return res[0] if len(res) == 1 else tuple(res)

    def _apply(self, module: Any, device_mesh: DeviceMesh) -> Any:
        _check_mesh(self, device_mesh)
        adapter_for(module).register_output_hook(module, partial(self._prepare_out, device_mesh))
        return module

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(output_layouts={self.output_layouts}, desired_output_layouts="
            f"{self.desired_output_layouts}, use_local_output={self.use_local_output})"
        )


class PrepareModuleInputOutput(ParallelStyle):
    """:class:`PrepareModuleInput` and :class:`PrepareModuleOutput` together (as PyTorch's
    ``PrepareModuleInputOutput``; ``use_local_input`` is the input side's
    ``use_local_output``)."""

    def __init__(
        self,
        *,
        input_layouts: Placement | tuple[Placement | None, ...] | None = None,
        desired_input_layouts: Placement | tuple[Placement | None, ...] | None = None,
        input_kwarg_layouts: dict[str, Placement] | None = None,
        desired_input_kwarg_layouts: dict[str, Placement] | None = None,
        use_local_input: bool = False,
        output_layouts: Placement | tuple[Placement | None, ...],
        desired_output_layouts: Placement | tuple[Placement, ...],
        use_local_output: bool = True,
    ) -> None:
        self.prepare_module_input = PrepareModuleInput(
            input_layouts=input_layouts,
            desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts,
            desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_output=use_local_input,
        )
        self.prepare_module_output = PrepareModuleOutput(
            output_layouts=output_layouts,
            desired_output_layouts=desired_output_layouts,
            use_local_output=use_local_output,
        )

    def _apply(self, module: Any, device_mesh: DeviceMesh) -> Any:
        self.prepare_module_input._apply(module, device_mesh)
        self.prepare_module_output._apply(module, device_mesh)
        return module

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.prepare_module_input!r}, {self.prepare_module_output!r})"
        )
