#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# make test-site-install: podnet installed the way a site installs it (issue 21), on a lab of
# its own (LAB_NAME pnsite, Debian 12 nodes: LAB_OS=bookworm, Slurm 22.05), down afterwards:
#   - the controller has ansible-core and community.crypto and nothing else: a fresh venv with
#     the LOWEST ansible-core podnet supports (meta/runtime.yml; the molecule lab runs the
#     highest, the dev venv's), the collection installed from its tarball with ansible-galaxy,
#     no checkout, no ansible.cfg, no make (tests/site-install/controller.sh);
#   - the nodes have no apt source (air-gapped): stock Debian packages come from the bundle's
#     archive of them (podnet_package_source: bundle; agent/artifacts/build-debian-packages.sh);
#   - the nodes take everything that is not in their Debian mirror from the release's artifact
#     bundle (agent/artifacts/bundle.sh, podnet_artifact_dir): CoreDNS, Flannel, etcd, the
#     wheelhouse, the native build for Debian 12 + Slurm 22.05 and Apptainer for Debian 12
#     (agent/artifacts/build-apptainer-deb.sh: built once, then cached by its inputs), built
#     here from the nodes' image;
#   - Slurm is the site's own: 24.11 built under /opt/slurm (build-site-slurm.sh; Debian's
#     packages purged, sinfo not on root's default PATH), configless (slurmd --conf-server, sackd
#     on login), an Include'd partitions.conf, plugstack.conf.d/ (tests/site-install/site-slurm.yml,
#     slurm_manage: false); the bundle has no native build for it, so podnet builds one on a node;
#     test-existing-slurm.sh checks the refusal without PrologFlags=Contain, the deployment,
#     the e2e tests below as the lab's users, and reset.yml giving /etc/slurm back unchanged.
# PODNET_SITE_KEEP=1 keeps the lab up; PODNET_SITE_LAB / PODNET_SITE_SUBNET move it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export LAB_NAME=${PODNET_SITE_LAB:-pnsite}
export LAB_SUBNET=${PODNET_SITE_SUBNET:-198.51.100.160/28}
export LAB_OS=bookworm
unset LAB_NODES LAB_GATEWAYS LAB_ETCD_NODES LAB_DYNAMIC_NODES LAB_SLURM LAB_EXT_SUBNET
# the lowest ansible-core meta/runtime.yml allows (its newest patch release)
CORE=${PODNET_SITE_ANSIBLE_CORE:-2.17.14}
out=$ROOT/build/site-install
LAB=$ROOT/tests/lab/lab.sh
t0=$SECONDS
down() { [ "${PODNET_SITE_KEEP:-0}" = 1 ] || "$LAB" down; }
trap down EXIT
# Apptainer for Debian 12, before the lab is up: ~15 min the first time (Go, on 2 cores), then cached
"$ROOT/agent/artifacts/build-apptainer-deb.sh" "$("$LAB" image)"
# the site's own Slurm (issue 35): 24.11 built in-house under /opt/slurm, not Debian 12's 22.05
# (~4 min the first time, then cached by its inputs)
site_slurm=$("$ROOT/tests/site-install/build-site-slurm.sh" "$("$LAB" image)" | tail -n 1)
# the stock Debian packages of air-gapped Debian 12 nodes (a few seconds; cached by their inputs)
"$ROOT/agent/artifacts/build-debian-packages.sh" bookworm
"$LAB" down >/dev/null 2>&1 || true
"$LAB" up
echo "site-install: lab up in $((SECONDS - t0)) s"
# air-gapped nodes (podnet_package_source: bundle): no apt source at all, and the packages podnet
# installs that the image has are purged, so the deployment can only take them from the bundle's
# archive; test-existing-slurm.sh checks they came back from it
# (every podnet node's: the agent's and Ansible's apt module's; compute and login nodes' too:
# what Apptainer and Flannel need)
export PODNET_SITE_AIRGAP_PACKAGES="python3-venv python3.11-venv python3-nftables nftables libnftables1 python3-apt"
export PODNET_SITE_SLURM_PACKAGES="slurmd slurmctld slurm-client libslurm-dev slurm-wlm-basic-plugins libslurm38"
export PODNET_SITE_AIRGAP_POD_PACKAGES="containernetworking-plugins squashfs-tools uidmap"
# shellcheck source=/dev/null
for n in $(. "/var/lib/podnet-lab/$LAB_NAME/lab.env" && echo "$LAB_NODES"); do
    "$LAB" ssh "$n" "rm -rf /etc/apt/sources.list /etc/apt/sources.list.d/* /var/lib/apt/lists/* && apt-get -q clean \
        && DEBIAN_FRONTEND=noninteractive dpkg --purge $PODNET_SITE_AIRGAP_PACKAGES $PODNET_SITE_AIRGAP_POD_PACKAGES >/dev/null"
    # no Slurm package: the site's build under /opt/slurm (its units in /etc/systemd/system),
    # configured by site-slurm.yml (configless)
    "$LAB" ssh "$n" "DEBIAN_FRONTEND=noninteractive dpkg --purge $PODNET_SITE_SLURM_PACKAGES >/dev/null"
    zstd -dc "$site_slurm" | "$LAB" ssh "$n" "tar -C / --no-same-owner -xf - && systemctl daemon-reload"
