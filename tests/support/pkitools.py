"""Helpers for the PKI tests: quick keys, file modes, gnutls' certtool as the independent judge."""

import datetime
import os
import stat
import subprocess

K = {"key_size": 2048}  # quick keys


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def days_left(cert):
    return (cert.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc)).days


def certtool_verify(tmp_path, ca_pem, cert_pem, hostname=None, purpose=None):
    """gnutls' verdict on ``cert_pem`` against the CA bundle ``ca_pem`` (0 = trusted)."""
    (tmp_path / "v-ca.pem").write_text(ca_pem)
    (tmp_path / "v-cert.pem").write_text(cert_pem)
    cmd = [
        "certtool",
        "--verify",
        "--load-ca-certificate",
        str(tmp_path / "v-ca.pem"),
        "--infile",
        str(tmp_path / "v-cert.pem"),
    ]
    if hostname:
        cmd.append(f"--verify-hostname={hostname}")
    if purpose:
        cmd.append(f"--verify-purpose={purpose}")
    return subprocess.run(cmd, capture_output=True, text=True, check=False)
