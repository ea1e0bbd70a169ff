"""Platforms as data: what a platform declares so the neutral core can bind to it.

The neutral core (registry, dispatch, rules, random, checkpoint, the CLI) holds no
framework's name. Each platform registers one :class:`PlatformBindings`: its key (the
YAML key of its op names and ``Platform.name``), how a YAML name becomes the object its
dispatcher looks up (the *resolver*), where its per-entry signature override comes from,
the function building its binding table, and the optional features it binds (its
generator for :mod:`hyper_shard.random`, its checkpoint adapter...). References to
platform code are ``"module:attr"`` strings (loaded on first use, so declaring a platform
imports no framework) or the objects themselves.

Two ways to register:

* :func:`register_platform` (the built-in torch and MindSpore platforms are registered so
  by :mod:`hyper_shard.platform` when hyper_shard is imported);
* an installed package's entry point in group ``hyper_shard.platforms`` (read on the first
  query), loading to a ``PlatformBindings``, a list of them, or a callable returning
  either::

      [project.entry-points."hyper_shard.platforms"]
      jax = "hs_jax.bindings:BINDINGS"

Nothing here imports a platform.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import OpSpecError

__all__ = [
    "PlatformBindings",
    "register_platform",
    "unregister_platform",
    "registered_platforms",
    "platform_keys",
    "platform_bindings",
    "discover_platforms",
    "platform_key_of",
    "resolve_all",
    "signature_keys",
    "PLATFORMS_EP_GROUP",
    "SIGNATURE_SUFFIX",
    "RESERVED_KEYS",
]

PLATFORMS_EP_GROUP = "hyper_shard.platforms"
#: ``<key>_signature`` is the short form of ``signatures: {<key>: [...]}``
SIGNATURE_SUFFIX = "_signature"
#: YAML entry fields a platform key may not take (they mean something else)
RESERVED_KEYS = frozenset(
    {
        "rule", "class", "class_", "bindings", "signatures", "signature", "static_args",
        "override", "doc", "extend", "distributed_op_class", "distributed_op_file",
        "distributed_op_module", "dist_op_name", "infer_layout_suffix", "template_name",
    }
)  # fmt: skip
_KEY_RE = re.compile(r"^[a-z][a-z0-9_]*$")

#: a reference to platform code: ``"module:attr"`` (imported on first use) or the object
Ref = Any


def _load_ref(ref: Ref) -> Any:
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True, eq=False)
class PlatformBindings:
    """Everything the neutral core knows about a platform before loading it.

    Required:

    Attributes:
        key: the platform's key: its YAML key (``torch: [torch.add]``,
            ``bindings: {torch: [...]}``) and its ``Platform.name``. Lower-case letters,
            digits and ``_``; not an entry field (``rule``, ``doc``...).
        resolve: the op-name resolver, ``resolve(name) -> object``: a YAML name
            (``torch.add``, ``Tensor.add_``, ``AddExt``) to the object the platform's
            dispatcher looks up (a function, a Primitive name). Raises ``LookupError``
            with the reason for a name the framework does not have.
        build_table: ``build_table(registry) -> table``: the platform's binding table
            (what its dispatcher looks ops up in), built from
            ``registry.names(key)``; usually with :func:`resolve_all`. Raises
            :class:`~hyper_shard.errors.OpSpecError` naming file, entry and field.

    Optional (the defaults declare nothing):

    Attributes:
        signature_source: the ``signatures:`` keys (``<key>_signature`` in the short
            form) whose canonical positional names this platform's calls follow, tried
            in order before the entry's ``signature`` (default: its own key). A platform
            whose ops take another platform's argument order lists that key after its own.
        platform: the :class:`~hyper_shard.platform.base.Platform` factory
            (``get_platform(key)`` calls it once).
        names_hint: what a name list of this platform looks like (for error messages).
        seed_names: ``seed_names(op_name) -> names``: the names a hyper-parallel
            seed-format entry (keyed by its op's name) binds on this platform; None:
            none.
        modules: module names (and prefixes: ``torch`` covers ``torch.nn``) whose
            objects (tensors, meshes, ops) belong to this framework.
        tensor_type: ``"module:Class"`` of the framework's tensor, checked with
            ``isinstance`` once its module is imported.
        device_types: device type names that choose this platform
            (``init_device_mesh("sim", ...)``).
        op_specs: directories of YAML op specs the platform ships (read after the
            built-in ones: typically entries with ``extend: true`` binding this
            platform's names to the built-in entries).
        generator: the generator state :mod:`hyper_shard.random` seeds and syncs: an
            object with ``manual_seed(seed)`` and, when ``rng_state``, ``get_state()``
            (a tensor of this platform) and ``set_state(state)``.
        rng_state: whether ``generator`` exposes its state (``rng_synced``,
            ``sync_rng_state``).
        checkpoint: the module implementing ``save``/``load``/``async_save`` of
            :mod:`hyper_shard.checkpoint` for this framework.
        checkpoint_exports: names :mod:`hyper_shard.checkpoint` re-exports from this
            platform, ``name -> "module:attr"``.
        context_parallel: ``"module:attr"`` of the platform's ``context_parallel``
            (:func:`hyper_shard.experimental.context_parallel`).
        dtype: ``dtype(name) -> dtype``: the framework's dtype named ``"float32"``...
            (for ``hyper-shard explain``); raises ``AttributeError`` for an unknown name.
        preload: a module imported when hyper_shard is imported after the framework
            (e.g. the allowlist ``torch.load`` needs for DTensors).
    """

    key: str
    resolve: Ref
    build_table: Ref
    signature_source: tuple[str, ...] = ()
    platform: Ref = None
    names_hint: str = "a list of the platform's op names"
    seed_names: Callable[[str], list[str]] | None = None
    modules: tuple[str, ...] = ()
    tensor_type: str | None = None
    device_types: tuple[str, ...] = ()
    op_specs: tuple[str, ...] = ()
    generator: Ref = None
    rng_state: bool = False
    checkpoint: str | None = None
    checkpoint_exports: Mapping[str, str] = field(default_factory=dict)
    context_parallel: Ref = None
    dtype: Ref = None
    preload: str | None = None

    def load(self, what: str) -> Any:
        """The object a reference field names (``"build_table"``, ``"generator"``...),
        imported on first use; None for an unset field.

        Raises:
            ImportError: the platform's module cannot be imported (its framework is not
                installed).
        """
        ref = getattr(self, what)
        return None if ref is None else _load_ref(ref)

    @property
    def signature_keys(self) -> tuple[str, ...]:
        return self.signature_source or (self.key,)

    def imported(self) -> bool:
        """Whether the framework is imported in this process."""
        return any(m in sys.modules for m in self.modules)

    def available(self) -> bool:
        """Whether the framework can be imported here (installed)."""
        if not self.modules or self.imported():
            return True
        try:
            return importlib.util.find_spec(self.modules[0]) is not None
        except (ImportError, ValueError):
            return False

    def in_use(self) -> bool:
        """Whether the platform's binding table is in use: its builder is an object
        (registered in this process) or its module is imported."""
        ref = self.build_table
        return not isinstance(ref, str) or ref.partition(":")[0] in sys.modules

    def owns(self, obj: Any) -> bool:
        """Whether ``obj`` (a tensor, a mesh, an op) is one of this framework's objects."""
        mod = getattr(type(obj), "__module__", "") or ""
        if any(mod == m or mod.startswith(m + ".") for m in self.modules):
            return True
        if self.tensor_type is not None:
            module, _, cls = self.tensor_type.partition(":")
            m = sys.modules.get(module)
            t = getattr(m, cls, None) if m is not None else None
            return isinstance(t, type) and isinstance(obj, t)
        return False


_PLATFORMS: dict[str, PlatformBindings] = {}
_DISCOVERED: list[bool] = [False]


def _check(b: PlatformBindings) -> None:
    if not isinstance(b, PlatformBindings):
        raise TypeError(f"register_platform: expected a PlatformBindings, got {type(b).__name__}")
    if not isinstance(b.key, str) or not _KEY_RE.match(b.key):
        raise ValueError(
            f"register_platform: key {b.key!r} must be lower-case letters, digits and '_', "
            f"starting with a letter (it is a YAML key: 'mykey: [op names]')"
        )
    from .models import OpEntry  # the entry model: its field names and methods

    if b.key in RESERVED_KEYS or b.key.endswith(SIGNATURE_SUFFIX) or hasattr(OpEntry, b.key):
        raise ValueError(
            f"register_platform: key {b.key!r} is an op-spec entry field (or ends in "
            f"{SIGNATURE_SUFFIX!r}); choose another key"
        )


def register_platform(bindings: PlatformBindings, *, replace: bool = False) -> PlatformBindings:
    """Register a platform's bindings (see :class:`PlatformBindings`).

    Register before the registry is first built (the first op on a DTensor), or call
    :func:`hyper_shard.registry.reload` after, so the platform's ``op_specs`` are read
    and its short-form YAML key is known.

    Args:
        bindings: the declaration.
        replace: replace a platform registered under the same key (else an error).

    Returns:
        ``bindings``.

    Raises:
        ValueError: a malformed key, or one already registered by another declaration
            (without ``replace``).
        TypeError: not a PlatformBindings.
    """
    _check(bindings)
    old = _PLATFORMS.get(bindings.key)
    if old is not None and old is not bindings and not replace:
        raise ValueError(
            f"register_platform: platform {bindings.key!r} is already registered (its "
            f"resolver: {old.resolve!r}); pass replace=True to replace it"
        )
    _PLATFORMS[bindings.key] = bindings
    return bindings


def unregister_platform(key: str) -> None:
    """Forget the platform registered under ``key`` (nothing happens if there is none)."""
    _PLATFORMS.pop(key, None)


def discover_platforms(refresh: bool = False) -> None:
    """Register the platforms installed packages declare (entry-point group
    ``hyper_shard.platforms``); done once, on the first query, or again with ``refresh``.

    Raises:
        OpSpecError: an entry point that fails to load or gives no PlatformBindings, or
            one whose key another declaration has (the message names the entry point).
    """
    if _DISCOVERED[0] and not refresh:
        return
    _DISCOVERED[0] = True
    for ep in importlib.metadata.entry_points(group=PLATFORMS_EP_GROUP):
        where = f"entry point {ep.name!r} = {ep.value!r} (group {PLATFORMS_EP_GROUP!r})"
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, (type, PlatformBindings)):
                obj = obj()
            items = list(obj) if isinstance(obj, (list, tuple)) else [obj]
            for b in items:
                old = _PLATFORMS.get(getattr(b, "key", None))  # type: ignore[arg-type]
                if (
                    old is not None
                    and old is not b
                    and (old.resolve, old.build_table)
                    == (
                        getattr(b, "resolve", None),
                        getattr(b, "build_table", None),
                    )
                ):
                    continue  # the same declaration, registered twice
                register_platform(b)
        except Exception as e:
            _DISCOVERED[0] = False  # try again next time
            raise OpSpecError(
                f"{where}: registering the platform failed: {type(e).__name__}: {e}; fix or "
                f"uninstall the package that declares it"
            ) from None


