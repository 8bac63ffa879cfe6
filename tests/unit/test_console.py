"""The web console's static files (console/, docs/topics/console.md): what a browser test cannot see at a
glance. Data reaches the page as text only, the page loads nothing inline or from elsewhere, every request
leaves cookies out (salt-api allows every origin's credentialed requests)."""

import re

from tests.support.paths import ROOT

CONSOLE = ROOT / "console"


def test_data_is_never_rendered_as_markup():
    js = "".join(p.read_text() for p in [CONSOLE / "console.js", CONSOLE / "vnc.js", *CONSOLE.glob("vendor/**/*.js")])
    for sink in (
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "new Function",
        'setTimeout("',
    ):
        assert sink not in js, sink


def test_every_request_leaves_cookies_out():
    js = (CONSOLE / "console.js").read_text()
    assert js.count("fetch(") == 1  # the one request helper
    assert 'credentials: "omit"' in js.split("fetch(", 1)[1].split("});", 1)[0]
    assert "document.cookie" not in js and "localStorage" not in js  # the token: sessionStorage only


VIEWS = ("jobs.js", "create.js", "vm.js")  # the create form, the jobs list, one VM's page and the live updates


def test_the_views_render_text_and_send_through_console_js_only():
    """The views' scripts render with textContent (el()) and call salt-api through console.js's post() only
    (its credentials: "omit"): no request, storage or event stream of their own (never salt-api's /events,
    which streams every tenant's jobs to any token: docs/topics/console.md)."""
    for name in VIEWS:
        js = (CONSOLE / name).read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in js, (name, sink)
        for own in ("fetch(", "XMLHttpRequest", "EventSource", "WebSocket", "/events", "Storage", "document.cookie"):
            assert own not in js, (name, own)
        assert "password" not in js.lower(), name
        assert f'<script src="/console-static/{name}" defer></script>' in (CONSOLE / "index.html").read_text()


def test_long_work_is_a_runner_async_job_followed_with_virt_job():
    """Create, snapshot, backup and restore go through runAsync (jobs.js: runner_async, then virt.job, the
    runner that answers only the caller's own job); lifecycle actions and lists are runner calls."""
    jobs = (CONSOLE / "jobs.js").read_text()
    assert 'client: "runner_async"' in jobs and 'runner("virt.job"' in jobs
    vm = (CONSOLE / "vm.js").read_text()
    create = (CONSOLE / "create.js").read_text()
    assert 'runAsync("virt.init"' in create
    for fun in ("virt.snapshot", "virt.backup", "virt.restore"):
        assert f'longAct("{fun}"' in vm, fun


def test_the_page_has_a_strict_csp_and_nothing_inline():
    html = (CONSOLE / "index.html").read_text()
    (csp,) = re.findall(r'http-equiv="Content-Security-Policy"\s+content="([^"]+)"', html)
    rules = dict(r.strip().split(" ", 1) for r in csp.split(";"))
    assert rules["default-src"] == "'none'" and rules["script-src"] == "'self'" and rules["style-src"] == "'self'"
    assert rules["connect-src"] == "'self' wss: ws:"  # salt-api, and the VM consoles' websockets (vnc.js)
    assert "unsafe" not in csp
    assert re.findall(r"<script(?![^>]*\bsrc=)", html) == [] and "<style" not in html and " style=" not in html
    assert re.findall(r"\son\w+=", html) == []  # no inline event handlers
    # what it loads is in console/, under the static_path docs/topics/console.md configures
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert assets and all(
        a.startswith("/console-static/") and (CONSOLE / a.rsplit("/", 1)[1]).is_file() for a in assets
    )
    docs = (ROOT / "docs" / "topics" / "console.md").read_text()
    assert "app_path: /console\n" in docs and "static_path: /console-static\n" in docs


def test_the_vnc_client_is_vendored_whole_with_its_licence_and_keeps_no_secret():
    """vnc.js imports noVNC's RFB from console/vendor/novnc; every module that imports is there (no build step),
    the MPL-2.0 text and Debian's copyright file with it. The ticket's key pair cannot be exported and the
    password is neither stored nor sent anywhere but to noVNC."""
    vendor = CONSOLE / "vendor" / "novnc"
    assert (vendor / "LICENSE.MPL-2.0").read_text().startswith("Mozilla Public License Version 2.0")
    assert "License: MPL-2.0" in (vendor / "COPYRIGHT").read_text()
    todo, seen = [CONSOLE / "vnc.js"], set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        assert path.is_file(), path
        for dep in re.findall(r"""(?:import|export)[^'"]*?from\s+['"]([^'"]+)['"]""", path.read_text()):
            todo.append((path.parent / dep).resolve())
    assert vendor / "core" / "rfb.js" in seen
    assert sorted(p for p in vendor.rglob("*.js")) == sorted(p for p in seen if p.is_relative_to(vendor))
    js = (CONSOLE / "vnc.js").read_text()
    assert "fetch(" not in js and "Storage" not in js and "document.cookie" not in js
    assert re.search(r"generateKey\(\s*\{[^}]*RSA-OAEP[^}]*\},\s*false,", js)  # not extractable
    html = (CONSOLE / "index.html").read_text()
    assert '<script src="/console-static/vnc.js" type="module"></script>' in html
