"""Platforms as data (hyper_shard/registry/platforms.py): the YAML's platform keys in their
short form (``torch:``, ``mindspore:``, ``mindspore_signature:``) and their general form
(``bindings:``, ``signatures:``) load to the same registry; an unknown platform key is an
error naming file, entry and field (or, under ``bindings:``, kept and reported); a platform
registered by an installed package's entry point binds its names; ``extend: true`` adds a
platform's names to an entry defined elsewhere; and no module outside hyper_shard/platform
names a framework in its code."""

from __future__ import annotations

import ast
import importlib
import re
import sys
import uuid
from pathlib import Path

import pytest
import yaml

import hyper_shard.registry.loader as L
import hyper_shard.registry.platforms as P
from hyper_shard.cli import main as cli_main
from hyper_shard.errors import OpSpecError
from hyper_shard.registry import Registry, load_all, load_dir, load_file
from hyper_shard.registry.platforms import (
    PlatformBindings,
    discover_platforms,
    platform_keys,
    register_platform,
    resolve_all,
    unregister_platform,
)

ROOT = Path(__file__).resolve().parents[2]
BUILTIN = ROOT / "op_specs"


# ---------------------------------------------------------------------- both forms
def _general_form(data: dict) -> dict:
    """A spec file with every platform key and ``<key>_signature`` moved into
    ``bindings:`` / ``signatures:``."""
    keys = platform_keys()
    out = {}
    for name, body in data.items():
        if not isinstance(body, dict):
            out[name] = body
            continue
        body = dict(body)
        b = {k: body.pop(k) for k in list(body) if k in keys}
        s = {k[: -len("_signature")]: body.pop(k) for k in list(body) if k.endswith("_signature")}
        if b:
            body["bindings"] = b
        if s:
            body["signatures"] = s
        out[name] = body
    return out


def test_short_and_general_forms_load_to_the_same_registry(tmp_path):
    converted = 0
    for f in sorted(BUILTIN.glob("*.yaml")):
        data = yaml.safe_load(f.read_text())
        general = _general_form(data)
        converted += sum(1 for b in general.values() if isinstance(b, dict) and "bindings" in b)
        (tmp_path / f.name).write_text(yaml.safe_dump(general, sort_keys=False))
    assert converted > 300
    assert "mindspore_signature" in "".join(f.read_text() for f in BUILTIN.glob("*.yaml"))
    short = {e.name: e for e in load_dir(BUILTIN)}
    general = {e.name: e for e in load_dir(tmp_path)}
    assert list(short) == list(general)
    n_sigs = 0
    for name, a in short.items():
        b = general[name]
        assert a.bindings == b.bindings, name
        assert type(a.op) is type(b.op) and a.op.signatures == b.op.signatures, name
        assert a.op.binder.names == b.op.binder.names, name
        assert a.op.static_names == b.op.static_names, name
        for key in platform_keys():
            assert a.op.binder_for(key).names == b.op.binder_for(key).names, (name, key)
        n_sigs += bool(a.op.signatures)
    assert n_sigs >= 2  # cross_entropy's and dropout's MindSpore signatures
    ce = short["cross_entropy"].op
    assert ce.binder_for("mindspore").names != ce.binder_for("torch").names
    assert short["add"].torch == short["add"].bindings["torch"]  # the key as an attribute


def test_a_platform_signature_source(tmp_path):
    """A platform declares where its signature comes from: here one that follows the
    torch argument order where it has no signature of its own."""
    twin = PlatformBindings(
        key="hs_twin", resolve=str, build_table=dict, signature_source=("hs_twin", "torch")
    )
    register_platform(twin)
    try:
        (tmp_path / "a.yaml").write_text(
            "a: {rule: pointwise, signatures: {torch: [x, y]}, hs_twin: [twin.a]}\n"
            "b: {rule: pointwise, signatures: {torch: [x, y], hs_twin: [u, v]}}\n"
        )
        got = {e.name: e.op for e in load_file(tmp_path / "a.yaml")}
        assert got["a"].binder_for("hs_twin").names == ("x", "y")
        assert got["b"].binder_for("hs_twin").names == ("u", "v")
        assert got["a"].binder_for("mindspore").names == ("input", "other", "*args")
    finally:
        unregister_platform("hs_twin")


