"""tests/integration/test_tenants.py's lab, read and driven: every VM's owner as libvirt has it, and what its web
console tests do in the browser: log in through the console's form, read its VM table, click its actions, follow its
jobs list, and the VM screen's one-time tickets (docs/topics/console.md). Plain functions over the module's
``cloud`` lab (its ``url``, ``hvs``, ``users``)."""

import base64
import contextlib
import time
import xml.etree.ElementTree as ET

import libvirt

from tests.support import browser

# salt-virt's <metadata> namespace, as ElementTree spells it
META = "{https://github.com/salt-virt/salt-virt/metadata/1}"


def libvirt_vms(cloud):
    """``{vm: {host, tenant, creator, vcpus}}`` read from every hypervisor's libvirtd."""
    out = {}
    for host, hv in cloud["hvs"].items():
        conn = libvirt.open(hv.uri)
        try:
            for dom in conn.listAllDomains(0):
                root = ET.fromstring(dom.XMLDesc(0))
                owner = root.find(f"metadata/{META}vm/{META}owner")
                out[dom.name()] = {
                    "host": host,
                    "tenant": owner.get("tenant") if owner is not None else None,
                    "creator": owner.get("creator") if owner is not None else None,
                    "vcpus": int(root.findtext("vcpu")),
                }
        finally:
            conn.close()
    return out


def console_login(driver, cloud, user, password=None):
    """Open the console, log in through its form; returns once the VM table shows a fresh answer (or the
    login page shows its error)."""
    driver.get(cloud["url"] + "/console")
    form = driver.find_element(browser.ID, "login-form")
    browser.wait(driver, lambda d: form.is_displayed())
    driver.find_element(browser.ID, "username").send_keys(user)
    driver.find_element(browser.ID, "password").send_keys(cloud["users"][user] if password is None else password)
    eauth = driver.find_element(browser.ID, "eauth")
    eauth.clear()
    eauth.send_keys("file")
    driver.find_element(browser.ID, "login-button").click()
    browser.wait(
        driver,
        lambda d: (
            d.find_element(browser.ID, "login-error").text
            or d.find_element(browser.ID, "status").text.startswith("updated")
        ),
        message="neither the VM table nor a login error",
    )


def table(driver):
    """The VM table as the user sees it: ``{name: {tenant, host, state, cpu, mem, ips}}``."""
    rows = driver.execute_script(
        "return [...document.querySelectorAll('#vms tbody tr')].map(tr => "
        "Object.fromEntries([...tr.querySelectorAll('td[data-key]')].map(td => [td.dataset.key, td.textContent])))"
    )
    return {r.pop("name"): r for r in rows}


def click_action(driver, vm, fun):
    status = driver.find_element(browser.ID, "status")
    click(driver, f"#vms tr[data-vm='{vm}'] button[data-action='{fun}']")  # its row may be redrawn meanwhile
    return status


def active(cloud, host, name):
    conn = libvirt.open(cloud["hvs"][host].uri)
    try:
        return bool(conn.lookupByName(name).isActive())
    finally:
        conn.close()


def wait_state(driver, vm, state):
    browser.wait(driver, lambda d: table(d).get(vm, {}).get("state") == state, timeout=300, message=f"{vm} {state}")


def last_job(driver):
    """``(state, text)`` of the newest line of the jobs list, read at once (its text ticks every second)."""
    return tuple(
        driver.execute_script(
            "const li = document.querySelector('#jobs li'); return li ? [li.dataset.state, li.textContent] : [null, '']"
        )
    )


def click(driver, css):
    """Click what ``css`` finds, again if a refresh replaced it between finding and clicking (a row of the list
    is redrawn when its VM changes)."""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(5):
        try:
            return driver.find_element(browser.CSS, css).click()
        except StaleElementReferenceException:
            continue
    return driver.find_element(browser.CSS, css).click()


def snapshots(cloud, host, name):
    conn = libvirt.open(cloud["hvs"][host].uri)
    try:
        return sorted(conn.lookupByName(name).snapshotListNames(0))
    finally:
        conn.close()


def websocket_port(cloud, host, name):
    """The running VM's VNC websocket port, as libvirt gave it."""
    conn = libvirt.open(cloud["hvs"][host].uri)
    try:
        root = ET.fromstring(conn.lookupByName(name).XMLDesc(0))
    finally:
        conn.close()
    return int(root.find("devices/graphics[@type='vnc']").get("websocket"))


def live_password(cloud, host, name):
    """The password QEMU's console has now (libvirt's secure XML: root on the hypervisor only)."""
    conn = libvirt.open(cloud["hvs"][host].uri)
    try:
        root = ET.fromstring(conn.lookupByName(name).XMLDesc(libvirt.VIR_DOMAIN_XML_SECURE))
    finally:
        conn.close()
    return root.find("devices/graphics[@type='vnc']").get("passwd")


