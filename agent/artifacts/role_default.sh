# shellcheck shell=bash
# SPDX-License-Identifier: Apache-2.0
# Sourced by bundle.sh and build-debian-packages.sh (not by the builders that hash lib.sh into
# their cache keys): the artifact names the roles look for, read from the roles' defaults, so
# the scripts and the roles cannot name different files.
#
# role_default ROLE VAR: the value of a one-line default in $roles/ROLE/defaults/main.yml, its
# {{ X }} references to other defaults of the same file resolved (coredns-{{ coredns_version }}-...).
# Needs $roles (the collection's roles directory) and a die function.
role_default() {
    local v ref
    # shellcheck disable=SC2154 # $roles: set by the script that sources this file
    v=$(sed -n "s/^$2: *//p" "$roles/$1/defaults/main.yml" | head -n 1 | sed -E 's/^"(.*)"$/\1/')
    [ -n "$v" ] || die "roles/$1/defaults/main.yml has no $2"
    while [[ $v =~ \{\{\ *([a-z0-9_]+)\ *\}\} ]]; do
        ref=$(role_default "$1" "${BASH_REMATCH[1]}")
        v=${v//"${BASH_REMATCH[0]}"/$ref}
    done
    printf '%s\n' "$v"
}
