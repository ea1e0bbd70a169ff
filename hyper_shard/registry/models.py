"""Pydantic v2 models of the YAML op spec.

A file maps entry names to entries; ``__default__`` gives per-file defaults merged under
every entry. An entry names a declarative ``rule`` (its parameters sit beside it and are
validated by the rule's own ``Params`` model) or a Python ``class: module:Class``, and binds
platform op names, per platform key (a key some platform registered,
:mod:`hyper_shard.registry.platforms`):

.. code-block:: yaml

    __default__: {rule: pointwise}
    add:
      torch: [torch.add, Tensor.add, Tensor.add_, Tensor.__add__, Tensor.__radd__]
      mindspore: [AddExt, Add, InplaceAddExt]
      partial: linear
    mm:
      rule: einsum
      equation: "m k, k n -> m n"
      bindings: {torch: [torch.mm, Tensor.mm], jax: [jax.numpy.matmul]}
    stack_ext:
      class: parallel_stack_ext:StackExtDistributedOp
      mindspore: [StackExt]
    relu:
      extend: true          # adds names to the entry 'relu' defined by an earlier source
      sim: [sim.relu]

* ``<key>: [names]`` (the short form, e.g. ``torch:``/``mindspore:``) is accepted for a
  registered platform key only: anything else is a rule parameter, refused by the rule
  (so a typo is caught, naming the field);
* ``bindings: {<key>: [names]}`` takes any key: a key no installed platform registers is
  kept and ignored (a spec binding a platform whose package is not installed here still
  loads; ``hyper-shard validate`` reports it);
* ``signatures: {<key>: [names]}`` (short form ``<key>_signature``, e.g.
  ``mindspore_signature``) gives the canonical positional argument names of that
  platform's calls where they differ from ``signature``.

The hyper-parallel seed format loads unchanged: an entry with ``distributed_op_class``
plus ``distributed_op_file`` or ``distributed_op_module`` (``dist_op_name``,
``infer_layout_suffix`` and ``template_name`` are accepted and ignored; hyper-parallel's own
classes map onto hyper_shard's rules, :mod:`hyper_shard.registry.hyper_parallel`); its name
is the op name, bound on each platform that claims it (``PlatformBindings.seed_names``).

Types are strict where YAML is ambiguous: ``override`` must be ``true`` or ``false`` (the
string ``"yes"`` or the number ``1`` is refused), and a name list holds strings only.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    create_model,
    field_validator,
    model_validator,
)

from .platforms import SIGNATURE_SUFFIX, platform_keys, registered_platforms

__all__ = ["OpEntry", "RuleParams", "ENTRY_FIELDS", "KIND_FIELDS", "entry_fields", "entry_model"]

#: the YAML keys naming what implements an entry (exactly one per entry)
KIND_FIELDS = ("rule", "class", "distributed_op_class")


def _listed(v: Any) -> Any:
    return [v] if isinstance(v, str) else v


class RuleParams(BaseModel):
    """Parameters every rule accepts (families extend this model)."""

    model_config = ConfigDict(extra="forbid")

    signature: list[str] | None = Field(
        default=None,
        description="canonical positional argument names; '*name' collects the rest",
    )
    static_args: list[str] | None = Field(
        default=None, description="argument names whose values enter the layout cache key"
    )
    signatures: dict[str, list[str]] | None = Field(
        default=None,
        description="per platform key: the canonical positional names of that platform's "
        "calls, where they differ from 'signature' (short form: '<key>_signature')",
    )

    @model_validator(mode="before")
    @classmethod
    def _short_signatures(cls, data: Any) -> Any:
        """``<key>_signature: [...]`` (``mindspore_signature``) -> ``signatures``."""
        if not isinstance(data, dict):
            return data
        keys = platform_keys()
        short = [
            k
            for k in data
            if isinstance(k, str)
            and k.endswith(SIGNATURE_SUFFIX)
            and k[: -len(SIGNATURE_SUFFIX)] in keys
        ]
        sigs = data.get("signatures") or {}
        if not short or not isinstance(sigs, dict):
            return data
        data, sigs = dict(data), dict(sigs)
        for k in short:
            key = k[: -len(SIGNATURE_SUFFIX)]
            if key in sigs:
                raise ValueError(
                    f"'{k}' and 'signatures: {{{key}: ...}}' both give the {key} signature; "
                    f"keep one"
                )
            sigs[key] = data.pop(k)
        data["signatures"] = sigs
        return data


class OpEntry(BaseModel):
    """One entry of an op-spec file (rule parameters are kept as extra fields).

    Validate with ``OpEntry.model_validate(data)``: it uses :func:`entry_model`, whose
    fields include the short form ``<key>: [names]`` of every registered platform; after
    validation every platform's names are in :attr:`bindings`.
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    #: the registered platform keys this model takes as short-form fields
    platform_fields: ClassVar[tuple[str, ...]] = ()

    rule: str | None = None
    class_: str | None = Field(default=None, alias="class")
    bindings: dict[str, list[str]] = Field(default_factory=dict)
    override: StrictBool = False
    extend: StrictBool = False
    doc: str | None = None
    # the hyper-parallel seed format
    distributed_op_class: str | None = None
    distributed_op_file: str | None = None
    distributed_op_module: str | None = None
    dist_op_name: str | None = None
    infer_layout_suffix: str | None = None
    template_name: str | None = None

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """Validate ``obj`` with the model of the registered platforms' keys."""
        model = entry_model() if cls is OpEntry else cls
        return super(OpEntry, model).model_validate(obj, **kwargs)

    @model_validator(mode="before")
    @classmethod
    def _name_lists(cls, data: Any) -> Any:
        """A single name stands for a list of one, in either form."""
        if not isinstance(data, dict):
            return data
        upd: dict[str, Any] = {
            k: [data[k]] for k in cls.platform_fields if isinstance(data.get(k), str)
        }
        b = data.get("bindings")
        if isinstance(b, dict) and any(isinstance(v, str) for v in b.values()):
            upd["bindings"] = {k: _listed(v) for k, v in b.items()}
        return {**data, **upd} if upd else data

    @field_validator("bindings")
    @classmethod
    def _binding_keys(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for k in v:
            if not k or not k.replace("_", "a").isalnum():
                raise ValueError(
                    f"platform key {k!r} is not a platform key (letters, digits and '_', "
                    f"e.g. torch or mindspore)"
                )
        return v

    @field_validator("class_")
    @classmethod
    def _class_form(cls, v: str | None) -> str | None:
        if v is not None and (v.count(":") != 1 or not all(v.split(":"))):
            raise ValueError(
                f"must be 'module:Class' (a module importable from the installed packages or "
                f"HYPER_PARALLEL_OPS_PYTHON_PATH, a colon, the class name), got {v!r}"
            )
        return v

    @model_validator(mode="after")
    def _one_kind(self) -> OpEntry:
        for k in self.platform_fields:  # the short forms join the bindings
            given = getattr(self, k)
            if given:
                if k in self.bindings:
                    raise ValueError(
                        f"platform {k!r} is bound twice, by '{k}:' and by 'bindings: {{{k}: "
                        f"...}}'; keep one"
                    )
                self.bindings[k] = given
        kinds = [k for k in ("rule", "class_", "distributed_op_class") if getattr(self, k)]
        names = {"rule": "rule", "class_": "class", "distributed_op_class": "distributed_op_class"}
        if self.extend:
            if kinds or self.override:
                what = " and ".join(repr(names[k]) for k in kinds) or "'override'"
                raise ValueError(
                    f"an entry with 'extend: true' adds platform names to the entry of its name "
                    f"defined by an earlier source, so it takes no {what}; drop 'extend' to "
                    f"define the entry, or drop {what}"
                )
            return self
        if len(kinds) != 1:
            if kinds:
                raise ValueError(
                    f"an entry needs exactly one of 'rule', 'class' or 'distributed_op_class', "
                    f"got {' and '.join(repr(names[k]) for k in kinds)}; keep one"
                )
            raise ValueError(
                "an entry needs exactly one of 'rule', 'class' or 'distributed_op_class', got "
                "none; add e.g. 'rule: pointwise' (a declarative rule) or 'class: module:Class' "
                "(a DistributedOp subclass), or give the file a '__default__: {rule: ...}' "
                "('extend: true' adds names to an entry defined elsewhere)"
            )
        if self.distributed_op_class and not (
            self.distributed_op_file or self.distributed_op_module
        ):
            raise ValueError(
                "'distributed_op_class' needs 'distributed_op_file' (a module name, as in "
                "hyper-parallel: 'parallel_elementwise') or 'distributed_op_module' (a dotted "
                "module path); add one"
            )
        return self

    def rule_params(self) -> dict[str, Any]:
        """The extra fields: the rule's own parameters."""
        return dict(self.model_extra or {})


_MODELS: dict[tuple[str, ...], type[OpEntry]] = {}


def entry_model() -> type[OpEntry]:
    """:class:`OpEntry` with a short-form field ``<key>: list[str]`` per registered
    platform (made once per set of keys)."""
    keys = tuple(b.key for b in registered_platforms())
    model = _MODELS.get(keys)
    if model is None:
        fields: dict[str, Any] = {k: (list[str], Field(default_factory=list)) for k in keys}
        model = create_model("OpEntry", __base__=OpEntry, **fields)
        model.platform_fields = keys
        _MODELS[keys] = model
    return model


#: the YAML keys every entry understands besides the platform keys
ENTRY_FIELDS = tuple(f.alias or n for n, f in OpEntry.model_fields.items())


def entry_fields() -> tuple[str, ...]:
    """Every YAML key an entry itself understands (anything else is a rule parameter):
    :data:`ENTRY_FIELDS` and the registered platform keys."""
    return (*ENTRY_FIELDS, *(b.key for b in registered_platforms()))
