#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The CDF of pod setup latency, podnet against the CNI bridge plugin, from `make bench-agent`.

    plot_cdf.py [build/bench/agent.json] [-o docs/img/pod-setup-cdf.svg]

Reads the raw samples bench_agent.py keeps in its JSON (`extra.samples_ms`: `pod_setup`,
`cni_bridge`, and the `_loaded` runs when there are any: CPU-bound neighbours on every
core) and draws one CDF per series: podnet in blue, the CNI bridge plugin in orange, the
loaded runs dashed. What each sample covers is in docs/bench.md (podnet: the request on
podnetd's socket to the pod ready, its etcd allocation included; CNI: the plugin's ADD
with host-local IPAM, on a netns made before).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from svgplot import Cdf, cdf_chart

ROOT = Path(__file__).resolve().parents[2]
PODNET, CNI = "#1f77b4", "#ff7f0e"
SERIES = [
    ("pod_setup", "podnet", PODNET, False),
    ("cni_bridge", "CNI bridge + host-local", CNI, False),
    ("pod_setup_loaded", "podnet, loaded", PODNET, True),
    ("cni_bridge_loaded", "CNI bridge, loaded", CNI, True),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="?", default=str(ROOT / "build/bench/agent.json"))
    ap.add_argument("-o", "--out", default=str(ROOT / "docs/img/pod-setup-cdf.svg"))
    ap.add_argument("--xmax", type=float, default=None, help="cut the x axis here (ms)")
    args = ap.parse_args(argv)
    data = json.loads(Path(args.json).read_text())
    samples = data.get("extra", {}).get("samples_ms") or {}
    series = [
        Cdf(label, samples[key], color, dashed)
        for key, label, color, dashed in SERIES
        if samples.get(key)
    ]
    if not series:
        print(f"plot_cdf: no extra.samples_ms in {args.json}", file=sys.stderr)
        return 1
    when = data.get("time", "")
    load = data.get("host", {}).get("loadavg_1_5_15_start")
    title = f"Pod setup latency, podnet against the CNI bridge plugin ({when[:16]}"
    title += f", load {load[0]})" if load else ")"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(cdf_chart(title, "pod setup time (ms)", series, args.xmax))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
