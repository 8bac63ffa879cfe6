"""_grains/virt_hypervisor.py: the ``virt_hypervisor`` grain through Salt's real grains loader."""

import shutil

from tests.support.paths import ROOT


def test_virt_hypervisor_grain_through_the_salt_loader(tmp_path):
    import salt.config
    import salt.loader

    def grain(config=""):
        conf = tmp_path / "minion"
        conf.write_text(f"cachedir: {tmp_path / 'cache'}\ngrains_dirs: [{ROOT / '_grains'}]\n{config}")
        opts = salt.config.minion_config(str(conf))
        return salt.loader.grains(opts, force_refresh=True).get("virt_hypervisor")

    # this machine has the libvirt bindings and libvirtd (scripts/setup.sh): a hypervisor
    assert shutil.which("libvirtd") or shutil.which("libvirtd", path="/usr/sbin")
    assert grain() is True
    assert grain("virt_hypervisor: false\n") is False  # the minion config decides
    assert grain("grains: {virt_hypervisor: false}\n") is False  # so does a static grain
