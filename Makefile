# podnet: the Makefile is the interface (see README.md).
#   make lab        fresh machine -> lab cluster up, site.yml deployed, summary
#   make test       everything CI runs (.ci/run calls it)
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

ROOT        := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
CACHE_DIR   ?= /var/cache/podnet-dev
VENV_HASH   := $(shell sha256sum $(ROOT)/requirements-dev.txt | cut -c1-12)
VENV        ?= $(CACHE_DIR)/venv-$(VENV_HASH)
PY          := $(VENV)/bin/python
export PATH := $(VENV)/bin:/usr/local/go/bin:$(PATH)
export ANSIBLE_CONFIG := $(ROOT)/ansible.cfg
export PODNET_CACHE_DIR := $(CACHE_DIR)
# this checkout's podnet wheelhouse (agent/artifacts/build-wheelhouse.sh; the lab inventory's
# agent_wheelhouse): never one another checkout sharing the cache built from its sources
export PODNET_WHEELHOUSE_DIR := $(ROOT)/build/artifacts
# this checkout's agent, whatever checkout the shared venv's editable install points to
export PYTHONPATH := $(ROOT)/agent/src
# the etcd the lab nodes run (trixie's, fetched by `make artifacts`): agent tests and bench
ETCD_ARTIFACT := $(CACHE_DIR)/artifacts/etcd-server/usr/bin/etcd

LAB         := $(ROOT)/tests/lab/lab.sh
# Suites with fixed names (netns pat-*, labs pnha/pnlt/pnmol) take a host-wide lock, so two
# checkouts on one machine (CI beside a developer's tree, or trees with caches of their own)
# wait for each other, never collide. -o: the suite's own children (a lab's nspawn nodes,
# kept up with PODNET_SITE_KEEP=1) do not inherit the lock: it ends with the suite.
LOCKED      = flock -o /run/lock/podnet-suite-$(1).lock
LAB_INV     := $(ROOT)/inventories/lab

HOST_PACKAGES := debootstrap systemd-container etcd-server etcd-client python3-nftables \
  python3-venv nftables bind9-dnsutils zstd containernetworking-plugins iproute2 \
  openssh-client libslurm-dev libpam0g-dev gcc make rsync iputils-ping util-linux shellcheck \
  clang libclang-rt-14-dev go-md2man

.PHONY: help collection-link collection-tarball release deps host-deps venv venv-build lab lab-up lab-down lab-status lab-deploy \
  lint unit role-docs man fuzz integration test-roles test-etcd-ha test-lab-harness test test-agent test-molecule test-day2 test-e2e bench-agent bench-scale bench-e2e bench-hpk bench-cni bench-collect bench-gateway bench-dns artifacts changelog clean \
  check check-tests suite-quick suite-roles suite-labs suite-checks-day2 suite-molecule suite-day2 \
  test-site-install suite-site-install

help:
	@echo "make lab | lab-down | lab-status | test | check | release | lint | unit | fuzz | integration | test-roles | test-lab-harness | test-agent | test-molecule | bench-agent"

## --- dependencies -----------------------------------------------------------
host-deps: $(CACHE_DIR)/host-deps.stamp
$(CACHE_DIR)/host-deps.stamp: Makefile
	@[ "$$(id -u)" = 0 ] || { echo "podnet: run as root (the lab needs netns, nspawn, bridges)" >&2; exit 1; }
	@mkdir -p $(CACHE_DIR)
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(HOST_PACKAGES) >/dev/null
	@touch $@

# The venv is named by the hash of requirements-dev.txt: the same content is the same venv,
# whatever the file's mtime (a fresh clone does not rebuild it), and a lock keeps two
# checkouts from building the same one at once. .venv always points at it.
venv: $(VENV)/.complete
	ln -sfn $(VENV) $(ROOT)/.venv
$(VENV)/.complete: | host-deps
	flock $(CACHE_DIR)/venv-$(VENV_HASH).lock $(MAKE) --no-print-directory -f $(ROOT)/Makefile venv-build

