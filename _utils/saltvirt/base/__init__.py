"""Helpers that every other layer uses, importing nothing else from saltvirt (layer 1 of 9, both sides).

Validation of names, paths, booleans and integer ranges (``validate``), atomic writes and digests
(``fsutil``), running a host tool with a timeout (``tools``), undoing what an operation made (``undo``),
how salt-virt is installed (``install``: the pip hint, saltext-virt installed beside it), its metrics
(``metrics``: recorded through Salt's metrics layer), the operator's ``virt:`` configuration (``config``) and its
switches (``switches``: minion config only).
May import: the standard library and Salt only.
"""
