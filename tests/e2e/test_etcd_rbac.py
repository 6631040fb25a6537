# SPDX-License-Identifier: Apache-2.0
"""Least privilege in etcd on the lab (issue 8): where each certificate is, what etcd knows.

- every podnetd node holds only its own key (`podnetd-<node>`, common name to match) and
  uses it; the admin key is only on the first etcd member (ctl); CoreDNS's key only on
  the dns nodes, readable by CoreDNS alone;
- etcd has the users and roles (each node its own role: read on podnet's state, write on
  what its node owns and on the records allocations share, and the DNS records; CoreDNS:
  read-only on /skydns/ and, for name privacy, on /podnet/<cluster>/ips/ and users/);
- a node's certificate works, is refused once revoked (the CRL etcd reads at every new
  connection, the file `etcd_revoked_client_certs` writes) while another node's still
  works, and works again once the revocation is withdrawn.

etcd authentication is on (playbooks/etcd_auth.yml); what a node's certificate can and
cannot do with it is tests/e2e/test_attack_etcd.py.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CLUSTER, LAB, REPO, etcdctl, lab_inventory, ssh  # type: ignore[import-not-found]
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

NODES = ("ctl", "login", "c1", "c2")
PKI = "/etc/podnet/pki"
CRL = "/etc/etcd/pki/client.crl"


def controller_pki() -> Path | None:
    """The lab's controller-side PKI (podnet_pki_dir), where the CA key is."""
    candidates = [os.environ.get("PODNET_E2E_PKI_DIR", ""), f"/var/lib/podnet-lab/{LAB}/pki"]
    for c in candidates:
        if c and (Path(c) / "ca.key").exists():
            return Path(c)
    return None


def node_etcdctl(node: str, cert: str, args: str, check: bool = False) -> tuple[int, str]:
    conf = ssh(node, "cat /etc/podnet/podnet.yaml").stdout
    endpoints = json.loads(re.search(r"^etcd_endpoints: (.*)$", conf, re.M).group(1))  # type: ignore[union-attr]
    r = ssh(
        node,
        f"ETCDCTL_API=3 etcdctl --endpoints={endpoints[0]} --cacert={PKI}/ca.crt "
        f"--cert={PKI}/{cert}.crt --key={PKI}/{cert}.key --dial-timeout=3s "
        f"--command-timeout=5s {args}",
        check=check,
        timeout=60,
    )
    return r.returncode, r.stdout + r.stderr


@pytest.mark.parametrize("node", NODES)
def test_each_node_holds_only_its_own_podnetd_key(node: str) -> None:
    keys = sorted(ssh(node, f"cd {PKI} && ls *.key").stdout.split())
    # ctl, the admin host: the admin certificate, and the modules' gateway login (no CN)
    want = [f"podnetd-{node}.key"] + (["admin.key", "admin-gateway.key"] if node == "ctl" else [])
    assert keys == sorted(want), f"{node}: keys in {PKI}: {keys}"
    conf = ssh(node, "cat /etc/podnet/podnet.yaml").stdout
    assert f"etcd_cert: {PKI}/podnetd-{node}.crt" in conf
    assert f"etcd_key: {PKI}/podnetd-{node}.key" in conf
    subject = ssh(
        node, f"openssl x509 -noout -subject -nameopt RFC2253 -in {PKI}/podnetd-{node}.crt"
    )
    assert subject.stdout.strip() == f"subject=CN=podnetd-{node}"
    mode = ssh(node, f"stat -c '%a %U' {PKI}/podnetd-{node}.key").stdout.split()
    assert mode == ["600", "root"]


@pytest.mark.parametrize("node", NODES)
def test_coredns_key_only_on_dns_nodes(node: str) -> None:
    r = ssh(node, "stat -c '%a %U' /etc/coredns/pki/coredns.key", check=False)
    if node == "ctl":
        assert r.stdout.split() == ["600", "coredns"], r.stderr
    else:
        assert r.returncode != 0, f"{node} must not hold CoreDNS's key"


