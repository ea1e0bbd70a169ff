"""Malformed op specs: each raises exactly one OpSpecError that names the file, the entry
and the field and is not chained to a pydantic/YAML traceback; plus the positive paths
(override, __default__, the seed format, entry points, reload)."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
import traceback
import types
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import hyper_shard.registry.loader as L
import hyper_shard.registry.registry as R
from hyper_shard.errors import OpSpecError
from hyper_shard.registry import Registry, get_registry, load_all, load_dir, load_file, reload

_real_entry_point_dirs = L.entry_point_dirs  # the env fixture replaces it

BASE = """\
__default__: {rule: pointwise}
add:
  partial: linear
  torch: [torch.add, Tensor.add]
mm:
  rule: einsum
  equation: "m k, k n -> m n"
  torch: [torch.mm]
"""

OP_MODULE = """\
from hyper_shard.dispatch.op import DistributedOp
from hyper_shard.placement import Shard


class Op(DistributedOp):
    def single_dim_strategies(self, call):
        return [((Shard(0),), (Shard(0),) * len(call.specs))]


class NotAnOp:
    pass


def op_function(x):
    return x


class Exploding(DistributedOp):
    def __init__(self, name, params=None):
        raise ValueError("bad configuration of Exploding")
"""


@pytest.fixture
def env(tmp_path, monkeypatch):
    """An isolated loader: a tiny built-in dir, no entry points, no environment dirs; the
    process registry, sys.path and test modules are restored afterwards."""
    monkeypatch.delenv(L.YAML_ENV, raising=False)
    monkeypatch.delenv(L.PY_ENV, raising=False)
    builtin = tmp_path / "builtin"
    builtin.mkdir()
    (builtin / "base.yaml").write_text(BASE)
    monkeypatch.setattr(L, "builtin_dirs", lambda: [builtin])
    monkeypatch.setattr(L, "entry_point_dirs", lambda: [])
    monkeypatch.setattr(L, "platform_dirs", lambda: [])
    saved = (R._REGISTRY, list(R._EXTRA), list(sys.path), set(sys.modules))
    (tmp_path / "specs").mkdir()
    (tmp_path / "py").mkdir()
    yield tmp_path
    R._REGISTRY, R._EXTRA[:], sys.path[:] = saved[0], saved[1], saved[2]
    for m in set(sys.modules) - saved[3]:
        if m.startswith("hs_test_"):
            del sys.modules[m]


def _module(py: Path, source: str = OP_MODULE) -> str:
    """Write a uniquely named module into ``py``; return its name."""
    name = f"hs_test_{uuid.uuid4().hex[:10]}"
    (py / f"{name}.py").write_text(source)
    return name


def _check_clean(e: OpSpecError, user_cause: type | None = None) -> str:
    """The error was raised by hyper_shard itself and is not chained to loader internals
    (YAML/pydantic noise). ``user_cause``: the error comes from the user's own code (a
    class constructor that raises), whose exception stays the cause, traceback and all."""
    if user_cause is None:
        assert e.__cause__ is None
        assert e.__context__ is None or e.__suppress_context__
    else:
        assert type(e.__cause__) is user_cause, repr(e.__cause__)
    frames = traceback.extract_tb(e.__traceback__)
    assert "hyper_shard" in Path(frames[-1].filename).parts, frames[-1].filename
    text = "".join(traceback.format_exception(e))
    assert "During handling" not in text
    assert ("direct cause" in text) == (user_cause is not None)
    assert "pydantic" not in text.replace(str(e), "")
    assert "errors.pydantic.dev" not in str(e)  # no pydantic boilerplate in the message
    return str(e)


# ---------------------------------------------------------------------- the corpus
@dataclass
class Case:
    id: str
    files: dict[str, str | bytes]  # file name -> YAML ('@MOD@' is replaced by a module)
    expect: list[str]  # fragments of the message ('@FILE@' is the first file's path)
    via: str = "file"  # file | all | bind | reload
    module: str | None = None  # source of '@MOD@'
    env: dict[str, str] = field(default_factory=dict)
    user_cause: type | None = None  # the user's exception, kept as the cause


def one(yaml: str | bytes, *expect: str, via: str = "file", module: str | None = None) -> dict:
    return {"files": {"ops.yaml": yaml}, "expect": list(expect), "via": via, "module": module}


# fmt: off
CASES = [
    # --- the file itself
    Case("bad_yaml_syntax", **one("my_op:\n  torch: [torch.add\n", "@FILE@", "invalid YAML", "line 3")),
    Case("bad_yaml_tab", **one("my_op:\n\trule: pointwise\n", "@FILE@", "invalid YAML", "line 2")),
    Case("top_level_list", **one("- rule: pointwise\n", "@FILE@", "top level must be a mapping", "got a list")),
    Case("top_level_scalar", **one("pointwise\n", "@FILE@", "top level must be a mapping", "got a str")),
    Case("duplicate_entry_in_file", **one("a: {rule: pointwise}\nb: {rule: pointwise}\na: {rule: einsum}\n", "@FILE@", "duplicate key 'a'", "first at line 1", "line 3")),
    Case("duplicate_field_in_entry", **one("a:\n  rule: pointwise\n  rule: einsum\n", "@FILE@", "duplicate key 'rule'", "line 3")),
    Case("not_utf8", **one(b"a: {rule: pointwise, doc: \xff\xfe}\n", "@FILE@", "not UTF-8")),
    Case("entry_not_mapping_list", **one("my_op: [torch.add]\n", "@FILE@", "entry 'my_op'", "must be a mapping", "got a list")),
    Case("entry_not_mapping_str", **one("my_op: pointwise\n", "@FILE@", "entry 'my_op'", "must be a mapping", "got a str")),
    Case("entry_name_not_str", **one("5: {rule: pointwise}\n", "@FILE@", "entry names must be non-empty strings", "got 5")),
    Case("field_name_not_str", **one("a: {rule: pointwise, 3: x}\n", "@FILE@", "entry 'a'", "field names must be strings")),
    Case("unknown_special_key", **one("__defaults__: {rule: pointwise}\n", "@FILE@", "entry '__defaults__'", "did you mean '__default__'")),
    Case("default_not_mapping", **one("__default__: pointwise\na: {torch: [torch.a]}\n", "@FILE@", "entry '__default__'", "must be a mapping", "got a str")),
    Case("default_override", **one("__default__: {rule: pointwise, override: true}\na: {}\n", "@FILE@", "entry '__default__'", "field 'override'")),
    # --- what implements the entry
    Case("unknown_rule", **one("a: {rule: pointwize}\n", "@FILE@", "entry 'a'", "field 'rule'", "unknown rule 'pointwize'", "did you mean 'pointwise'", "einsum")),
    Case("missing_rule_and_class", **one("a: {torch: [torch.a]}\n", "@FILE@", "entry 'a'", "exactly one of 'rule', 'class'", "got none")),
    Case("empty_entry", **one("a:\n", "@FILE@", "entry 'a'", "got none")),
    Case("both_rule_and_class", **one("a: {rule: pointwise, class: 'm:C'}\n", "@FILE@", "entry 'a'", "got 'rule' and 'class'")),
    Case("class_without_colon", **one("a: {class: my_module.MyOp}\n", "@FILE@", "entry 'a'", "field 'class'", "module:Class", "my_module.MyOp")),
    Case("class_two_colons", **one("a: {class: 'a:b:c'}\n", "@FILE@", "entry 'a'", "field 'class'", "module:Class")),
    Case("class_empty_part", **one("a: {class: ':Op'}\n", "@FILE@", "entry 'a'", "field 'class'")),
    # --- wrong types
    Case("rule_not_str", **one("a: {rule: 5}\n", "@FILE@", "entry 'a'", "field 'rule'", "string", "got 5")),
    Case("torch_int", **one("a: {rule: pointwise, torch: 5}\n", "@FILE@", "entry 'a'", "field 'torch'", "list", "got 5")),
    Case("torch_item_int", **one("a: {rule: pointwise, torch: [torch.add, 5]}\n", "@FILE@", "entry 'a'", "field 'torch.1'", "string")),
    Case("mindspore_mapping", **one("a: {rule: pointwise, mindspore: {Add: 1}}\n", "@FILE@", "entry 'a'", "field 'mindspore'")),
    Case("override_yes_string", **one("a: {rule: pointwise, override: 'yes'}\n", "@FILE@", "entry 'a'", "field 'override'", "true or false", "'yes'")),
    Case("override_int", **one("a: {rule: pointwise, override: 1}\n", "@FILE@", "entry 'a'", "field 'override'", "true or false")),
    Case("doc_list", **one("a: {rule: pointwise, doc: [x]}\n", "@FILE@", "entry 'a'", "field 'doc'")),
    Case("two_problems", **one("a: {rule: pointwise, torch: 5, override: maybe}\n", "@FILE@", "entry 'a'", "2 problems", "field 'torch'", "field 'override'")),
    # --- rule parameters
    Case("partial_bogus", **one("a: {rule: pointwise, partial: bogus}\n", "@FILE@", "entry 'a'", "field 'partial'", "'linear'", "got 'bogus'", "rule 'pointwise'")),
    Case("unknown_rule_param", **one("a: {rule: pointwise, partail: linear}\n", "@FILE@", "entry 'a'", "field 'partail'", "unknown parameter", "did you mean 'partial'")),
    Case("entry_field_typo", **one("a: {rule: pointwise, troch: [torch.add]}\n", "@FILE@", "entry 'a'", "field 'troch'", "did you mean 'torch'")),
    Case("signature_not_list", **one("a: {rule: pointwise, signature: input}\n", "@FILE@", "entry 'a'", "field 'signature'")),
    Case("bad_param_from_default", **one("__default__: {rule: pointwise, partial: bogus}\na: {torch: [torch.a]}\n", "@FILE@", "entry 'a'", "field 'partial'", "__default__")),
    Case("einsum_no_arrow", **one("a: {rule: einsum, equation: 'mk,kn'}\n", "@FILE@", "entry 'a'", "field 'equation'", "needs '->'")),
    Case("einsum_repeated_label", **one("a: {rule: einsum, equation: 'm m, m n -> m n'}\n", "@FILE@", "entry 'a'", "field 'equation'", "repeats")),
    Case("einsum_output_label_unknown", **one("a: {rule: einsum, equation: 'm k, k n -> m x'}\n", "@FILE@", "entry 'a'", "field 'equation'", "output label 'x'")),
    Case("einsum_missing_equation", **one("a: {rule: einsum}\n", "@FILE@", "entry 'a'", "field 'equation'", "missing")),
    Case("einsum_equation_not_str", **one("a: {rule: einsum, equation: [m, k]}\n", "@FILE@", "entry 'a'", "field 'equation'", "string")),
    # --- classes
    Case("missing_module", **one("a: {class: 'hs_test_no_such_module:Op'}\n", "@FILE@", "entry 'a'", "field 'class'", "'hs_test_no_such_module' not found", "HYPER_PARALLEL_OPS_PYTHON_PATH")),
    Case("module_import_error", **one("a: {class: '@MOD@:Op'}\n", "@FILE@", "entry 'a'", "field 'class'", "importing module", "hs_test_missing_dependency", module="import hs_test_missing_dependency\n")),
    Case("module_raises", **one("a: {class: '@MOD@:Op'}\n", "@FILE@", "entry 'a'", "field 'class'", "RuntimeError: boom", module="raise RuntimeError('boom')\n"), user_cause=RuntimeError),
    Case("module_syntax_error", **one("a: {class: '@MOD@:Op'}\n", "@FILE@", "entry 'a'", "field 'class'", "SyntaxError", module="def f(:\n"), user_cause=SyntaxError),
    Case("missing_class", **one("a: {class: '@MOD@:Opp'}\n", "@FILE@", "entry 'a'", "field 'class'", "has no class 'Opp'", "did you mean 'Op'", module=OP_MODULE)),
    Case("class_not_distributed_op", **one("a: {class: '@MOD@:NotAnOp'}\n", "@FILE@", "entry 'a'", "field 'class'", "not a DistributedOp subclass", module=OP_MODULE)),
    Case("class_is_function", **one("a: {class: '@MOD@:op_function'}\n", "@FILE@", "entry 'a'", "field 'class'", "not a DistributedOp subclass", module=OP_MODULE)),
    Case("class_constructor_raises", **one("a: {class: '@MOD@:Exploding'}\n", "@FILE@", "entry 'a'", "constructing class", "bad configuration of Exploding", module=OP_MODULE), user_cause=ValueError),
    Case("class_unknown_param", **one("a: {class: '@MOD@:Op', foo: 1}\n", "@FILE@", "entry 'a'", "field 'foo'", "unknown parameter", "own parameters: none", module=OP_MODULE)),
    # --- the seed format
    Case("seed_missing_file", **one("Foo: {distributed_op_class: FooOp}\n", "@FILE@", "entry 'Foo'", "needs 'distributed_op_file'")),
    Case("seed_module_not_found", **one("Foo: {distributed_op_class: FooOp, distributed_op_file: hs_test_parallel_foo}\n", "@FILE@", "entry 'Foo'", "field 'distributed_op_file'", "'hyper_shard.rules.hs_test_parallel_foo'", "HYPER_PARALLEL_OPS_PYTHON_PATH")),
    Case("seed_missing_class", **one("Foo: {distributed_op_class: FooOp, distributed_op_module: '@MOD@'}\n", "@FILE@", "entry 'Foo'", "field 'distributed_op_module'", "has no class 'FooOp'", module=OP_MODULE)),
    Case("seed_class_and_rule", **one("Foo: {rule: pointwise, distributed_op_class: FooOp, distributed_op_file: x}\n", "@FILE@", "entry 'Foo'", "got 'rule' and 'distributed_op_class'")),
    # --- across files and sources (load_all)
    Case("duplicate_across_files", {"a.yaml": "my_op: {rule: pointwise}\n", "b.yaml": "my_op: {rule: pointwise}\n"}, ["a.yaml", "b.yaml", "entry 'my_op'", "already defined", "override: true"], via="all"),
    Case("duplicate_of_builtin", {"ops.yaml": "add: {rule: pointwise}\n"}, ["@FILE@", "base.yaml", "entry 'add'", "already defined"], via="all"),
    Case("torch_name_bound_twice", {"ops.yaml": "my_add: {rule: pointwise, torch: [torch.add]}\n"}, ["@FILE@", "entry 'my_add'", "field 'torch'", "'torch.add' is already bound by entry 'add'", "base.yaml"], via="all"),
    Case("mindspore_name_bound_twice", {"ops.yaml": "x: {rule: pointwise, mindspore: [Foo]}\ny: {rule: pointwise, mindspore: [Foo]}\n"}, ["@FILE@", "entry 'y'", "field 'mindspore'", "'Foo' is already bound by entry 'x'"], via="all"),
    Case("missing_yaml_env_dir", {}, ["HYPER_PARALLEL_OPS_YAML_DIR", "no_such_dir", "not a directory"], via="all", env={"HYPER_PARALLEL_OPS_YAML_DIR": "@TMP@/no_such_dir"}),
    Case("missing_python_path_dir", {}, ["HYPER_PARALLEL_OPS_PYTHON_PATH", "no_such_py", "not a directory"], via="all", env={"HYPER_PARALLEL_OPS_PYTHON_PATH": "@TMP@/no_such_py"}),
    Case("bad_file_in_env_dir", {"ops.yaml": "a: {rule: nope}\n"}, ["@FILE@", "entry 'a'", "field 'rule'"], via="env"),
    Case("bad_spec_on_reload", {"ops.yaml": "a: {rule: einsum, equation: 'm k -> q'}\n"}, ["@FILE@", "entry 'a'", "field 'equation'"], via="reload"),
    # --- binding to torch functions
    Case("unknown_torch_name", {"ops.yaml": "a: {rule: pointwise, torch: [torch.addd]}\n"}, ["@FILE@", "entry 'a'", "field 'torch'", "'torch.addd'", "no attribute 'addd'", "did you mean 'torch.add'"], via="bind"),
    Case("unknown_tensor_method", {"ops.yaml": "a: {rule: pointwise, torch: [Tensor.ad_]}\n"}, ["@FILE@", "entry 'a'", "field 'torch'", "'Tensor.ad_'"], via="bind"),
    Case("torch_name_not_callable", {"ops.yaml": "a: {rule: pointwise, torch: [torch.float32]}\n"}, ["@FILE@", "entry 'a'", "field 'torch'", "not a function"], via="bind"),
    Case("torch_property_without_get", {"ops.yaml": "a: {rule: pointwise, torch: [Tensor.shape]}\n"}, ["@FILE@", "entry 'a'", "field 'torch'", "'Tensor.shape.__get__'"], via="bind"),
    Case("custom_name_missing_module", {"ops.yaml": "a: {rule: pointwise, torch: [hs_test_nomod.fn]}\n"}, ["@FILE@", "entry 'a'", "field 'torch'", "'hs_test_nomod'", "HYPER_PARALLEL_OPS_PYTHON_PATH"], via="bind"),
    Case("custom_name_missing_function", {"ops.yaml": "a: {rule: pointwise, torch: ['@MOD@.no_fn']}\n"}, ["@FILE@", "entry 'a'", "field 'torch'", "no attribute 'no_fn'"], via="bind", module=OP_MODULE),
    Case("unknown_torch_name_on_reload", {"ops.yaml": "a: {rule: pointwise, torch: [torch.addd]}\n"}, ["@FILE@", "entry 'a'", "field 'torch'", "'torch.addd'"], via="reload"),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_spec(case: Case, env: Path, monkeypatch) -> None:
    specs, py = env / "specs", env / "py"
    mod = _module(py, case.module) if case.module is not None else "hs_test_unused"
    if case.via == "reload" or case.via == "bind":
        import hyper_shard.platform.torch.dispatch  # noqa: F401  (a platform in use)
    old = R._REGISTRY = Registry(load_all())  # a good registry in place
    if case.module is not None:
        monkeypatch.setenv(L.PY_ENV, str(py))
    for k, v in case.env.items():
        monkeypatch.setenv(k, v.replace("@TMP@", str(env)))
    first = None
    for fname, text in case.files.items():
        p = specs / fname
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text.replace("@MOD@", mod))
        first = first or p
    with pytest.raises(OpSpecError) as info:
        if case.via == "file":
            assert first is not None
            if case.module is not None:
                L.add_python_path()  # as load_all does first
            load_file(first)
        elif case.via == "all":
            load_all(extra_dirs=[specs])
        elif case.via == "env":
            monkeypatch.setenv(L.YAML_ENV, str(specs))
            load_all()
        elif case.via == "reload":
            reload(extra_dirs=[specs])
        elif case.via == "bind":
            from hyper_shard.platform.torch.dispatch import build_torch_table

            build_torch_table(Registry(load_all(extra_dirs=[specs])))
    msg = _check_clean(info.value, case.user_cause)
    for frag in case.expect:
        frag = frag.replace("@FILE@", str(first))
        assert frag in msg, f"{frag!r} not in message:\n{msg}"
    assert R._REGISTRY is old  # nothing replaced by a failed load
    assert get_registry() is old


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 30 and len({c.id for c in CASES}) == len(CASES)


def test_entry_point_failure(env: Path, monkeypatch) -> None:
    monkeypatch.setattr(L, "entry_point_dirs", _real_entry_point_dirs)

    class BadEP:
        name, value = "broken", "hs_test_nowhere:specs"

        def load(self):
            raise ModuleNotFoundError("No module named 'hs_test_nowhere'")

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [BadEP()])
    with pytest.raises(OpSpecError) as info:
        load_all()
    msg = _check_clean(info.value)
    assert "entry point 'broken'" in msg and "hs_test_nowhere" in msg and L.EP_GROUP in msg


def test_missing_extra_dir(env: Path) -> None:
    with pytest.raises(OpSpecError) as info:
        load_all(extra_dirs=[env / "nope"])
    assert "nope" in _check_clean(info.value)
    with pytest.raises(OpSpecError) as info:
        load_dir(env / "nope")
    assert "not a directory" in _check_clean(info.value)


# ---------------------------------------------------------------------- positive paths
def test_empty_file_and_yaml_merge_keys(env: Path) -> None:
    p = env / "specs" / "ops.yaml"
    p.write_text("")
    assert load_file(p) == []
    p.write_text(
        "base: &b {rule: pointwise, partial: linear}\n"
        "x:\n  <<: *b\n  torch: [torch.x1]\n"
        "y:\n  <<: *b\n  partial: bilinear\n"
    )
    got = {e.name: e for e in load_file(p)}
    assert got["x"].op.params.partial == "linear" and got["x"].torch == ["torch.x1"]
    assert got["y"].op.params.partial == "bilinear"  # a key after a merge is not a duplicate


def test_override_replaces_an_entry(env: Path) -> None:
    (env / "specs" / "ops.yaml").write_text(
        "add: {rule: pointwise, override: true, torch: [torch.add]}\n"
    )
    reg = Registry(load_all(extra_dirs=[env / "specs"]))
    add = reg["add"]
    assert add.file == str(env / "specs" / "ops.yaml")
    assert add.op.params.partial == "none"  # the new entry's parameters, not the old ones
    assert reg.names("torch") == {"torch.add": add, "torch.mm": reg["mm"]}  # Tensor.add gone


def test_override_takes_a_torch_name(env: Path) -> None:
    (env / "specs" / "ops.yaml").write_text(
        "my_add: {rule: pointwise, override: true, torch: [torch.add]}\n"
    )
    reg = Registry(load_all(extra_dirs=[env / "specs"]))
    names = reg.names("torch")
    assert names["torch.add"].name == "my_add"
    assert names["Tensor.add"].name == "add"  # the built-in keeps its other names
    assert reg["add"].torch == ["Tensor.add"]


def test_default_merges(env: Path) -> None:
    mod = _module(env / "py")
    (env / "specs" / "ops.yaml").write_text(
        "__default__: {rule: einsum, signature: [input, mat2], static_args: []}\n"
        "p: {equation: 'm k, k n -> m n', torch: [torch.p1]}\n"
        "q: {equation: 'b m k, b k n -> b m n', signature: [x, y]}\n"
        "r: {rule: pointwise, partial: linear}\n"
        f"s: {{class: '{mod}:Op'}}\n"
    )
    sys.path.append(str(env / "py"))
    got = {e.name: e for e in load_file(env / "specs" / "ops.yaml")}
    assert got["p"].op.params.equation == "m k, k n -> m n"
    assert got["p"].op.binder.names == ("input", "mat2")  # from __default__
    assert got["q"].op.binder.names == ("x", "y")  # the entry wins over __default__
    assert got["r"].entry.rule == "pointwise" and got["r"].op.binder.names == ("input", "mat2")
    assert got["s"].entry.rule is None and type(got["s"].op).__name__ == "Op"
    assert got["s"].op.binder.names == ("input", "mat2")  # shared RuleParams reach a class too


def test_seed_format_loads(env: Path, monkeypatch) -> None:
    py = env / "py"
    mod = _module(py)
    pkg = py / f"hs_test_pkg_{uuid.uuid4().hex[:8]}"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "parallel_foo.py").write_text(OP_MODULE)
    monkeypatch.setenv(L.PY_ENV, str(py))
    (env / "specs" / "seed.yaml").write_text(
        f"FooPrim:\n  dist_op_name: _foo_dist_op\n  distributed_op_class: Op\n"
        f"  distributed_op_file: {mod}\n  infer_layout_suffix: WithShape\n"
        f"foo:\n  distributed_op_class: Op\n  distributed_op_file: {mod}.py\n"
        f"{mod}.op_function:\n  distributed_op_class: Op\n"
        f"  distributed_op_module: {pkg.name}.parallel_foo\n"
    )
    reg = Registry(load_all(extra_dirs=[env / "specs"]))
    assert reg["FooPrim"].mindspore == ["FooPrim"] and reg["FooPrim"].torch == []
    assert reg["foo"].torch == ["torch.foo", "Tensor.foo"]
    assert reg[f"{mod}.op_function"].torch == [f"{mod}.op_function"]
    assert type(reg["FooPrim"].op).__module__ == mod
    assert type(reg[f"{mod}.op_function"].op).__module__ == f"{pkg.name}.parallel_foo"
    assert sys.path[-1] == str(py)  # appended, after the stdlib and site-packages
    # a custom function name binds to the function object __torch_function__ receives
    from hyper_shard.platform.torch.dispatch import build_torch_table

    reg.entries.pop("foo")  # torch.foo does not exist
    table = build_torch_table(reg)
    fn = sys.modules[mod].op_function
    assert table[fn].op is reg[f"{mod}.op_function"].op


def test_entry_points_contribute_dirs(env: Path, monkeypatch) -> None:
    monkeypatch.setattr(L, "entry_point_dirs", _real_entry_point_dirs)
    ep_dir, ep_pkg = env / "ep_dir", env / "py" / f"hs_test_ep_{uuid.uuid4().hex[:8]}"
    ep_dir.mkdir()
    ep_pkg.mkdir()
    (ep_dir / "a.yaml").write_text("from_dir: {rule: pointwise}\n")
    (ep_pkg / "__init__.py").write_text("")
    (ep_pkg / "b.yaml").write_text("from_pkg: {rule: pointwise}\n")
    sys.path.append(str(env / "py"))
    pkg = __import__(ep_pkg.name)

    class EP:
        def __init__(self, name: str, obj: object) -> None:
            self.name, self.value, self.obj = name, f"x:{name}", obj

        def load(self) -> object:
            return self.obj

    eps = [EP("path", str(ep_dir)), EP("package", pkg), EP("callable", lambda: [str(ep_dir)])]
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: eps)
    names = {e.name for e in load_all()}
    assert {"from_dir", "from_pkg", "add", "mm"} <= names
    eps.append(EP("bad", types.SimpleNamespace()))  # neither a path nor a package
    with pytest.raises(OpSpecError) as info:
        load_all()
    assert "entry point 'bad'" in _check_clean(info.value)


def test_env_dirs_add_to_builtins(env: Path, monkeypatch) -> None:
    other = env / "other"
    other.mkdir()
    (env / "specs" / "a.yaml").write_text("a_op: {rule: pointwise}\n")
    (other / "b.yml").write_text("b_op: {rule: pointwise}\n")
    monkeypatch.setenv(L.YAML_ENV, f"{env / 'specs'}{os.pathsep}{other}")
    names = [e.name for e in load_all()]
    assert names == ["add", "mm", "a_op", "b_op"]


def test_reload_keeps_old_registry_when_new_is_bad(env: Path) -> None:
    import hyper_shard.platform.torch.dispatch  # noqa: F401

    specs = env / "specs"
    (specs / "ops.yaml").write_text("my_op: {rule: pointwise, torch: [torch.exp]}\n")
    good = reload(extra_dirs=[specs])
    assert get_registry() is good and "my_op" in good
    assert good.binding("torch", lambda r: None) is not None  # bound eagerly by reload
    for bad in (
        "my_op: {rule: pointwise, torch: [torch.exp]\n",  # YAML
        "my_op: {rule: pointwise, torch: [torch.nope]}\n",  # torch name
        "my_op: {rule: pointwise, partial: nope}\n",  # parameter
    ):
        (specs / "ops.yaml").write_text(bad)
        with pytest.raises(OpSpecError):
            reload(extra_dirs=[specs])
        assert get_registry() is good  # the old one stays
    (specs / "ops.yaml").write_text("my_op2: {rule: pointwise}\n")
    new = reload(extra_dirs=[specs])
    assert get_registry() is new and "my_op2" in new and "my_op" not in new
    # extra dirs are remembered for a later rebuild
    R._REGISTRY = None
    assert "my_op2" in get_registry()


def test_builtin_specs_load_and_bind() -> None:
    """The real built-in op_specs/ are valid and every torch name resolves."""
    from hyper_shard.platform.torch.dispatch import build_torch_table

    reg = Registry(load_all())
    table = build_torch_table(reg)
    assert "add" in reg and "mm" in reg and len(table) >= len(reg)