done

# the release a site downloads: the collection tarball and the artifact directory
tarball=$(find "$ROOT/build/dist" -maxdepth 1 -name 'hpc-podnet-*.tar.gz' | sort | tail -n 1)
[ -n "$tarball" ] || { echo "site-install: no collection tarball in build/dist (make collection-tarball)" >&2; exit 1; }
"$ROOT/agent/native/build-artifact.sh" "$("$LAB" image)" "$ROOT/build/artifacts"
# the release's artifact bundle (make release's agent/artifacts/bundle.sh: what the roles
# install, SHA256SUMS), with every native build: this Debian 12 one among them
"$ROOT/agent/artifacts/bundle.sh" "$out/artifacts"
"$ROOT/tests/site-install/controller.sh" "$CORE" "$out/controller" "$tarball"

# ansible-playbook as the site's controller runs it: its venv, its collections, a clean
# environment, outside the checkout (no ansible.cfg of ours); SSH pipelining on, as
# docs/install.md advises a site (one SSH round trip a task instead of several)
cat >"$out/ansible-playbook" <<EOF
#!/bin/sh
cd "$out/controller" && exec env -i PATH="$out/controller/venv/bin:/usr/bin:/bin" HOME="\${HOME:-/root}" \\
  LANG=C.UTF-8 ANSIBLE_COLLECTIONS_PATH="$out/controller/collections" ANSIBLE_HOST_KEY_CHECKING=False \\
  ANSIBLE_PIPELINING=True ansible-playbook "\$@"
EOF
chmod +x "$out/ansible-playbook"
"$out/ansible-playbook" --version | head -n 1

export ANSIBLE_PLAYBOOK=$out/ansible-playbook PODNET_PLAYBOOKS=hpc.podnet
# Debian 12: Apptainer from the bundle (podnet's Debian 12 build); etcd 3.5 from the bundle's
# release tarball (Debian 12 ships 3.4; its checksum from the bundle's SHA256SUMS); the stock
# Debian packages from the bundle's archive (the nodes have no apt source)
# the bundle has no native build for the site's Slurm 24.11 on Debian 12: podnet builds it on a
# node into podnet_native_build_dir (emptied first: built by this run)
rm -rf "$out/native-built"
export PODNET_SITE_ARGS="-e podnet_artifact_dir=$out/artifacts -e etcd_install_method=artifact -e podnet_package_source=bundle -e podnet_native_build_dir=$out/native-built"
export PODNET_E2E_NATIVE_BUILT=$out/native-built PODNET_E2E_ROOT_PATH=/opt/slurm/bin:/opt/slurm/sbin
# what a user does on a Debian 12 node, after the deployment: jobs in pods, their names and
# MPI, another user's pods out of reach, opt-out steps, the prebuilt binaries, podnet verify,
# SSH sessions into job and login pods and the SSH attacks, containers in pods (Apptainer) and
# steps in container images, what a task is told of its pod (Slurm 22.05's SPANK).
# The e2e tests of what differs on a site: Slurm 22.05's SPANK (opt-out included) and PAM,
# the native build against its headers, Debian 12's Apptainer, the verify playbook on the
# lowest ansible-core. The molecule lab runs them all on Debian 13, and verify.yml's
# interrupted and broken-rule runs only there (the same cleanup code on both).
export PODNET_SITE_E2E="python -m pytest -q -p no:cacheprovider --durations=10 \
  $ROOT/tests/e2e/test_jobs.py $ROOT/tests/e2e/test_task_env.py $ROOT/tests/e2e/test_native_artifacts.py \
  $ROOT/tests/e2e/test_verify.py::test_the_playbook_proves_isolation $ROOT/tests/e2e/test_optout.py \
  $ROOT/tests/e2e/test_ssh.py $ROOT/tests/e2e/test_attack_ssh.py \
  $ROOT/tests/e2e/test_apptainer.py $ROOT/tests/e2e/test_images.py"
export PODNET_E2E_LAB=$LAB_NAME PODNET_SITE_OPT_SLURM=1
"$ROOT/tests/site-install/test-existing-slurm.sh"
echo "site-install: total $((SECONDS - t0)) s"
