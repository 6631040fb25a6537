#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build the binaries podnet deploys that the OS does not ship, the air-gapped
# way (from the Go module proxy, or an already filled module cache), into
# $PODNET_CACHE_DIR/artifacts/<name>-<version>-linux-amd64 (+ .sha256): the
# layout roles read through podnet_artifact_dir.
# Shipped in the collection (agent/artifacts/): `make artifacts` runs it in a checkout, a site
# from the installed collection on a connected machine (docs/admin-guide.md "Artifacts"):
# root (apt-get download in an isolated apt state), Go in /usr/local/go/bin or on PATH,
# PODNET_CACHE_DIR (default /var/cache/podnet-dev) for the output and the Go caches.
#
# CoreDNS: a slim build of agent/artifacts/coredns (coremain + the plugins podnet
# needs). Skipped when the binary exists and was built from the same inputs.
#
# etcd: the release the lab nodes run (Debian trixie's etcd-server, the etcd
# role's default package), unpacked into $artifacts/etcd-server-<version>/ with
# a stable link $artifacts/etcd-server. The host (bookworm) ships 3.4, about
# twice as slow per transaction operation: the agent tests and benchmark run
# against the version podnet deploys. Fetched once with apt (signatures
# checked) from an isolated trixie source list; the host's apt state is not touched.
#
# apptainer: the Debian package roles/apptainer installs (see fetch_apptainer).
#
# flannel (roles/flannel, HPK's network): flanneld from its Go module at the version pinned
# in roles/flannel/defaults (flannel_version), the Flannel CNI plugin, and Debian's
# containernetworking-plugins .deb (see build_flannel, fetch_cni_plugins).
#
# podnet-kube (HPK, docs/hpk.md): kube-apiserver, kube-controller-manager and kubectl of one
# Kubernetes release in one binary, with the control plane's PKI (agent/artifacts/kube; see
# build_kube). Off the nodes unless a site turns HPK on (podnet_hpk_enabled).
#
# cnitool (tests only; see build_cnitool): the CNI project's reference runtime at CNITOOL_VERSION.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=agent/artifacts/lib.sh
. "$here/lib.sh"
cache=${PODNET_CACHE_DIR:-/var/cache/podnet-dev}
artifacts=$cache/artifacts
export PATH=/usr/local/go/bin:$PATH
export GOMODCACHE=${GOMODCACHE:-$cache/go/mod}
export GOCACHE=${GOCACHE:-$cache/go/build}
export GOFLAGS="-trimpath -mod=readonly -buildvcs=false"
export CGO_ENABLED=0 GOOS=linux GOARCH=amd64 GOTOOLCHAIN=local

command -v go >/dev/null || { echo "build-artifacts: go missing (expected /usr/local/go/bin/go)" >&2; exit 1; }
mkdir -p "$artifacts" "$GOMODCACHE" "$GOCACHE"

