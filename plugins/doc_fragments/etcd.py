# Copyright (c) podnet developers
# Apache License 2.0 (see galaxy.yml)
# SPDX-License-Identifier: Apache-2.0
"""Options shared by the hpc.podnet etcd modules (etcd v3 JSON gateway over TLS)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  endpoints:
    description:
      - etcd client URLs (C(https://host:port)), tried in order until one answers.
      - The modules speak etcd's v3 JSON gateway (C(/v3/...)), which etcd 3.4 and later serve
        on the client port.
    type: list
    elements: str
    default: ['https://127.0.0.1:2379']
  ca_cert:
    description:
      - CA certificate (PEM) that signed the etcd server certificates.
    type: path
    default: /etc/podnet/pki/ca.crt
  client_cert:
    description:
      - Client certificate (PEM) presented to etcd (etcd runs with C(--client-cert-auth)).
    type: path
    default: /etc/podnet/pki/admin.crt
  client_key:
    description:
      - Private key (PEM, unencrypted) of O(client_cert).
    type: path
    default: /etc/podnet/pki/admin.key
  timeout:
    description:
      - Seconds to wait for one HTTP request to one endpoint.
    type: float
    default: 10.0
  login_user:
    description:
      - etcd user to log in as (C(/v3/auth/authenticate)) when etcd authentication is on.
      - etcd's JSON gateway ignores the client certificate's common name once authentication
        is on, so requests need a token. While authentication is off no token is needed and
        this is ignored.
    type: str
  login_password:
    description:
      - Password of O(login_user).
    type: str
  login_password_file:
    description:
      - File on the managed node whose first line is the password of O(login_user), when
        O(login_password) is not given (the etcd role keeps the admin's there, mode 0600).
      - A missing file means no password.
    type: path
notes:
  - Needs no Python package on the managed node beyond Ansible itself (requests go through
    C(ansible.module_utils.urls)).
  - Transient etcd errors (leader change, request timed out) are retried on the next endpoint,
    except for membership changes, which are never sent twice.
  - In check mode, when a file of O(ca_cert), O(client_cert) or O(client_key) does not exist
    (etcd not deployed yet, for instance a first C(site.yml --check)), the module does not
    fail but reports changed (a reading module, nothing found) with a C(msg) saying so and
    C(not_deployed=true). Outside check mode the missing file fails the task.
"""

    # What every etcd module shares beyond check and diff mode, which each module describes
    ATTRIBUTES = r"""
options: {}
attributes:
  action_group:
    description:
      - Use C(group/hpc.podnet.etcd) in C(module_defaults) to set the connection options
        (O(endpoints), O(ca_cert), O(client_cert), O(client_key), ...) once for all of them.
    support: full
    membership:
      - hpc.podnet.etcd
  idempotent:
    description:
      - A second run with the same arguments changes nothing and reports no change.
    support: full
  platform:
    description: Runs on the managed node and talks to etcd over HTTPS.
    support: full
    platforms: posix
"""