def registered_platforms() -> list[PlatformBindings]:
    """Every registered platform, in registration order (the built-ins first)."""
    discover_platforms()
    return list(_PLATFORMS.values())


def platform_keys() -> frozenset[str]:
    """The keys of every registered platform."""
    discover_platforms()
    return frozenset(_PLATFORMS)


def platform_bindings(key: str) -> PlatformBindings:
    """The declaration registered under ``key``.

    Raises:
        KeyError: no platform has that key (the message lists the registered ones).
    """
    discover_platforms()
    b = _PLATFORMS.get(key)
    if b is None:
        raise KeyError(
            f"no platform is registered under {key!r} (registered: {', '.join(_PLATFORMS)}); "
            f"install its package (entry-point group {PLATFORMS_EP_GROUP!r}) or call "
            f"hyper_shard.platform.register_platform"
        )
    return b


def platform_key_of(obj: Any) -> str | None:
    """The key of the platform whose object ``obj`` is (a tensor, a mesh, an op), or None."""
    for b in registered_platforms():
        if b.owns(obj):
            return b.key
    return None


def signature_keys(key: str) -> tuple[str, ...]:
    """Where ``key``'s signature override comes from (its declared
    ``signature_source``; just ``key`` for a platform not registered)."""
    b = _PLATFORMS.get(key)
    return (key,) if b is None else b.signature_keys


def resolve_all(
    registry: Any, key: str, resolve: Callable[[str], Any] | None = None
) -> Iterator[tuple[Any, str, Any]]:
    """``(entry, name, object)`` for every name the registry binds on platform ``key``,
    the object from the platform's resolver (or ``resolve``). A name that does not
    resolve raises, unless its entry's op takes names leniently (hyper-parallel's YAML
    spans framework versions): it is skipped.

    Raises:
        OpSpecError: a name the resolver refuses (names the file, the entry, the field
            and the resolver's reason).
    """
    fn = resolve if resolve is not None else platform_bindings(key).load("resolve")
    for e in registry.entries.values():
        for n in e.bindings.get(key, ()):
            try:
                obj = fn(n)
            except LookupError as err:
                if getattr(e.op, "lenient_names", False):
                    continue
                where = e.file_of(key, n)  # an extend: true entry's own file for its names
                raise OpSpecError(f"{where}: entry {e.name!r}, field {key!r}: {err}") from None
            yield e, n, obj