venv-build:
	[ ! -e $(VENV)/.complete ] || exit 0
	rm -rf $(VENV).tmp
	/usr/bin/python3 -m venv --system-site-packages $(VENV).tmp
	$(VENV).tmp/bin/pip install -q --upgrade pip
	$(VENV).tmp/bin/pip install -q -r $(ROOT)/requirements-dev.txt
	rm -rf $(VENV) && mv $(VENV).tmp $(VENV)
	# venvs are not relocatable: rewrite the shebangs and activate scripts
	grep -rlI --null "$(VENV).tmp" $(VENV)/bin | xargs -0 -r sed -i "s#$(VENV).tmp#$(VENV)#g"
	$(PY) -m pip install -q --no-deps -e $(ROOT)/agent
	touch $(VENV)/.complete

collection-link: $(ROOT)/build/collections/ansible_collections/hpc/podnet
$(ROOT)/build/collections/ansible_collections/hpc/podnet:
	mkdir -p $(dir $@)
	ln -sfn $(ROOT) $@

deps: host-deps venv collection-link

# The collection as a site gets it: the tarball `ansible-galaxy collection build` makes
# (galaxy.yml's build_ignore keeps the lab, the tests and the developer's files out),
# installed into build/collections-installed. The molecule lab deploys from there.
COLLECTION_DIST = $(ROOT)/build/dist
COLLECTION_INSTALLED = $(ROOT)/build/collections-installed
collection-tarball: deps
	rm -rf $(COLLECTION_DIST) $(COLLECTION_INSTALLED)
	cd $(ROOT) && $(VENV)/bin/ansible-galaxy collection build --output-path $(COLLECTION_DIST) .
	cd $(COLLECTION_DIST) && ANSIBLE_COLLECTIONS_PATH=$(COLLECTION_INSTALLED) \
	  $(VENV)/bin/ansible-galaxy collection install --no-deps -p $(COLLECTION_INSTALLED) \
	  $(COLLECTION_DIST)/hpc-podnet-*.tar.gz
	test -f $(COLLECTION_INSTALLED)/ansible_collections/hpc/podnet/MANIFEST.json

## --- lab cluster ------------------------------------------------------------
# Three sides at once (on a fresh machine each waits on the network much of its time): the Go
# builds and Debian's packages (build-artifacts.sh), the node image, the venv; then the
# wheelhouse and the native build in the image. The background sides' output is printed when
# they end. Cached, each is a check. (Listed before deps, it starts the Go builds first.)
artifacts: host-deps
	@mkdir -p $(ROOT)/build
	$(ROOT)/agent/artifacts/build-artifacts.sh >$(ROOT)/build/build-artifacts.log 2>&1 & go=$$!; \
	  $(LAB) image >$(ROOT)/build/lab-image.path 2>$(ROOT)/build/lab-image.log & image=$$!; rc=0; \
	  $(MAKE) --no-print-directory deps || rc=1; \
	  wait $$image || rc=1; cat $(ROOT)/build/lab-image.log; \
	  [ $$rc != 0 ] || { $(ROOT)/agent/artifacts/build-wheelhouse.sh \
	    && $(ROOT)/agent/native/build-artifact.sh "$$(cat $(ROOT)/build/lab-image.path)" $(PODNET_WHEELHOUSE_DIR); } \
	  || rc=1; $(ROOT)/agent/artifacts/fetch-prometheus.sh || rc=1; \
	  wait $$go || rc=1; cat $(ROOT)/build/build-artifacts.log; exit $$rc

