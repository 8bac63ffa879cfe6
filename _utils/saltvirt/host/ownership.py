"""The hypervisor's own check that a VM belongs to the tenant the runner acts for (defence in depth: the
runner already decides from signed answers; this refuses a call whose VM's recorded owner, the
``<saltvirt:owner tenant=…>`` that ``salt-run virt.init`` wrote into the domain's metadata, is another)."""

from salt.exceptions import CommandExecutionError

from saltvirt.base.salttypes import Conn
from saltvirt.host.conn import lookup_domain
from saltvirt.model import tenancy
from saltvirt.xml import etree
from saltvirt.xml.domain import metadata


def check(conn: Conn, name: str, tenant: str) -> None:
    """Refuse (CommandExecutionError) unless VM ``name`` is defined here and owned by ``tenant``."""
    dom = lookup_domain(conn, name)
    owner = metadata.owner(etree.read(dom.XMLDesc(0))) if dom is not None else None
    if not owner or owner.get("tenant") != tenant:
        raise CommandExecutionError(tenancy.missing(name, tenant))
