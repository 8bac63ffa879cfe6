"""What the argument tables' coverage tests (tests/unit/model/test_netargs.py, test_poolargs.py) share."""

import inspect


def signature_mismatches(func, names, defaults, var_keyword):
    """How ``func``'s signature differs from a table's ``names`` (in order), ``defaults`` and whether it takes
    ``**kwargs`` (``var_keyword``): one line each, none when they agree."""
    params = list(inspect.signature(func).parameters.values())
    has_var = bool(params) and params[-1].kind is inspect.Parameter.VAR_KEYWORD
    params = [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]
    out = [] if has_var == var_keyword else [f"**kwargs: {has_var}, the table says {var_keyword}"]
    if [p.name for p in params] != list(names):
        out.append(f"names: signature {[p.name for p in params]} != table {list(names)}")
    out += [
        f"{p.name}: default {p.default!r} in the signature, {defaults[p.name]!r} in the table"
        for p in params
        if p.name in defaults and p.default != defaults[p.name]
    ]
    return out