# What a site installs (docs/install.md): dist/podnet-<version>/ with the collection tarball,
# the artifact bundle (artifacts/: what the roles install on nodes that stock Debian has not)
# and SHA256SUMS over all of it; from what `make artifacts` built (tests/release/release.sh).
RELEASE_VERSION := $(shell sed -n 's/^version: *//p' $(ROOT)/galaxy.yml)
RELEASE_DIR ?= $(ROOT)/dist/podnet-$(RELEASE_VERSION)
# Native builds for every supported node platform (docs/install.md: Debian 13 + Slurm 24.11 from
# `make artifacts`, Debian 12 + Slurm 22.05, Debian 13 + Slurm 26.05 from sid), each from an
# image of that platform (tests/lab/lab.sh image builds one once, then it is cached).
release: deps artifacts
	$(ROOT)/agent/native/build-artifact.sh "$$(LAB_OS=bookworm $(LAB) image)" $(PODNET_WHEELHOUSE_DIR)
	$(ROOT)/agent/native/build-artifact.sh "$$(LAB_SLURM=sid $(LAB) image)" $(PODNET_WHEELHOUSE_DIR)
	$(ROOT)/agent/artifacts/build-apptainer-deb.sh "$$(LAB_OS=bookworm $(LAB) image)"
	$(ROOT)/agent/artifacts/build-debian-packages.sh bookworm
	$(ROOT)/agent/artifacts/build-debian-packages.sh trixie
	$(ROOT)/tests/release/release.sh $(RELEASE_DIR)

lab-up: artifacts deps
	$(LAB) up

lab-deploy: deps
	ansible-playbook -i "$$($(LAB) inventory)" $(ROOT)/playbooks/site.yml

lab: lab-up
	$(MAKE) --no-print-directory lab-deploy
	$(ROOT)/tests/lab/hpk-images.sh
	$(LAB) summary

lab-down:
	$(LAB) down

lab-status:
	$(LAB) status

## --- quality ----------------------------------------------------------------
lint: deps artifacts
	$(ROOT)/tests/lint.sh

unit: deps
	$(PY) -m pytest -q $(ROOT)/tests/unit

# What a contributor runs before every commit (a few minutes, no lab): the static checks
# beside the unit and integration tests (make -j2; -O prints each side whole when it ends).
check: deps artifacts
	$(MAKE) --no-print-directory -j2 -O lint check-tests
check-tests:
	$(PY) -m pytest -q $(ROOT)/tests/unit
	$(PY) -m pytest -q $(ROOT)/tests/integration

# CHANGELOG.md from changelogs/ (antsibull-changelog; docs/development.md "Changelog").
changelog: deps
	$(ROOT)/tests/changelog.sh --write

# The variables table of docs/roles/<role>.md from each role's meta/argument_specs.yml.
role-docs: deps
	$(PY) $(ROOT)/tests/unit/roles/role_docs.py

# The man pages (podnet(1), podnetd(8), podnet-container(1)) from docs/man/*.md, into the
# roles that install them; make lint checks they are current.
man: host-deps
	$(ROOT)/tests/man.sh

# The C side's fuzz targets (agent/native: the reply parser, the escaper and request
# builder), libFuzzer under ASan/UBSan, FUZZ_SECONDS each; `make unit` runs 20000 inputs of each.
FUZZ_SECONDS ?= 60
fuzz: host-deps
	$(MAKE) -C $(ROOT)/agent/native O=$(ROOT)/build/native FUZZ_SECONDS=$(FUZZ_SECONDS) fuzz

# Modules against a real 3-member TLS etcd started by the tests on loopback.
integration: deps artifacts
	$(PY) -m pytest -q $(ROOT)/tests/integration

# The standalone role scenarios (tests/molecule/<role>, one lab each, one after the other):
# etcd on 3 members with its HA checks, coredns (+ one etcd member) with dig, apptainer.
ROLE_SCENARIOS := etcd coredns apptainer
test-roles: deps artifacts
	$(MAKE) --no-print-directory suite-roles
suite-roles:
	$(ROOT)/tests/molecule/run-scenarios.sh $(ROLE_SCENARIOS)
# The 3-member etcd proof alone (the etcd scenario).
test-etcd-ha: deps
	$(ROOT)/tests/molecule/run-scenarios.sh etcd