def test_etcd_users_and_roles() -> None:
    users = etcdctl("user list").split()
    for name in ("root", "admin", "coredns", *(f"podnetd-{n}" for n in NODES)):
        assert name in users, users
    assert "podnet-node-c1" in etcdctl("user get podnetd-c1")
    assert "podnet-dns-read" in etcdctl("user get coredns")
    assert re.search(r"Roles: root", etcdctl("user get admin"))
    dns = etcdctl("role get podnet-dns-read")
    read, sep, write = dns.partition("KV Write:")
    # CoreDNS reads its records and, for name privacy (on by default), the owners of
    # addresses and users (docs/security.md "Name privacy"); it writes nothing
    assert set(re.findall(r"\(prefix (\S+)\)", read)) == {
        "/skydns/",
        f"/podnet/{CLUSTER}/ips/",
        f"/podnet/{CLUSTER}/users/",
    }, dns
    assert sep and write.strip() == "", dns
    node = etcdctl("role get podnet-node-c1")
    read, write = node.split("KV Write:")
    assert f"(prefix /podnet/{CLUSTER}/)" in read, node
    assert f"(prefix /podnet/{CLUSTER}/logins/c1/)" in write, node
    assert f"(prefix /podnet/{CLUSTER}/)" not in write and "/logins/c2/" not in write, node
    assert "podnet-node" not in etcdctl("role list").split(), "the old shared role is gone"


@pytest.mark.parametrize("pki", [PKI, "/etc/etcd/pki"])
def test_the_modules_log_in_through_the_gateway_with_authentication_on(pki: str) -> None:
    """The collection's modules, as the roles run them once authentication is on (a later
    site.yml, podnet.yml, remove_node.yml): a certificate without a common name and the
    gateway user's password from its file, the admin host's copy and the member's own."""
    args = " ".join(
        [
            "key=/podnet/" + CLUSTER + "/config",
            "endpoints=https://127.0.0.1:2379",
            f"ca_cert={pki}/ca.crt",
            f"client_cert={pki}/admin-gateway.crt",
            f"client_key={pki}/admin-gateway.key",
            "login_user=admin-gateway",
            f"login_password_file={pki}/admin-gateway.password",
        ]
    )
    ansible = shutil.which("ansible") or str(Path(sys.executable).with_name("ansible"))
    cmd = [ansible, "-i", str(lab_inventory()), "ctl", "-b", "-m", "hpc.podnet.etcd_key_info"]
    r = subprocess.run(
        [*cmd, "-a", args],
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0 and "pod_cidr" in r.stdout, f"{r.stdout[-3000:]}\n{r.stderr[-2000:]}"


def test_node_certificate_refused_once_revoked_then_restored() -> None:
    pki = controller_pki()
    if pki is None:
        pytest.skip("the lab's controller PKI (CA key) is not on this machine")
    key = f"/podnet/{CLUSTER}/config"
    rc, out = node_etcdctl("c2", "podnetd-c2", f"get {key} --print-value-only")
    assert rc == 0 and "pod_cidr" in out, out

    ca = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
    c2 = x509.load_pem_x509_certificate((pki / "clients" / "podnetd-c2.crt").read_bytes())
    now = datetime.datetime.now(datetime.UTC)
    revoked = (
        x509.RevokedCertificateBuilder()
        .serial_number(c2.serial_number)
        .revocation_date(now)
        .build()
    )
    crl = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca.subject)
        .last_update(now)
        .next_update(now + datetime.timedelta(days=1))
        .add_revoked_certificate(revoked)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    pem = crl.public_bytes(serialization.Encoding.PEM).decode()
    # the deployed file is put back as it was (content, owner, mode): the role stays idempotent
    ssh("ctl", f"cp -p {CRL} {CRL}.e2e-saved")
    try:
        ssh(
            "ctl",
            f"cat > {CRL}.new <<'EOF'\n{pem}EOF\nchmod 644 {CRL}.new && mv {CRL}.new {CRL}",
        )
        rc, out = node_etcdctl("c2", "podnetd-c2", f"get {key}")
        assert rc != 0, f"a revoked certificate must be refused: {out}"
        rc, out = node_etcdctl("c1", "podnetd-c1", f"get {key} --print-value-only")
        assert rc == 0 and "pod_cidr" in out, f"another node must not be affected: {out}"
    finally:
        ssh("ctl", f"mv {CRL}.e2e-saved {CRL}")
    rc, out = node_etcdctl("c2", "podnetd-c2", f"get {key} --print-value-only")
    assert rc == 0 and "pod_cidr" in out, out