# ---------------------------------------------------------------------- unknown keys
@pytest.mark.parametrize(
    "text, fragments",
    [
        (
            "a: {rule: pointwise, jaxx: [jax.numpy.add]}\n",
            ["entry 'a'", "field 'jaxx'", "unknown parameter", "registered platforms are torch, "
             "mindspore", "bindings: {jaxx: [...]}"],
        ),
        ("a: {rule: pointwise, troch: [torch.add]}\n", ["field 'troch'", "did you mean 'torch'"]),
        (
            "a: {rule: pointwise, torch: [torch.add], bindings: {torch: [Tensor.add]}}\n",
            ["entry 'a'", "platform 'torch' is bound twice"],
        ),
        (
            "a: {rule: pointwise, mindspore_signature: [x], signatures: {mindspore: [y]}}\n",
            ["entry 'a'", "'mindspore_signature' and 'signatures: {mindspore: ...}'"],
        ),
        ("a: {rule: pointwise, bindings: {'a b': [x]}}\n", ["field 'bindings'", "'a b'"]),
        ("a: {rule: pointwise, bindings: [torch.add]}\n", ["field 'bindings'", "mapping"]),
        (
            "a: {rule: pointwise, jaxx_signature: [x]}\n",
            ["field 'jaxx_signature'", "unknown parameter"],
        ),
    ],
    ids=["unregistered_short_form", "typo", "both_forms", "both_signatures", "bad_key",
         "bindings_not_mapping", "unregistered_signature"],
)  # fmt: skip
def test_unknown_platform_key_errors(tmp_path, text, fragments):
    f = tmp_path / "ops.yaml"
    f.write_text(text)
    with pytest.raises(OpSpecError) as info:
        load_file(f)
    msg = str(info.value)
    assert msg.startswith(str(f)), msg
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg}"


