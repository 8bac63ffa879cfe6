"""The documentation site (docs/: Sphinx + MyST, as Salt extensions build theirs) builds with warnings as errors,
every user guide page is in it, and README's links into docs/ lead somewhere."""

import re
import subprocess
import sys

from tests.support.paths import ROOT

DOCS = ROOT / "docs"


def test_docs_build_without_warnings(tmp_path):
    """A broken link, a page outside every toctree, a bad docstring in a loader module: each is a warning."""
    out = tmp_path / "html"
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-d", str(tmp_path / "doctrees")]
        + [str(DOCS), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, f"sphinx-build -W docs failed:\n{proc.stdout}\n{proc.stderr}"
    # the glob toctree picked up every topic page, and the reference was generated from the loader modules
    for page in sorted((DOCS / "topics").glob("*.md")):
        assert (out / "topics" / f"{page.stem}.html").exists(), page
    runners = (out / "reference" / "runners.html").read_text()
    assert 'id="salt.runners.virt.init"' in runners
    assert 'id="salt.modules.virt.init"' in (out / "reference" / "modules.html").read_text()


def test_readme_links_into_docs_exist():
    links = re.findall(r"\]\((docs/[^)#\s]+)", (ROOT / "README.md").read_text())
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README.md links to missing docs pages: {missing}"


def test_topic_pages_have_a_title():
    untitled = [p.name for p in (DOCS / "topics").glob("*.md") if not p.read_text().startswith("# ")]
    assert not untitled, f"docs/topics/<topic>.md starts with '# Title' (MyST): {untitled}"


def test_every_loader_module_is_in_the_reference():
    """A loader module added without its ``.. saltref::`` line has no reference page (the virt_ha and virt_balance
    engines and the virt_vm resource type had none)."""
    rst = "".join(p.read_text() for p in DOCS.glob("reference/*.rst"))
    listed = set(re.findall(r"^\.\. saltref:: (\S+) (\S+)", rst, re.M))
    kinds = ["_modules", "_states", "_runners", "_pillar", "_engines", "_grains", "_output"]
    kinds += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "_resources").rglob("*") if p.is_dir())
    missing = []
    for kind in kinds:
        for path in sorted((ROOT / kind).glob("*.py")):
            found = re.search(r'^__virtualname__ = "(\w+)"', path.read_text(), re.M)
            name = found.group(1) if found else path.stem  # as docs/_ext/saltref.py and Salt's loader name it
            if (kind, name) not in listed:
                missing.append(f"{path.relative_to(ROOT)} ({name})")
    assert not missing, f"loader modules with no '.. saltref:: <folder> <name> <id>' in docs/reference: {missing}"
