"""What a tenant is told about a VM it does not own (both sides: the runner's fleet view and the hypervisor's
own owner check say it in the same words, so neither is an oracle for another tenant's VM names), and where the
master tells the hypervisors who belongs to which tenant."""

# the hypervisors' pillar key (from the master's ``libvirt`` ext_pillar) holding ``{Salt user: tenant}``: the
# master config's ``virt:tenants`` members, resolved on the master (the ``virt_vm`` resources' tenant gate)
MEMBERS_PILLAR = "virt_tenant_members"


def missing(name: str, tenant: str | None) -> str:
    """The one wording for a VM a tenant does not own, or that does not exist."""
    return f"no VM named {name} in tenant {tenant}"
