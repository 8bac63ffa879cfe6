"""_output/virt_query.py through Salt's outputter loader: where a console really listens, the ssh
tunnel that reaches a loopback one, the rates of ``salt-run virt.query rates=True``, guest addresses per
NIC with their source, and what ``salt-run virt.init ... wait=`` saw."""

from tests.support.paths import ROOT


def render(data):
    import salt.config
    import salt.loader

    opts = salt.config.master_config(None)
    opts["outputter_dirs"] = [str(ROOT / "_output")]
    return salt.loader.outputters(opts)["virt_query"](data)


def vm(**extra):
    return dict({"state": "running", "cpu": 1, "mem": 256, "disks": {}, "nics": {}}, **extra)


def test_loopback_console_prints_the_listener_and_the_tunnel():
    gfx = {
        "type": "vnc",
        "listen": "127.0.0.1",
        "port": 5901,
        "address": "127.0.0.1:5901",
        "tunnel": "ssh -N -L 5901:127.0.0.1:5901 hv1.example.com",
    }
    text = render({"hv1": {"status": "up", "host": {}, "vm_info": {"web1": vm(graphics=gfx)}}})
    assert "    Graphics: vnc - 127.0.0.1:5901 (loopback of hv1)\n" in text
    assert "      Reach it: ssh -N -L 5901:127.0.0.1:5901 hv1.example.com  then connect to localhost:5901" in text
    wide = dict(gfx, listen="0.0.0.0", address="hv1.example.com:5901", tunnel=None)
    text = render({"hv1": {"status": "up", "host": {}, "vm_info": {"web1": vm(graphics=wide)}}})
    assert text.endswith("    Graphics: vnc - hv1.example.com:5901") and "Reach it" not in text


def test_a_host_in_maintenance_says_so():
    host = {"hostname": "h", "vcpus_total": 4, "vcpus_used_by_vms": 1, "mem_total": 4096, "mem_used_by_vms": 256}
    text = render({"hv1": {"status": "up", "host": host, "maintenance": "hv*"}, "hv2": {"status": "up", "host": host}})
    assert "hv1  up  in maintenance (hv*)  (h: 1/4 vCPUs" in text
    assert "hv2  up  (h: 1/4 vCPUs" in text


def test_rates_line():
    rates = {
        "cpu_percent": 12.5,
        "rd_bytes_per_s": 2048.0,
        "wr_bytes_per_s": 0.0,
        "rx_bytes_per_s": 100.0,
        "tx_bytes_per_s": 5.0,
    }
    text = render({"hv1": {"status": "up", "host": {}, "vm_info": {"web1": vm(rates=rates)}}})
    assert "    Rates: cpu 12.5%, disk read 2.0K/s, write 0B/s, net in 100B/s, out 5B/s" in text


def test_the_image_a_vm_came_from():
    text = render({"hv1": {"status": "up", "host": {}, "vm_info": {"web1": vm(group="web", image="debian12")}}})
    assert "    Group: web\n    Image: debian12" in text
    odd = render({"hv1": {"status": "up", "host": {}, "vm_info": {"web1": vm(image="/srv/i/\x1b[2Jx.raw")}}})
    assert "    Image: /srv/i/\\x1b[2Jx.raw" in odd and "\x1b" not in odd
    assert "Image:" not in render({"hv1": {"status": "up", "host": {}, "vm_info": {"web1": vm(image=None)}}})


MAC = "52:54:00:6b:10:01"


def nic(ips):
    return {MAC: {"type": "bridge", "source": "br0", "model": "virtio", "mac": MAC, "ips": ips}}


def test_guest_addresses_per_nic_with_their_source():
    ips = [
        {"address": "10.0.0.5", "prefix": 24, "type": "ipv4", "source": "lease"},
        {"address": "2001:db8::5", "prefix": None, "type": "ipv6", "source": "agent"},
    ]
    info = vm(nics=nic(ips), ips_note="agent: no answer within 2 s")
    text = render({"hv1": {"status": "up", "host": {}, "vm_info": {"web1": info}}})
    assert f"    NIC - {MAC}:\n      Source: br0\n      Type: bridge\n      Model: virtio\n" in text
    assert text.endswith("      IP: 10.0.0.5/24 (lease)\n      IP: 2001:db8::5 (agent)")
    assert "IPs:" not in text  # every NIC has an address: the source that failed is no news
    none = vm(nics=nic([]), ips_note="lease: no lease; arp: internal error: wrong nlmsg len " + "x" * 200)
    text = render({"hv1": {"status": "up", "host": {}, "vm_info": {"web1": none}}})
    last = text.splitlines()[-1]
    assert (
        last.startswith("    IPs: unknown (lease: no lease; arp: internal error: wrong nlmsg len x") and len(last) < 120
    )
    assert last.endswith("...)")
    assert "IP:" not in render({"hv1": {"status": "up", "host": {}, "vm_info": {"web1": vm(nics=nic([]))}}})


def test_guest_controlled_text_is_printed_escaped():
    """A hypervisor answer that did not go through saltvirt.host.guestips (an older module, a forged answer):
    nothing that is not an address reaches the terminal as it came."""
    ips = [
        {"address": "10.0.0.6\n\x1b[31mroot login ok", "prefix": 24, "source": "agent"},
        {"address": "10.0.0.7", "prefix": "24\nx", "source": "arp\x1b[0m"},
        "\x1b]0;title\x07",
    ]
    text = render({"hv1": {"status": "up", "host": {}, "vm_info": {"web1": vm(nics=nic(ips), ips_note="x\x1bq")}}})
    bare = render({"hv1": {"status": "up", "host": {}, "vm_info": {"web1": vm(nics=nic([]), ips_note="x\x1bq")}}})
    assert "\x1b" not in text and "root login ok\n" not in text
    assert "      IP: 10.0.0.6\\n\\x1b[31mroot login ok (malformed, agent)" in text
    assert "      IP: 10.0.0.7 (arp\\x1b[0m)" in text
    assert "    IPs: unknown (x\\x1bq)" in bare and "\x1b" not in bare


def created(**wait):
    return {
        "name": "web1",
        "host": "hv1",
        "placement": {},
        "tried": [],
        "key": None,
        "init": {},
        "jid": "1",
        "seconds": 3.0,
        "vm_info": None,
        "wait": wait,
    }


def test_wait_lines():
    ip = {"address": "10.0.0.5", "prefix": 24, "type": "ipv4", "source": "lease"}
    text = render(created(**{"for": "ip", "result": "ok", "seconds": 12.5, "ips": {MAC: [ip]}}))
    assert text.endswith(f"  Waited 12.5 s for an address:\n    NIC - {MAC}:\n        IP: 10.0.0.5/24 (lease)")
    text = render(created(**{"for": "minion", "result": "ok", "seconds": 40.0, "minion": "web1"}))
    assert text.endswith("  Waited 40.0 s: minion web1 answered test.ping")
    timeout = {
        "for": "minion",
        "result": "timeout",
        "seconds": 10.2,
        "pings": 2,
        "minion": "web1",
        "seen": {"state": "running", "ips": {MAC: [ip]}},
        "message": "minion web1 did not answer test.ping within 10 s. The VM web1 was created on hv1 and is kept",
    }
    text = render(created(**timeout))
    assert "  WAIT TIMEOUT: minion web1 did not answer test.ping within 10 s. The VM web1 was created" in text
    assert text.endswith("    Seen: state running; addresses: 10.0.0.5 (lease); 2 test.ping publication(s) unanswered")
