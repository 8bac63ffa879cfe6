"""A domain definition checked against libvirt's schema once per shape, not at every ``virt.init``.

salt-virt defines domains with libvirt's schema check (``VIR_DOMAIN_DEFINE_VALIDATE``, see
:func:`saltvirt.host.conn.define`): without it libvirt's parser drops what it does not know (an element
or attribute an older libvirt lacks) and the definition silently lacks it. The check is dear: libvirtd
parses its RelaxNG schema for every call, ~4.7 ms of a define-only init that is otherwise ~1.3 ms (bench,
issue #40), most of what separated it from the raw-libvirt floor.

What the check protects against depends on the document's *shape*, not on the values our builders fill
in: the elements, their attributes and the enumeration-like words (``type='bridge'``, ``bus='virtio'``,
``<on_reboot>restart``) that select what else the schema allows. A definition whose shape a local
libvirtd of the same version, driver and URI validated before is defined without asking again; any other
shape (a new device, another disk type, another libvirtd or version) is validated, and remembered once it
passed. Values the schema would refuse that are no part of the shape (numbers, paths, names) are refused by
libvirt's parser itself, which checks every value it reads. The version is asked at each define (one small
RPC: an upgraded libvirtd is a new key); the shapes are kept only where the cache directory is this user's
alone, as :mod:`saltvirt.host.hosttype`'s answer.
"""

import hashlib
import json
import logging
import os
import re
import xml.etree.ElementTree as ET
from typing import Any

from saltvirt.base import fsutil
from saltvirt.base.salttypes import Conn, Domain
from saltvirt.host.conn import define

log = logging.getLogger(__name__)
CACHE_FILE = "domain-shapes.json"  # in the cache directory given (a minion's: <cachedir>/saltvirt)
MAX_SHAPES = 256  # the newest kept: a host defines a few shapes of VM again and again
# a word the schema may choose by (an enumeration value); numbers, paths, addresses, UUIDs and names are not
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_.+-]{0,39}")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
# free text whatever the schema: the VM's name, title and description; <metadata> takes any element
_FREE = frozenset({"domain/name", "domain/title", "domain/description"})
_FREE_ATTRS = frozenset({"passwd"})  # a console password: a word or not, never part of a shape


def _word(value: str) -> str:
    return value if _WORD.fullmatch(value) and not _UUID.fullmatch(value) else "*"


def shape(xml: str) -> str:
    """A digest of the document's shape: every element's path, its attributes by name with their value when it
    is a word, its text when that is a word (see the module docs); ``<metadata>``'s content left out."""
    items: set[str] = set()

    def walk(node: ET.Element, path: str) -> None:
        if path == "domain/metadata":
            items.add(path)
            return
        text = (node.text or "").strip()
        items.add(f"{path}={'*' if path in _FREE else _word(text) if text else ''}")
        for name, value in node.attrib.items():
            items.add(f"{path}@{name}={'*' if name in _FREE_ATTRS else _word(value)}")
        for child in node:
            walk(child, f"{path}/{child.tag}")

    root = ET.fromstring(xml)
    walk(root, root.tag)
    return hashlib.sha256("\n".join(sorted(items)).encode()).hexdigest()


def _load(cache_dir: str) -> dict[str, Any]:
    return fsutil.load_own_json(cache_dir, CACHE_FILE, 0o022)


def _store(cache_dir: str, key: list[Any], shapes: list[str]) -> None:
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        if not fsutil.ours_alone(cache_dir):
            return
        data = json.dumps({"key": key, "shapes": shapes[-MAX_SHAPES:]}).encode()
        fsutil.atomic_write(os.path.join(cache_dir, CACHE_FILE), data, 0o600)  # a cache: no fsync
    except OSError as exc:  # the next init validates again
        log.warning("schemacache: cannot keep the validated shapes in %s: %s", cache_dir, exc)


def define_domain(conn: Conn, xml: str, cache_dir: str | None) -> Domain:
    """Define ``xml`` on ``conn`` (:func:`saltvirt.host.conn.define`), with libvirt's schema check unless a
    definition of the same shape passed it on this libvirtd and version before (``cache_dir``: where that is kept;
    None: always checked). libvirt's errors are raised as they are (callers wrap them)."""
    if not cache_dir:
        return define(conn, "domain", xml)
    key = [conn.getURI(), conn.getLibVersion()]
    digest = shape(xml)
    data = _load(cache_dir)
    kept = data.get("shapes")
    shapes: list[str] = kept if data.get("key") == key and isinstance(kept, list) else []
    if digest in shapes:
        return conn.defineXML(xml)
    dom = define(conn, "domain", xml)
    _store(cache_dir, key, [s for s in shapes if s != digest] + [digest])
    return dom
