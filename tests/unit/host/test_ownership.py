"""saltvirt.host.ownership: the hypervisor refuses a tenant's call on a VM it does not own (libvirt's test
driver; the same check through ``virt.answer`` is in tests/unit/pki/test_answers.py)."""

import pytest
from salt.exceptions import CommandExecutionError

from saltvirt.host import ownership
from saltvirt.xml.domain.metadata import METADATA_NS


def _define(conn, name, tenant=None):
    owner = f"<sv:owner tenant='{tenant}' creator='alice'/>" if tenant else ""
    conn.defineXML(
        f"<domain type='test'><name>{name}</name><memory unit='MiB'>64</memory>"
        f"<metadata><sv:vm xmlns:sv='{METADATA_NS}'>{owner}</sv:vm></metadata><os><type>hvm</type></os></domain>"
    )


def test_the_owner_passes_and_everyone_else_reads_not_there(test_conn):
    _define(test_conn, "web1", "beta")
    _define(test_conn, "ops1")  # an operator's VM: no tenant recorded
    ownership.check(test_conn, "web1", "beta")
    for name, tenant in (("web1", "acme"), ("ops1", "acme"), ("nope", "acme")):
        with pytest.raises(CommandExecutionError, match=f"^no VM named {name} in tenant acme$"):
            ownership.check(test_conn, name, tenant)