# The lab harness itself: host forwarding guard, the slim CoreDNS against a real
# etcd, and a throwaway lab (up, ssh, re-up, SIGKILL recovery, clean down).
test-lab-harness: deps artifacts
	$(ROOT)/tests/lab/test-host-guard.sh
	$(ROOT)/tests/lab/test-coredns.sh
	$(call LOCKED,lab-harness) $(ROOT)/tests/lab/test-lab.sh

test-agent: deps artifacts
	PODNET_TEST_ETCD=$(ETCD_ARTIFACT) $(call LOCKED,agent-netns) $(PY) -m pytest -q $(ROOT)/tests/agent

# what the molecule lab's e2e failed or skipped (tests/e2e/conftest.py writes it)
MOLECULE_E2E_FAILURES := $(ROOT)/tests/output/e2e-failures-pnmol.txt
test-molecule: deps artifacts collection-tarball
	$(MAKE) --no-print-directory suite-molecule
suite-molecule:
	mkdir -p $(ROOT)/build/molecule-lab
	[ -s $(ROOT)/build/molecule-lab/hosts.yml ] || printf 'all: {}\n' > $(ROOT)/build/molecule-lab/hosts.yml
	rm -f $(MOLECULE_E2E_FAILURES)
	cd $(ROOT) && MOLECULE_GLOB='tests/molecule/*/molecule.yml' $(call LOCKED,molecule-lab) molecule test -s lab \
	  2>&1 | tee $(ROOT)/build/molecule-lab/molecule.log \
	  || { echo "==== test-molecule failed: the failed tasks, then the failed e2e tests"; \
	       sed 's/\x1b\[[0-9;]*m//g' $(ROOT)/build/molecule-lab/molecule.log \
	         | grep -E -A25 '(fatal|failed): \[|CRITICAL|ERROR ' | tail -n 150; \
	       cat $(MOLECULE_E2E_FAILURES) 2>/dev/null; exit 1; }

# Day-2 playbooks (backup, restore, reset, remove_node, upgrade) with a job's TCP ping loop
# and an SSH session running: its own lab pnd2ci (ctl login c1 c2 c3), down afterwards.
test-day2: deps artifacts
	$(MAKE) --no-print-directory suite-day2
suite-day2:
	$(call LOCKED,day2-lab) $(ROOT)/tests/day2/run.sh

# A site's install (issue 21): Debian 12 nodes with the site's own Slurm, a controller with
# only the lowest supported ansible-core and the collection tarball, every artifact from one
# directory: its own lab pnsite (ctl login c1 c2), down afterwards (tests/site-install/run.sh).
test-site-install: deps artifacts collection-tarball
	$(MAKE) --no-print-directory suite-site-install
suite-site-install:
	$(call LOCKED,site-install-lab) $(ROOT)/tests/site-install/run.sh

# What CI runs (.ci/run): the shared prerequisites once, then two sides of suites side by side
# (make -j2; -O prints each side's output whole when it ends), each suite after the other on
# its side: the molecule lab and the site install on one; the quick checks, the etcd, coredns
# and apptainer scenarios and the day-2 lab on the other. At most two labs run at once (one a
# side). Each side runs all its suites and fails if one failed; the suite-* targets have no
# prerequisites (built here first, never twice at once). tests/suite.sh times each suite and
# keeps its log in build/suites/; the run ends with the failed suites' last lines, then every
# suite's result and wall time (a CI log keeps its tail). Stop 38's CI (59 min): the molecule
# lab's side ended last, so the role scenarios moved to the other side.
test: artifacts deps collection-tarball
	rm -f $(MOLECULE_E2E_FAILURES)
	rm -rf $(ROOT)/build/suites
	rc=0; t0=$$(date +%s); $(MAKE) --no-print-directory -j2 -O suite-labs suite-checks-day2 || rc=1; \
	  if [ $$rc != 0 ] && [ -s $(MOLECULE_E2E_FAILURES) ]; then \
	    echo "==== make test failed; the molecule lab's failed or skipped e2e tests:"; \
	    tail -n 150 $(MOLECULE_E2E_FAILURES); fi; \
	  for f in $$(grep -o 'log build/suites/[^)]*' $(ROOT)/build/suites/summary.txt 2>/dev/null | cut -c5-); do \
	    echo "==== the end of $$f:"; sed 's/\x1b\[[0-9;]*m//g' $(ROOT)/$$f | tail -n 40; done; \
	  echo "==== make test: the suites (two sides at once), $$(( $$(date +%s) - t0 )) s in all:"; \
	  cat $(ROOT)/build/suites/summary.txt; exit $$rc
