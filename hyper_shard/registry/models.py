"""Pydantic v2 models of the YAML op spec.

A file maps entry names to entries; ``__default__`` gives per-file defaults merged under
every entry. An entry names a declarative ``rule`` (its parameters sit beside it and are
validated by the rule's own ``Params`` model) or a Python ``class: module:Class``, and binds
platform op names:

.. code-block:: yaml

    __default__: {rule: pointwise}
    add:
      torch: [torch.add, Tensor.add, Tensor.add_, Tensor.__add__, Tensor.__radd__]
      mindspore: [AddExt, Add, InplaceAddExt]
      partial: linear
    mm:
      rule: einsum
      equation: "m k, k n -> m n"
      torch: [torch.mm, Tensor.mm]
    stack_ext:
      class: parallel_stack_ext:StackExtDistributedOp
      mindspore: [StackExt]

The hyper-parallel seed format loads unchanged: an entry with ``distributed_op_class``
plus ``distributed_op_file`` or ``distributed_op_module`` (``dist_op_name``,
``infer_layout_suffix`` and ``template_name`` are accepted and ignored; hyper-parallel's own
classes map onto hyper_shard's rules, :mod:`hyper_shard.registry.hyper_parallel`); its name is the op name (a MindSpore
Primitive when it starts with a capital letter, else a torch function).

Types are strict where YAML is ambiguous: ``override`` must be ``true`` or ``false`` (the
string ``"yes"`` or the number ``1`` is refused), and a name list holds strings only.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

__all__ = ["OpEntry", "RuleParams", "ENTRY_FIELDS", "KIND_FIELDS"]

#: the YAML keys naming what implements an entry (exactly one per entry)
KIND_FIELDS = ("rule", "class", "distributed_op_class")


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
    mindspore_signature: list[str] | None = Field(
        default=None,
        description="canonical positional names for MindSpore Primitive calls, when they "
        "differ from the torch signature",
    )


class OpEntry(BaseModel):
    """One entry of an op-spec file (rule parameters are kept as extra fields)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    rule: str | None = None
    class_: str | None = Field(default=None, alias="class")
    torch: list[str] = Field(default_factory=list)
    mindspore: list[str] = Field(default_factory=list)
    override: StrictBool = False
    doc: str | None = None
    # the hyper-parallel seed format
    distributed_op_class: str | None = None
    distributed_op_file: str | None = None
    distributed_op_module: str | None = None
    dist_op_name: str | None = None
    infer_layout_suffix: str | None = None
    template_name: str | None = None

    @field_validator("torch", "mindspore", mode="before")
    @classmethod
    def _one_or_list(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

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
        kinds = [k for k in ("rule", "class_", "distributed_op_class") if getattr(self, k)]
        if len(kinds) != 1:
            names = {
                "rule": "rule",
                "class_": "class",
                "distributed_op_class": "distributed_op_class",
            }
            if kinds:
                raise ValueError(
                    f"an entry needs exactly one of 'rule', 'class' or 'distributed_op_class', "
                    f"got {' and '.join(repr(names[k]) for k in kinds)}; keep one"
                )
            raise ValueError(
                "an entry needs exactly one of 'rule', 'class' or 'distributed_op_class', got "
                "none; add e.g. 'rule: pointwise' (a declarative rule) or 'class: module:Class' "
                "(a DistributedOp subclass), or give the file a '__default__: {rule: ...}'"
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


#: every YAML key an entry itself understands (anything else is a rule parameter)
ENTRY_FIELDS = tuple(f.alias or n for n, f in OpEntry.model_fields.items())
