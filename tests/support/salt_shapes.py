"""Salt's documented return shapes of its virt query functions, and a checker.

The table is written from Salt's documented API as saltext-virt 0.1.0 ships it (``bench/setup-saltext.sh``
puts it on disk): the docstrings' return examples (``vm_info``) and the dicts each documented function
returns (``_get_disks``, ``_get_nics``, ``_get_graphics``, ``_node_info``, ``pool_info``, ``network_info``,
``volume_infos``, ``_parse_snapshot_description``). :func:`documented_examples` reads the docstring
examples back from that install, so a test can hold the table to them.

Schema forms: a type or a tuple of alternatives (types or schemas); ``{"*": s}``: a mapping whose every
value matches ``s``; any other dict: those keys (a key ending in ``?`` may be absent, never a wrong type),
other keys allowed (salt-virt may add keys, never change a type); ``[s]``: a list of ``s``.
"""

import ast
import pathlib
import re

NONE = type(None)
STR_MAP = {"*": str}  # a mapping of XML attributes, as Salt's
NIC = {
    "type": str,
    "mac": str,
    "model?": str,
    "target?": str,
    "source?": STR_MAP,
    "driver?": STR_MAP,
    "address?": STR_MAP,
    "virtualport?": STR_MAP,
}
DISK = {
    "file": str,
    "type": str,
    "file format?": str,
    "virtual size?": int,
    "disk size?": int,
    "backing file?": (dict, str),
    "cluster size?": (int, NONE),
    "snapshots?": [dict],
}
GRAPHICS = {"autoport": str, "keymap": str, "listen": str, "port": str, "type": str}
VM = {
    "cpu": int,
    "cputime": int,
    "disks": {"*": DISK},
    "graphics": GRAPHICS,
    "nics": {"*": NIC},
    "uuid": str,
    "loader": {"path": str},
    "on_crash": str,
    "on_reboot": str,
    "on_poweroff": str,
    "maxMem": int,
    "mem": int,
    "state": str,
}
NODE = {
    "cpucores": int,
    "cpumhz": int,
    "cpumodel": str,
    "cpus": int,
    "cputhreads": int,
    "numanodes": int,
    "phymemory": int,
    "sockets": int,
}
POOL = {
    "uuid": str,
    "state": str,
    "capacity": int,
    "allocation": int,
    "free": int,
    "autostart": bool,
    "persistent": bool,
    "target_path": (str, NONE),
    "type": str,
}
LEASE = {"type": str, "mac": str, "ipaddr": str, "prefix": int, "iface": str, "expirytime": int}
NETWORK = {"uuid": str, "bridge": (str, NONE), "autostart": bool, "active": bool, "persistent": bool, "leases": [LEASE]}
VOLUME = {
    "type": str,
    "key": str,
    "path": str,
    "capacity": int,
    "allocation": int,
    "used_by": [str],
    "backing_store": (NONE, {"path": str, "format": (str, NONE)}),
    "format": (str, NONE),
}
SNAPSHOT = {"name": str, "created": str, "running": bool, "current": bool}

SHAPES = {
    "vm_info": {"*": VM},
    "full_info": {"freecpu": int, "freemem": int, "node_info": NODE, "vm_info": {"*": VM}},
    "node_info": NODE,
    "get_disks": {"*": DISK},
    "get_nics": {"*": NIC},
    "get_graphics": GRAPHICS,
    "pool_info": {"*": POOL},
    "network_info": {"*": NETWORK},
    "volume_infos": {"*": {"*": VOLUME}},
    "list_snapshots": {"*": ([SNAPSHOT], "N/A")},
}


def check(value, schema, path="ret"):
    """The ways ``value`` differs from ``schema`` (``[]``: it conforms)."""
    if isinstance(schema, tuple):
        tries = [check(value, s, path) for s in schema]
        return [] if any(not t for t in tries) else [f"{path}: {value!r} matches none of {schema!r}"]
    if isinstance(schema, str):  # a literal (Salt's "N/A")
        return [] if value == schema else [f"{path}: {value!r} is not {schema!r}"]
    if isinstance(schema, type):
        ok = isinstance(value, schema) and not (schema is int and isinstance(value, bool))
        return [] if ok else [f"{path}: {type(value).__name__} {value!r}, Salt's type is {schema.__name__}"]
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{path}: {type(value).__name__}, Salt's type is a list"]
        return [e for i, item in enumerate(value) for e in check(item, schema[0], f"{path}[{i}]")]
    if not isinstance(value, dict):
        return [f"{path}: {type(value).__name__} {value!r}, Salt's type is a mapping"]
    if "*" in schema:
        return [e for k, v in value.items() for e in check(v, schema["*"], f"{path}[{k!r}]")]
    errors = []
    for key, sub in schema.items():
        name = key.removesuffix("?")
        if name not in value:
            if not key.endswith("?"):
                errors.append(f"{path}: Salt's key {name!r} is missing")
            continue
        errors += check(value[name], sub, f"{path}[{name!r}]")
    return errors


def assert_conforms(function, value):
    """Fail with every way ``value`` (what ``virt.<function>`` returned) differs from Salt's shape."""
    errors = check(value, SHAPES[function], function)
    assert not errors, "\n".join(errors)


def assert_all_conform(virt, vm_names):
    """Every function of :data:`SHAPES` through ``virt`` (``__salt__``): per VM of ``vm_names`` and host-wide."""
    for name in vm_names:
        for function in ("vm_info", "get_disks", "get_nics", "get_graphics"):
            assert_conforms(function, virt[f"virt.{function}"](name))
    for function in ("vm_info", "full_info", "node_info", "pool_info", "network_info", "volume_infos"):
        assert_conforms(function, virt[f"virt.{function}"]())
    assert_conforms("list_snapshots", virt["virt.list_snapshots"]())


SALTEXT_MODULE = "saltext/virt/modules/virt.py"
PLACEHOLDERS = {"<int>": "0", "<float>": "0.0", "<bool>": "True", "<str>": "''"}


def documented_examples(site_packages):
    """{function: example} for the functions of :data:`SHAPES` whose docstring in saltext-virt shows a
    return example (a ``.. code-block:: python`` block), placeholders (``<int>``, ``'<state>'``) made
    values of their type. ``site_packages``: where saltext-virt is installed."""
    tree = ast.parse(pathlib.Path(site_packages, SALTEXT_MODULE).read_text())
    out = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.name not in SHAPES:
            continue
        doc = ast.get_docstring(node) or ""
        block = re.search(r"\.\. code-block:: python\n\n((?:[ \t]+.*\n|\n)+)", doc + "\n")
        if not block:
            continue
        text = block.group(1)
        for placeholder, value in PLACEHOLDERS.items():
            text = text.replace(placeholder, value)
        text = re.sub(r"'cputime' <int>|'cputime' 0", "'cputime': 0", text)  # the docstring's missing colon
        text = text.replace("...", "").strip()
        if text.startswith("["):  # vm_info's example is written as a list of "name: info" pairs
            text = "{" + text[1:].rstrip().rstrip("]") + "}"
        out[node.name] = ast.literal_eval(text)
    return out
