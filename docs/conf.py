"""Sphinx configuration of salt-virt's documentation (MyST markdown, furo), as Salt extensions build theirs.

Built by the test suite with warnings as errors (tests/unit/test_docs.py):
    /var/cache/salt-virt/venv/bin/sphinx-build -W -b html docs /tmp/salt-virt-docs
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "salt-virt"
author = "salt-virt contributors"
copyright = "salt-virt contributors"

extensions = ["myst_parser", "saltref"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]
# `# Title` .. `###` get anchors, so a page links to another's section: [text](images.md#cloud-init-and-minion-install)
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

html_theme = "furo"
html_title = "salt-virt"
# the build must not reach the network (offline machines, CI)
intersphinx_mapping: dict = {}
