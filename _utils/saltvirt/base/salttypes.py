"""Salt's loader dunders and the shapes the library passes around, typed once for the whole library.

The loader modules hand the library what Salt injects into them (``__opts__``, ``__salt__``, ``__grains__``,
``__pillar__``, ``__context__``) or a function made from it (``config.get``); these aliases name them, so a
signature says which one it wants. Type-only: importing this module runs nothing.
"""

from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

SaltOpts: TypeAlias = dict[str, Any]  # __opts__: the minion's or master's configuration
SaltFunctions: TypeAlias = Mapping[str, Callable[..., Any]]  # __salt__ (execution modules), __utils__, __runners__
SaltGrains: TypeAlias = dict[str, Any]  # __grains__
SaltPillar: TypeAlias = dict[str, Any]  # __pillar__
SaltContext: TypeAlias = dict[str, Any]  # __context__: per-process cache of one loader
ConfigGet: TypeAlias = Callable[..., Any]  # config.get-like: get("virt:images", default) -> value
Data: TypeAlias = dict[str, Any]  # a return, an event's data, a parsed spec: Salt's plain dicts
# libvirt handles (virConnect, virDomain, virNetwork, virStoragePool): libvirt-python ships no type information,
# so these name what a signature wants without checking it
Conn: TypeAlias = Any
Domain: TypeAlias = Any
