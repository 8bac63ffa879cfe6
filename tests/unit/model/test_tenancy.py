"""saltvirt.model.tenancy: one wording for "not yours" and "not there"."""

from saltvirt.model import tenancy


def test_a_vm_of_another_tenant_and_no_vm_read_the_same():
    assert tenancy.missing("web1", "acme") == "no VM named web1 in tenant acme"