def test_an_uninstalled_platform_under_bindings_is_kept_and_reported(tmp_path, capsys):
    (tmp_path / "ops.yaml").write_text(
        "my_relu:\n  rule: pointwise\n  bindings: {torch: [math.hypot], jax: [jax.nn.relu]}\n"
    )
    reg = Registry(load_all([tmp_path]))
    assert reg["my_relu"].bindings == {
        "torch": ["math.hypot"],
        "jax": ["jax.nn.relu"],
    }
    assert {k: [e.name for e in es] for k, es in reg.unregistered_keys().items()} == {
        "jax": ["my_relu"]
    }
    with pytest.raises(ValueError, match="unknown platform 'jax'.*registered platforms"):
        reg.names("jax")
    assert cli_main(["validate", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1 torch names bound" in out
    assert "no installed platform has key 'jax'" in out and "my_relu" in out


# ---------------------------------------------------------------------- registration
def test_register_platform_checks_the_key():
    for bad in ("Torch", "rule", "bindings", "x_signature", "", "1x", "json", "copy"):
        with pytest.raises(ValueError):
            register_platform(PlatformBindings(key=bad, resolve=str, build_table=dict))
    with pytest.raises(ValueError, match="already registered"):
        register_platform(PlatformBindings(key="torch", resolve=str, build_table=dict))
    with pytest.raises(TypeError):
        register_platform("torch")  # type: ignore[arg-type]


_PLATFORM_MODULE = """
from hyper_shard.registry.platforms import PlatformBindings, resolve_all

OPS = {"fk.add": "ADD", "fk.mul": "MUL"}


def resolve(name):
    if name not in OPS:
        raise LookupError(f"{name!r}: the fake framework has no such op")
    return OPS[name]


def build(reg):
    return {obj: e.op for e, n, obj in resolve_all(reg, "KEY")}


BINDINGS = PlatformBindings(key="KEY", resolve=resolve, build_table=build,
                            names_hint="fake op names, e.g. [fk.add]")
"""


@pytest.fixture
def installed_package(tmp_path):
    """A fake installed distribution on sys.path whose entry point (group
    hyper_shard.platforms) declares a platform; removed afterwards."""
    key = f"hs_ep_{uuid.uuid4().hex[:6]}"
    mod = f"hs_test_plat_{key}"
    site = tmp_path / "site"
    dist = site / f"{mod}-0.1.dist-info"
    dist.mkdir(parents=True)
    (site / f"{mod}.py").write_text(_PLATFORM_MODULE.replace("KEY", key))
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {mod}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{P.PLATFORMS_EP_GROUP}]\n{key} = {mod}:BINDINGS\n")
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    try:
        yield key, mod, site
    finally:
        sys.path.remove(str(site))
        importlib.invalidate_caches()
        unregister_platform(key)
        sys.modules.pop(mod, None)
        discover_platforms(refresh=True)


def test_a_platform_from_an_entry_point(installed_package, tmp_path):
    key, mod, _ = installed_package
    assert key not in platform_keys()
    discover_platforms(refresh=True)  # as on the first query of a new process
    assert key in platform_keys()
    assert P.platform_bindings(key) is sys.modules[mod].BINDINGS
    (tmp_path / "ops.yaml").write_text(
        f"mul: {{extend: true, {key}: [fk.mul]}}\nmy_add: {{rule: pointwise, {key}: fk.add}}\n"
    )
    reg = Registry(load_all([tmp_path]))
    assert reg.names(key) == {"fk.mul": reg["mul"], "fk.add": reg["my_add"]}
    assert reg["mul"].bindings["torch"][0] == "torch.mul"  # the built-in names stay
    table = reg.binding(key, P.platform_bindings(key).load("build_table"))
    assert table == {"MUL": reg["mul"].op, "ADD": reg["my_add"].op}
    (tmp_path / "ops.yaml").write_text(f"my_add: {{rule: pointwise, {key}: [fk.sub]}}\n")
    with pytest.raises(OpSpecError, match=rf"ops.yaml: entry 'my_add', field '{key}'.*fk.sub"):
        list(resolve_all(Registry(load_all([tmp_path])), key))
    (tmp_path / "ops.yaml").write_text(f"my_add: {{rule: pointwise, {key}: 5}}\n")
    with pytest.raises(OpSpecError, match=r"field '.*': .*expected fake op names"):
        load_all([tmp_path])


def test_a_broken_platform_entry_point(installed_package):
    key, mod, site = installed_package
    (site / f"{mod}.py").write_text("raise ImportError('no fake framework here')\n")
    with pytest.raises(OpSpecError) as info:
        discover_platforms(refresh=True)
    msg = str(info.value)
    assert f"entry point {key!r}" in msg and P.PLATFORMS_EP_GROUP in msg
    assert "no fake framework here" in msg and "uninstall" in msg


# ---------------------------------------------------------------------- extend: true
def test_extend_adds_names_and_signatures(tmp_path):
    (tmp_path / "a.yaml").write_text(
        "relu: {extend: true, mindspore: [ReLU6Fake]}\n"
        "sum: {extend: true, signatures: {mindspore: [input, axis, keep_dims]}}\n"
    )
    (tmp_path / "b.yaml").write_text(
        "relu: {rule: pointwise, override: true, torch: [torch.relu]}\n"
    )
    reg = Registry(load_all([tmp_path]))
    assert reg["relu"].file.endswith("b.yaml")  # the override is the entry extended
    assert reg["relu"].bindings == {"torch": ["torch.relu"], "mindspore": ["ReLU6Fake"]}
    assert reg["relu"].file_of("mindspore", "ReLU6Fake").endswith("a.yaml")
    assert reg["sum"].op.binder_for("mindspore").names == ("input", "axis", "keep_dims")
    assert reg["sum"].op.binder_for("torch").names == ("input", "dim", "keepdim")


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("relux: {extend: true, torch: [torch.foo]}\n", ["entry 'relux'", "field 'extend'", "did you mean 'relu'"]),
        ("relu: {extend: true, rule: pointwise}\n", ["entry 'relu'", "'extend: true'", "no 'rule'"]),
        ("relu: {extend: true, partial: linear}\n", ["entry 'relu'", "field 'partial'"]),
        ("relu: {extend: true, signature: [x]}\n", ["entry 'relu'", "field 'signature'"]),
        ("relu: {extend: true, mindspore: [AddExt]}\n", ["entry 'relu'", "'AddExt' is already bound by entry 'add'"]),
    ],
    ids=["no_such_entry", "with_rule", "with_parameter", "with_signature", "taken_name"],
)  # fmt: skip
def test_extend_errors(tmp_path, text, fragments):
    (tmp_path / "ext.yaml").write_text(text)
    with pytest.raises(OpSpecError) as info:
        load_all([tmp_path])
    msg = str(info.value)
    assert str(tmp_path / "ext.yaml") in msg, msg
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg}"