def browser_key():
    """A browser's ephemeral key pair as vnc.js makes it: RSA-OAEP 2048, the public half as SPKI base64."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return key, base64.b64encode(der).decode()


def ticket(session, name, key_pair):
    """``(runner answer, the password decrypted)`` of ``salt-run virt.console name`` for this key pair."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    key, pub = key_pair
    ret = session.runner("virt.console", name=name, pubkey=pub)
    assert "error" not in ret, ret
    oaep = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
    return ret, key.decrypt(base64.b64decode(ret["result"]["password"]), oaep).decode()


def spent(cloud, name, password):
    """Wait until the virt_console engine changed the console's password (it does when a client authenticated)."""
    host = libvirt_vms(cloud)[name]["host"]
    deadline = time.monotonic() + 60
    while live_password(cloud, host, name) == password:
        assert time.monotonic() < deadline, f"{name}: the password was not spent after its use"
        time.sleep(0.2)


def needles(secret):
    """``secret`` as it would show in a file: as is, and base64-encoded at each of the three alignments (a signed
    answer's body is base64 of msgpack)."""
    raw = secret.encode()
    out = [raw]
    for pad in range(3):  # the secret's first byte at each place of a 3-byte group
        enc = base64.b64encode(b"\0" * pad + raw)
        first, end = (1 if pad else 0), (pad + len(raw)) // 3  # the groups made of the secret's bytes only
        out.append(enc[4 * first : 4 * end])
    return [n for n in out if len(n) >= 4]


def screen(driver, top=0.0):
    """``(lit, digest)`` of the noVNC canvas below ``top`` (a fraction of its height): how many pixels are light
    (text on the guest's screen) and a digest of them all (the screen changed when it differs)."""
    return driver.execute_script(
        "const c = document.querySelector('#vnc-screen canvas'); if (!c || !c.width) return [0, 0];"
        "const y = Math.floor(c.height * arguments[0]);"
        "const d = c.getContext('2d').getImageData(0, y, c.width, c.height - y).data; let n = 0, h = 0;"
        "for (let i = 0; i < d.length; i += 4) { if (d[i] + d[i + 1] + d[i + 2] > 300) n++; h = (h * 31 + d[i]) | 0; }"
        "return [n, h];",
        top,
    )


def runner_in_tab(driver, fun, **kwarg):
    """The console's own ``runner()`` call from the logged-in tab: its answer, or ``{"error": message}``."""
    return driver.execute_async_script(
        "const done = arguments[2]; runner(arguments[0], arguments[1]).then(done, e => done({error: e.message}))",
        fun,
        kwarg,
    )


def create_from_catalog(driver, vm, image, network=None, mem=64, seed=True, vnc=False):
    """Fill the console's "New VM" form (not submitted): name, catalog image, network, memory, the checkboxes."""
    from selenium.webdriver.support.ui import Select

    driver.find_element(browser.CSS, "#create summary").click()
    browser.wait(driver, lambda d: d.find_elements(browser.CSS, f"#new-image option[value='{image}']"))
    driver.find_element(browser.ID, "new-name").send_keys(vm)
    Select(driver.find_element(browser.ID, "new-image")).select_by_value(image)
    if network:
        Select(driver.find_element(browser.ID, "new-network")).select_by_value(network)
    field = driver.find_element(browser.ID, "new-mem")
    field.clear()
    field.send_keys(str(mem))
    for box, wanted in (("new-seed", seed), ("new-vnc", vnc)):
        if driver.find_element(browser.ID, box).is_selected() != wanted:
            driver.find_element(browser.ID, box).click()


@contextlib.contextmanager
def lease_network(cloud, host, name, prefix):
    """An isolated libvirt network ``name`` on ``host`` while the context lasts: its dnsmasq leases ``prefix``.50-99
    of ``prefix``.0/24 (what ``virt.query`` reports as ``lease`` addresses). Yields ``prefix``."""
    salt = cloud["master"].salt_cli(timeout=120)
    ret = salt.run(
        "virt.network_define",
        name,
        f"bridge=vb{name}",
        "forward=none",
        f"ip={prefix}1/24",
        f"dhcp_start={prefix}50",
        f"dhcp_end={prefix}99",
        "autostart=False",
        minion_tgt=host,
    )
    assert ret.returncode == 0 and ret.data is True, ret
    try:
        yield prefix
    finally:
        salt.run("virt.network_undefine", name, minion_tgt=host)


def vnc_connected(driver):
    """Wait until noVNC connected (or was refused); the status element."""
    return browser.wait(
        driver,
        lambda d: (
            d.find_element(browser.ID, "vnc-status").get_attribute("data-state") in ("connected", "refused")
            and d.find_element(browser.ID, "vnc-status")
        ),
        timeout=180,
        message="noVNC neither connected nor was refused",
    )
