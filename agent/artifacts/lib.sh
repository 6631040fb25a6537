# shellcheck shell=bash
# SPDX-License-Identifier: Apache-2.0
# What the artifact builders share (sourced by agent/artifacts/*.sh and agent/native/
# build-artifact.sh; each hashes this file into its cache key with its own text).

# apt_private DIR SOURCES_LINE [-o OPTION]... COMMAND ARGS...: apt-get with a sources list,
# lists and cache of its own under DIR (the host's apt state is not touched; signatures checked
# against the host's Debian keyring unless the line says otherwise), for amd64.
apt_private() {
    local dir=$1 line=$2
    shift 2
    mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
    echo "$line" >"$dir/sources.list"
    apt-get -q -o "Dir::Etc::SourceList=$dir/sources.list" -o "Dir::Etc::SourceParts=$dir/none" \
        -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache" -o "APT::Sandbox::User=root" \
        -o "Debug::NoLocking=1" -o "APT::Architecture=amd64" "$@"
}

# rootfs_dir ROOTFS WORK: prints a directory holding the root file system ROOTFS: ROOTFS itself
# when it is a directory, else WORK/rootfs, where the .tar.zst/.tar.gz/.tar is unpacked.
rootfs_dir() {
    local rootfs=$1 root=$2/rootfs
    if [ -d "$rootfs" ]; then
        echo "$rootfs"
        return
    fi
    mkdir -p "$root"
    case "$rootfs" in
        *.zst) tar -C "$root" --numeric-owner -I zstd -xpf "$rootfs" ;;
        *) tar -C "$root" --numeric-owner -xpf "$rootfs" ;;
    esac
    echo "$root"
}

# rootfs_id ROOTFS: what identifies ROOTFS's contents for a cache key (its package database's
# time when a directory; its name, size and time when an archive)
rootfs_id() {
    if [ -d "$1" ]; then stat -c '%n %Y' "$1/var/lib/dpkg/status"; else stat -c '%n %s %Y' "$1"; fi
}
