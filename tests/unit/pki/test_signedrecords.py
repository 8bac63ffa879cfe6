"""saltvirt.pki.signedrecords: records in a shared store carry a MAC only this master's key makes."""

import os

from saltvirt.pki import signedrecords

REC = {"vms": {"web1": {"xml": "<domain/>"}}, "recorded": 1.5}


def test_a_signed_record_verifies_and_the_key_is_private(tmp_path):
    signed = signedrecords.sign(str(tmp_path), "host-record", "hv1", REC)
    assert signedrecords.verified(str(tmp_path), "host-record", "hv1", signed)
    assert os.stat(signedrecords.key_path(str(tmp_path))).st_mode & 0o777 == 0o600
    assert len(signed["mac"]) == 64


def test_forged_changed_moved_or_unsigned_records_fail(tmp_path):
    pki = str(tmp_path)
    signed = signedrecords.sign(pki, "host-record", "hv1", REC)
    changed = dict(signed, vms={"web1": {"xml": "<domain><devices><hostdev/></devices></domain>"}})
    assert not signedrecords.verified(pki, "host-record", "hv1", changed)
    assert not signedrecords.verified(pki, "host-record", "hv2", signed)  # another host's record
    assert not signedrecords.verified(pki, "other", "hv1", signed)
    assert not signedrecords.verified(pki, "host-record", "hv1", REC)
    assert not signedrecords.verified(pki, "host-record", "hv1", None)
    other = tmp_path / "other-master"
    other.mkdir()
    assert not signedrecords.verified(str(other), "host-record", "hv1", signed)  # another key
