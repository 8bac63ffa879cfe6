"""_output/virt_query.py through Salt's outputter loader: where a console really listens, the ssh
tunnel that reaches a loopback one, and the rates of ``salt-run virt.query rates=True``."""

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