def test_platform_dirs_must_exist():
    bad = PlatformBindings(key="hs_nodir", resolve=str, build_table=dict, op_specs=("/nope/x",))
    register_platform(bad)
    try:
        with pytest.raises(OpSpecError, match="platform 'hs_nodir'.*'/nope/x'"):
            L.platform_dirs()
    finally:
        unregister_platform("hs_nodir")


# ---------------------------------------------------------------------- no framework names
#: modules other engineers move out of the neutral core (issue 26): fsdp/ and the
#: parallel/ module adapters; drop them here as they land
_FRAMEWORKS = ("torch", "mindspore")
_PLATFORM_PATH = re.compile(r"\bplatform\.(torch|mindspore)\b")


def _framework_names_in_code(path: Path, label: str) -> list[str]:
    """Framework names in ``path``'s code (docstrings and comments are documentation):
    a string literal that is a framework's name or a platform module path, an import of a
    framework or of a platform package, a name or attribute spelled as a framework."""
    tree = ast.parse(path.read_text())
    docs = {
        id(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
    }
    found = []
    for n in ast.walk(tree):
        what = None
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            if n.value in _FRAMEWORKS or _PLATFORM_PATH.search(n.value):
                what = repr(n.value)
        elif isinstance(n, ast.Import):
            what = next((a.name for a in n.names if a.name.split(".")[0] in _FRAMEWORKS), None)
        elif isinstance(n, ast.ImportFrom):
            mod = n.module or ""
            if n.level == 0 and mod.split(".")[0] in _FRAMEWORKS:
                what = f"from {mod}"
            elif _PLATFORM_PATH.search(mod) or (
                mod == "platform" and any(a.name in _FRAMEWORKS for a in n.names)
            ):
                what = f"from {'.' * n.level}{mod}"
        elif isinstance(n, ast.Attribute) and n.attr in _FRAMEWORKS:
            what = f".{n.attr}"
        elif isinstance(n, ast.Name) and n.id in _FRAMEWORKS:
            what = n.id
        if what is not None:
            found.append(f"{label}:{n.lineno}: {what}")
    return found


def test_no_framework_names_outside_the_platforms():
    pkg = ROOT / "hyper_shard"
    found = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).as_posix()
        if rel.startswith("platform/"):
            continue
        found += _framework_names_in_code(path, f"hyper_shard/{rel}")
    assert not found, "framework names in the neutral core:\n" + "\n".join(found)


def test_the_check_sees_framework_names(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        '"""torch in a docstring is fine."""\n'
        "import torch  # a framework import\n"
        "from ..platform.mindspore import dispatch\n"
        "if platform == 'mindspore':\n"
        "    x = e.torch\n"
        "m = importlib.import_module('hyper_shard.platform.torch.checkpoint')\n"
    )
    found = _framework_names_in_code(bad, "bad.py")
    assert [f.split(": ", 1)[1] for f in found] == [
        "torch",
        "from ..platform.mindspore",
        "'mindspore'",
        ".torch",
        "'hyper_shard.platform.torch.checkpoint'",
    ]
