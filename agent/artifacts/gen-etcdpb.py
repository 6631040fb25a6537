# SPDX-License-Identifier: Apache-2.0
"""Regenerate agent/src/podnet/state/etcdpb/_descriptor.py: etcd's gRPC API (the KV, Watch,
Lease, Maintenance and Auth services of etcdserverpb, with mvccpb and authpb) as a
serialized protobuf FileDescriptorSet, from the .proto files of etcd's own Go module.

    python3 agent/artifacts/gen-etcdpb.py [ETCD_API_VERSION]     (default: the version below)

Needs `go` (the .proto files come from the Go module proxy: `go mod download
go.etcd.io/etcd/api/v3@<version>`) and `grpcio-tools` (protoc) in the running Python. The
gogoproto options and the grpc-gateway annotations are stripped (they only steer etcd's Go
code generation and its JSON gateway); comments are not kept. The output is the same bytes
for the same inputs (tests/unit/python/test_etcdpb.py checks the committed file loads and
names the services podnet calls).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

VERSION = "v3.5.16"
ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "agent/src/podnet/state/etcdpb/_descriptor.py"
FILES = {
    "mvccpb/kv.proto": "kv.proto",
    "authpb/auth.proto": "auth.proto",
    "etcdserverpb/rpc.proto": "rpc.proto",
}
PKG = "podnet/state/etcdpb"


def strip(src: str) -> str:
    src = re.sub(r'import "(gogoproto/gogo|google/api/annotations)\.proto";\n', "", src)
    src = re.sub(r"option \(gogoproto\.[a-z_]+\) = [a-z]+;\n", "", src)
    src = re.sub(r"\s*\[\(gogoproto\.[^\]]*\]", "", src)
    out, i, tag = [], 0, "option (google.api.http) = {"
    while (j := src.find(tag, i)) >= 0:  # nested braces: skip to the matching one
        out.append(src[i:j])
        k, depth = j + len(tag), 1
        while depth:
            depth += {"{": 1, "}": -1}.get(src[k], 0)
            k += 1
        i = src.index(";", k) + 1
    out.append(src[i:])
    src = "".join(out)
    for old, new in FILES.items():
        src = src.replace(f'import "etcd/api/{old}";', f'import "{PKG}/{new}";')
    return src


def main() -> int:
    version = sys.argv[1] if len(sys.argv) > 1 else VERSION
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GOFLAGS": "-mod=mod", "GO111MODULE": "on"}
        info = subprocess.run(
            ["go", "mod", "download", "-json", f"go.etcd.io/etcd/api/v3@{version}"],
            cwd=tmp,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        src_dir = Path(json.loads(info.stdout)["Dir"])
        inc = Path(tmp, "inc")
        (inc / PKG).mkdir(parents=True)
        for old, new in FILES.items():
            (inc / PKG / new).write_text(strip((src_dir / old).read_text()))
        fds = Path(tmp, "etcd.pb")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{inc}",
                "--include_imports",
                f"--descriptor_set_out={fds}",
                f"{PKG}/rpc.proto",
            ],
            check=True,
        )
        data = base64.b64encode(fds.read_bytes()).decode()
    body = "\n".join(textwrap.wrap(data, 88))
    OUT.write_text(
        "# SPDX-License-Identifier: Apache-2.0\n"
        f'"""etcd {version} gRPC API (etcdserverpb, mvccpb, authpb): a serialized protobuf\n'
        "FileDescriptorSet, generated from etcd's .proto files by agent/artifacts/gen-etcdpb.py\n"
        '(do not edit; run that script)."""\n\n'
        f'VERSION = "{version}"\n'
        f'DATA = """\n{body}\n"""\n'
    )
    print(f"wrote {OUT} ({len(data)} base64 characters, etcd {version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