build_coredns() {
    local src=$here/coredns version inputs out tmp t0 plugins p
    version=$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" { print $3 }
                   $1 == "github.com/coredns/coredns" { print $2 }' "$src/go.mod" | head -n 1)
    version=${version#v}
    [ -n "$version" ] || { echo "build-artifacts: no github.com/coredns/coredns version in $src/go.mod" >&2; return 1; }
    out=$artifacts/coredns-$version-linux-amd64
    # every Go file of the module (main.go and podnet's own plugins), by name and content
    inputs=$( { cat "$src/go.mod" "$src/go.sum" "${BASH_SOURCE[0]}"; go version
                (cd "$src" && find . -name '*.go' ! -name '*_test.go' | LC_ALL=C sort | xargs -r sha256sum); } \
              | sha256sum | cut -c1-16)
    (
        flock 9
        if [ -x "$out" ] && [ -s "$out.sha256" ] && [ "$(cat "$out.inputs" 2>/dev/null)" = "$inputs" ]; then
            echo "coredns: cached (inputs $inputs)"
        else
            echo "coredns: building $version from the Go module proxy (inputs $inputs)"
            t0=$SECONDS
            tmp=$(mktemp "$artifacts/.coredns.XXXXXX")
            trap 'rm -f "$tmp"' EXIT
            (cd "$src" && go build -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=podnet-slim" \
                -o "$tmp" .)
            plugins=$("$tmp" -plugins)
            # one name a line; older CoreDNS printed "  dns.<name>"
            for p in etcd file forward cache prometheus health ready reload errors log loop hosts whoami privacy; do
                grep -qxE "[[:space:]]*(dns\.)?$p" <<<"$plugins" || {
                    printf 'coredns: built binary lacks plugin %s; -plugins said:\n%s\n' "$p" "$plugins" >&2
                    exit 1
                }
            done
            chmod 0755 "$tmp"
            mv -f "$tmp" "$out"
            (cd "$artifacts" && sha256sum "$(basename "$out")" >"$out.sha256.tmp" && mv -f "$out.sha256.tmp" "$out.sha256")
            echo "$inputs" >"$out.inputs"
            echo "coredns: built in $((SECONDS - t0)) s"
        fi
    ) 9>"$artifacts/.coredns.lock"
    echo "coredns: $out"
    echo "coredns: sha256 $(cut -d' ' -f1 "$out.sha256")"
    echo "coredns: $("$out" -version | tr '\n' ' ')"
}

# podnet-kube: agent/artifacts/kube's module (k8s.io/kubernetes at the version its go.mod
# requires, every staging module replaced by its v0.<minor>.<patch> release: the Go module
# proxy serves k8s.io/kubernetes only that way), ~2,000 packages: about 10 minutes of two
# cores and 2.5 GB of memory the first time, then cached by its inputs like CoreDNS.
build_kube() {
    local src=$here/kube version out inputs tmp t0 minor v pkg ldflags
    version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }
                   $1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2 }' "$src/go.mod" | head -n 1)
    version=${version#v}
    [ -n "$version" ] || { echo "build-artifacts: no k8s.io/kubernetes version in $src/go.mod" >&2; return 1; }
    minor=$(cut -d. -f2 <<<"$version")
    out=$artifacts/podnet-kube-$version-linux-amd64
    inputs=$( { cat "$src/go.mod" "$src/go.sum" "${BASH_SOURCE[0]}"; go version
                (cd "$src" && find . -name '*.go' ! -name '*_test.go' | LC_ALL=C sort | xargs -r sha256sum); } \
              | sha256sum | cut -c1-16)
    ldflags="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        for v in "gitVersion=v$version" gitMajor=1 "gitMinor=$minor" gitTreeState=clean gitCommit=podnet \
                 buildDate=1980-01-01T00:00:00Z; do
            ldflags="$ldflags -X $pkg.$v"
        done
    done
    (
        flock 9
        if [ -x "$out" ] && [ -s "$out.sha256" ] && [ "$(cat "$out.inputs" 2>/dev/null)" = "$inputs" ]; then
            echo "podnet-kube: cached (inputs $inputs)"
        else
            echo "podnet-kube: building Kubernetes $version from the Go module proxy (inputs $inputs)"
            t0=$SECONDS
            tmp=$(mktemp "$artifacts/.podnet-kube.XXXXXX")
            trap 'rm -f "$tmp"' EXIT
            (cd "$src" && go build -ldflags "$ldflags" -o "$tmp" .)
            chmod 0755 "$tmp"
            "$tmp" kubectl version --client 2>&1 | grep -qx "Client Version: v$version" \
                || { echo "podnet-kube: built binary does not say v$version" >&2; exit 1; }
            mv -f "$tmp" "$out"
            (cd "$artifacts" && sha256sum "$(basename "$out")" >"$out.sha256.tmp" && mv -f "$out.sha256.tmp" "$out.sha256")
            echo "$inputs" >"$out.inputs"
            echo "podnet-kube: built in $((SECONDS - t0)) s"
        fi
    ) 9>"$artifacts/.podnet-kube.lock"
    echo "podnet-kube: $out sha256 $(cut -d' ' -f1 "$out.sha256")"
}

# apt_download TMP SUITE SOURCE_OPTIONS PACKAGE...: the packages' amd64 .debs in TMP/deb, by
# an apt of its own (sources, lists and cache under TMP: the host's apt state is not touched;
# signatures checked against the host's Debian keyring). SOURCE_OPTIONS ("" or e.g.
# "[check-valid-until=no]") go in the deb line.
apt_download() {
    local tmp=$1 line="deb ${3:+$3 }http://deb.debian.org/debian $2 main"
    shift 3
    mkdir -p "$tmp/deb"
    apt_private "$tmp" "$line" update >"$tmp/update.log" 2>&1 || { cat "$tmp/update.log" >&2; return 1; }
    (cd "$tmp/deb" && apt_private "$tmp" "$line" download "$@" >"$tmp/download.log" 2>&1) \
        || { cat "$tmp/download.log" >&2; return 1; }
}

fetch_etcd() {
    (
        flock 9
        fetch_etcd_locked
    ) 9>"$artifacts/.etcd.lock"
}

fetch_etcd_locked() {
    local link=$artifacts/etcd-server tmp deb version
    if [ -x "$link/usr/bin/etcd" ]; then
        echo "etcd: cached ($("$link/usr/bin/etcd" --version | head -n 1))"
        return 0
    fi
    tmp=$(mktemp -d "$artifacts/.etcd.XXXXXX")
    trap 'rm -rf "$tmp"' RETURN
    apt_download "$tmp" trixie "" etcd-server || return 1
    deb=$(ls "$tmp"/deb/etcd-server_*.deb)
    version=$(dpkg-deb -f "$deb" Version)
    rm -rf "$artifacts/etcd-server-$version"
    dpkg-deb -x "$deb" "$artifacts/etcd-server-$version"
    ln -sfn "etcd-server-$version" "$link"
    echo "etcd: $("$link/usr/bin/etcd" --version | head -n 1) (Debian $version)"
}

# promtool (tests only, never shipped): Debian trixie's promtool package, unpacked into
# $artifacts/promtool-<version>/ with a stable link $artifacts/promtool; make lint runs
# `promtool check rules` and `promtool test rules` on the alert rules the collection ships.
fetch_promtool() {
    (
        flock 9
        fetch_promtool_locked
    ) 9>"$artifacts/.promtool.lock"
}

fetch_promtool_locked() {
    local link=$artifacts/promtool tmp deb version
    if [ -x "$link/usr/bin/promtool" ]; then
        echo "promtool: cached ($("$link/usr/bin/promtool" --version 2>&1 | head -n 1))"
        return 0
    fi
    tmp=$(mktemp -d "$artifacts/.promtool.XXXXXX")
    trap 'rm -rf "$tmp"' RETURN
    apt_download "$tmp" trixie "" promtool || return 1
    deb=$(ls "$tmp"/deb/promtool_*.deb)
    version=$(dpkg-deb -f "$deb" Version)
    rm -rf "$artifacts/promtool-$version"
    dpkg-deb -x "$deb" "$artifacts/promtool-$version"
    ln -sfn "promtool-$version" "$link"
    echo "promtool: $("$link/usr/bin/promtool" --version 2>&1 | head -n 1) (Debian $version)"
}

# etcd for nodes without a Debian etcd 3.5 (Debian 12 ships 3.4.23; podnet needs 3.5): the
# etcd role's `artifact` method takes etcd-v<version>-linux-amd64.tar.gz, the layout of
# etcd's own release tarballs (etcd, etcdctl, etcdutl under etcd-v<version>-linux-amd64/).
# etcd's GitHub releases are out of reach here, so the tarball is made from Debian trixie's
# etcd-server and etcd-client packages of that version (statically built Go: they run on
# Debian 12), reproducibly (sorted, owner 0, the packages' mtimes, gzip -n), + .sha256 for
# etcd_sha256. A site with etcd's own tarball uses that one and its checksum instead.
fetch_etcd_release() {
    (
        flock 9
        fetch_etcd_release_locked
    ) 9>"$artifacts/.etcd.lock"
}

fetch_etcd_release_locked() {
    local tmp deb version up name out
    out=$(find "$artifacts" -maxdepth 1 -name 'etcd-v*-linux-amd64.tar.gz' | sort | tail -n 1)
    if [ -n "$out" ] && [ -s "$out.sha256" ]; then
        echo "etcd release tarball: cached ($(basename "$out"))"
        return 0
    fi
    tmp=$(mktemp -d "$artifacts/.etcdrel.XXXXXX")
    trap 'rm -rf "$tmp"' RETURN
    apt_download "$tmp" trixie "" etcd-server etcd-client || return 1
    deb=$(ls "$tmp"/deb/etcd-server_*.deb)
    version=$(dpkg-deb -f "$deb" Version)
    up=${version%%-*}
    name=etcd-v$up-linux-amd64
    mkdir -p "$tmp/x" "$tmp/t/$name"
    for deb in "$tmp"/deb/etcd-server_*.deb "$tmp"/deb/etcd-client_*.deb; do dpkg-deb -x "$deb" "$tmp/x"; done
    for b in etcd etcdctl etcdutl; do
        [ -x "$tmp/x/usr/bin/$b" ] || { echo "etcd release tarball: no $b in Debian's etcd $version" >&2; return 1; }
        cp -p "$tmp/x/usr/bin/$b" "$tmp/t/$name/$b"
    done
    touch -r "$tmp/x/usr/bin/etcd" "$tmp/t/$name"
    out=$artifacts/$name.tar.gz
    tar -C "$tmp/t" --sort=name --owner=0 --group=0 --numeric-owner -cf - "$name" | gzip -n -9 >"$out.tmp"
    mv -f "$out.tmp" "$out"
    (cd "$artifacts" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256.tmp" && mv -f "$name.tar.gz.sha256.tmp" "$name.tar.gz.sha256")
    echo "etcd release tarball: $name.tar.gz (Debian $version) sha256 $(cut -d' ' -f1 "$out.sha256")"
}

# Apptainer: the Debian package roles/apptainer installs (apptainer_version), from sid
# (trixie has none; its dependencies are all in trixie and in the lab image), as
# $artifacts/apptainer_<version>_amd64.deb + .sha256. Same isolated apt as etcd.
fetch_apptainer() {
    (
        flock 9
        # sid's Release files may be past Valid-Until between the archive's updates
        fetch_deb sid apptainer "$(role_default apptainer apptainer_version)" "[check-valid-until=no]"
    ) 9>"$artifacts/.apptainer.lock"
}

# role_default ROLE VAR: a scalar default of roles/ROLE/defaults/main.yml
role_default() {
    awk -v k="$2:" '$1 == k { gsub(/"/, "", $2); print $2 }' "$here/../../roles/$1/defaults/main.yml"
}

# go_artifact NAME VERSION PKG@VERSION LDFLAGS: `go install` of a main package from the Go
# module proxy into $artifacts/NAME-VERSION-linux-amd64 (+ .sha256). Cached by its inputs.
go_artifact() {
    local name=$1 version=$2 pkg=$3 ldflags=$4 out inputs tmp t0
    out=$artifacts/$name-$version-linux-amd64
    inputs=$( { echo "$pkg $ldflags"; cat "${BASH_SOURCE[0]}"; go version; } | sha256sum | cut -c1-16)
    (
        flock 9
        if [ -x "$out" ] && [ -s "$out.sha256" ] && [ "$(cat "$out.inputs" 2>/dev/null)" = "$inputs" ]; then
            echo "$name: cached (inputs $inputs)"
        else
            echo "$name: building $pkg from the Go module proxy (inputs $inputs)"
            t0=$SECONDS
            tmp=$(mktemp -d "$artifacts/.$name.XXXXXX")
            trap 'rm -rf "$tmp"' EXIT
            # go install PKG@VERSION builds the module as released (its own go.mod and go.sum)
            GOBIN=$tmp GOFLAGS="-trimpath -buildvcs=false" go install -ldflags "-s -w $ldflags" "$pkg"
            chmod 0755 "$tmp"/*
            mv -f "$tmp"/* "$out"
            (cd "$artifacts" && sha256sum "$(basename "$out")" >"$out.sha256.tmp" && mv -f "$out.sha256.tmp" "$out.sha256")
            echo "$inputs" >"$out.inputs"
            echo "$name: built in $((SECONDS - t0)) s"
        fi
    ) 9>"$artifacts/.$name.lock"
    echo "$name: $out sha256 $(cut -d' ' -f1 "$out.sha256")"
}

# flanneld: flannel's own main package (main.go of github.com/flannel-io/flannel at
# flannel_version, read from the module cache) built in agent/artifacts/flannel's module (go.mod,
# go.sum pinned) without the backends podnet does not use: tencentvpc needs a module the Go
# module proxy we reach refuses (403), udp needs cgo; ipsec and wireguard go too (slimmer,
# fewer dependencies). vxlan, host-gw, ipip, alloc and extension stay; `flanneld --version`.
# The Flannel CNI plugin: upstream now develops it as github.com/flannel-io/cni-plugin, which
# that proxy also refuses (every version); the same plugin's last release inside the CNI
# project, github.com/containernetworking/plugins/plugins/meta/flannel v0.9.1 (CNI spec up
# to 0.4.0), is there, and is what this builds (docs/hpk.md).
build_flannel() {
    local version cni_version src=$here/flannel mod out inputs tmp t0 dropped
    version=$(role_default flannel flannel_version)
    cni_version=$(role_default flannel flannel_cni_version)
    if [ -z "$version" ] || [ -z "$cni_version" ]; then
        echo "build-artifacts: no flannel_version/flannel_cni_version in roles/flannel/defaults/main.yml" >&2
        return 1
    fi
    grep -qE "^(require )?[[:space:]]*github.com/flannel-io/flannel v$version\$" "$src/go.mod" \
        || { echo "build-artifacts: $src/go.mod does not require flannel v$version (flannel_version)" >&2; return 1; }
    out=$artifacts/flanneld-$version-linux-amd64
    inputs=$( { cat "$src/go.mod" "$src/go.sum" "${BASH_SOURCE[0]}"; go version; } | sha256sum | cut -c1-16)
    (
        flock 9
        if [ -x "$out" ] && [ -s "$out.sha256" ] && [ "$(cat "$out.inputs" 2>/dev/null)" = "$inputs" ]; then
            echo "flanneld: cached (inputs $inputs)"
        else
            echo "flanneld: building $version from the Go module proxy (inputs $inputs)"
            t0=$SECONDS
            tmp=$(mktemp -d "$artifacts/.flanneld.XXXXXX")
            trap 'rm -rf "$tmp"' EXIT
            mod=$(cd "$src" && go mod download -json "github.com/flannel-io/flannel@v$version" \
                  | awk -F'"' '$2 == "Dir" { print $4 }')
            cp "$src/go.mod" "$src/go.sum" "$tmp/"
            grep -v -E '"github.com/flannel-io/flannel/pkg/backend/(ipsec|tencentvpc|udp|wireguard)"' \
                "$mod/main.go" >"$tmp/main.go"
            dropped=$(( $(wc -l <"$mod/main.go") - $(wc -l <"$tmp/main.go") ))
            [ "$dropped" = 4 ] || { echo "flanneld: expected to drop 4 backend imports, dropped $dropped" >&2; exit 1; }
            (cd "$tmp" && go build -ldflags "-s -w -X github.com/flannel-io/flannel/pkg/version.Version=v$version" \
                -o "$tmp/flanneld" .)
            "$tmp/flanneld" --version 2>&1 | grep -qx "v$version" \
                || { echo "flanneld: built binary does not say v$version" >&2; exit 1; }
            mv -f "$tmp/flanneld" "$out"
            (cd "$artifacts" && sha256sum "$(basename "$out")" >"$out.sha256.tmp" && mv -f "$out.sha256.tmp" "$out.sha256")
            echo "$inputs" >"$out.inputs"
            echo "flanneld: built in $((SECONDS - t0)) s"
        fi
    ) 9>"$artifacts/.flanneld.lock"
    echo "flanneld: $out sha256 $(cut -d' ' -f1 "$out.sha256")"
    go_artifact flannel-cni "$cni_version" \
        "github.com/containernetworking/plugins/plugins/meta/flannel@v$cni_version" \
        "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=v$cni_version"
}

# cnitool: the CNI project's command-line runtime (libcni: ADD, CHECK, DEL, GC, STATUS), for the
# conformance test of the podnet CNI plugin (tests/e2e/test_cni.py copies it onto the lab
# nodes). Not deployed by any role: Apptainer is the runtime on the nodes (docs/hpk.md).
# $artifacts/cnitool links to the pinned build.
CNITOOL_VERSION=1.3.0
build_cnitool() {
    go_artifact cnitool "$CNITOOL_VERSION" \
        "github.com/containernetworking/cni/cnitool@v$CNITOOL_VERSION" ""
    ln -sfn "cnitool-$CNITOOL_VERSION-linux-amd64" "$artifacts/cnitool"
}

# Debian's containernetworking-plugins (bridge, host-local, loopback, portmap: what the
# Flannel CNI plugin delegates to), as $artifacts/containernetworking-plugins_<v>_amd64.deb.
fetch_cni_plugins() {
    (
        flock 9
        fetch_deb trixie containernetworking-plugins "$(role_default flannel flannel_cni_plugins_version)"
    ) 9>"$artifacts/.cni-plugins.lock"
}

# fetch_deb SUITE PACKAGE VERSION [SOURCE_OPTIONS]: $artifacts/PACKAGE_VERSION_amd64.deb +
# .sha256 (isolated apt; SOURCE_OPTIONS such as "[check-valid-until=no]" go in the deb line)
fetch_deb() {
    local suite=$1 pkg=$2 version=$3 options=${4:-} deb tmp
    [ -n "$version" ] || { echo "build-artifacts: no version for $pkg" >&2; return 1; }
    deb=$artifacts/${pkg}_${version}_amd64.deb
    if [ -s "$deb" ] && [ -s "$deb.sha256" ]; then
        echo "$pkg: cached ($(basename "$deb"))"
        return 0
    fi
    tmp=$(mktemp -d "$artifacts/.$pkg.XXXXXX")
    trap 'rm -rf "$tmp"' RETURN
    apt_download "$tmp" "$suite" "$options" "$pkg=$version" \
        || { echo "$pkg: $version not in $suite" >&2; return 1; }
    mv -f "$tmp"/deb/"${pkg}"_*_amd64.deb "$deb"
    (cd "$artifacts" && sha256sum "$(basename "$deb")" >"$deb.sha256.tmp" && mv -f "$deb.sha256.tmp" "$deb.sha256")
    echo "$pkg: $(basename "$deb") sha256 $(cut -d' ' -f1 "$deb.sha256")"
}

build_coredns
build_kube
fetch_etcd
fetch_etcd_release
fetch_promtool
fetch_apptainer
build_flannel
fetch_cni_plugins
build_cnitool