SUITE := $(ROOT)/tests/suite.sh
suite-labs:
	rc=0; $(SUITE) molecule-lab $(MAKE) --no-print-directory suite-molecule || rc=1; \
	  $(SUITE) site-install $(MAKE) --no-print-directory suite-site-install || rc=1; exit $$rc
suite-checks-day2:
	rc=0; $(SUITE) quick $(MAKE) --no-print-directory suite-quick || rc=1; \
	  $(SUITE) etcd-coredns-apptainer $(ROOT)/tests/molecule/run-scenarios.sh etcd coredns apptainer || rc=1; \
	  $(SUITE) day2 $(MAKE) --no-print-directory suite-day2 || rc=1; exit $$rc
suite-quick:
	$(MAKE) --no-print-directory -j1 -k lint unit integration test-lab-harness test-agent

bench-agent: deps artifacts
	PODNET_BENCH_ETCD=$(ETCD_ARTIFACT) $(call LOCKED,agent-netns) $(PY) $(ROOT)/tests/bench/bench_agent.py

# One job of 100/400/1000 simulated nodes against a real etcd (the pcocc paper's Figure 2).
bench-scale: deps artifacts
	PODNET_BENCH_ETCD=$(ETCD_ARTIFACT) $(PY) $(ROOT)/tests/bench/bench_scale.py

# End-to-end tests and benchmark against the lab of `make lab` (PODNET_E2E_LAB=pnlab);
# make test runs the same tests on the molecule lab (its verify step).
test-e2e: deps
	$(PY) -m pytest -q $(ROOT)/tests/e2e

bench-e2e: deps
	$(PY) $(ROOT)/tests/bench/bench_e2e.py

# HPK (docs/hpk.md) against `make lab`'s lab (PODNET_E2E_LAB): control plane up, pod start
# (kubectl apply to Running) beside a plain sbatch of the same Apptainer command, same run.
bench-hpk: deps
	$(PY) $(ROOT)/tests/bench/bench_hpk.py

# Container network setup through CNI: the Flannel chain Apptainer runs (issue 10), then
# the podnet CNI plugin in the same run, on bench-agent's podnetd + etcd setup (its lock).
bench-cni: deps artifacts
	PODNET_BENCH_ETCD=$(ETCD_ARTIFACT) $(call LOCKED,agent-netns) $(PY) $(ROOT)/tests/bench/bench_cni.py

# The container collector's cost per cycle with 50/200/500 containers (issue 22; root,
# no etcd, namespaces with a sleeping process each, removed at the end).
bench-collect: deps
	$(PY) $(ROOT)/tests/bench/bench_collect.py

# Gateways (issue 11): policy apply at 1000 users x 10 rules (this host, a throwaway netns);
# with a gateway lab (PODNET_E2E_LAB, LAB_GATEWAYS=1) also egress throughput and failover.
bench-gateway: deps
	$(PY) $(ROOT)/tests/bench/bench_gateway.py

# Name privacy's cost per DNS query (issue 22): the CoreDNS artifact with and without the
# privacy plugin, same process, same run (network namespaces of this host, a real etcd).
bench-dns: deps artifacts
	PODNET_BENCH_ETCD=$(ETCD_ARTIFACT) $(PY) $(ROOT)/tests/bench/bench_dns.py

clean:
	rm -rf $(ROOT)/build $(ROOT)/tests/output
