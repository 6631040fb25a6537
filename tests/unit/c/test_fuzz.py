# SPDX-License-Identifier: Apache-2.0
"""A short run of agent/native's fuzz targets (make fuzz), so that CI exercises them:
fuzz_reply (pn_parse_reply) and fuzz_escape (pn_json_escape, the request builder, the
escape/parse round trip), FUZZ_RUNS inputs each, both at once. libFuzzer when clang has it,
else the standalone random-mutation driver under ASan/UBSan (gcc). The long run is
`make fuzz` at the top (FUZZ_SECONDS=60 by default)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from nativelib import cc, make, sanitizers_work

#: a fixed number of inputs per target (FUZZ_RUNS), so that a busy machine does the same
#: work as an idle one (an idle one takes well under a second); FUZZ_SECONDS only caps it
FUZZ_RUNS = 20000
FUZZ_SECONDS = 600


def test_fuzz_targets_short_run(tmp_path: Path) -> None:
    cc()
    if not sanitizers_work(tmp_path):
        pytest.skip("AddressSanitizer/UBSan do not run here")
    res = make(
        f"O={tmp_path}",
        f"FUZZ_SECONDS={FUZZ_SECONDS}",
        f"FUZZ_RUNS={FUZZ_RUNS}",
        "-j2",
        "fuzz",
        timeout=1800,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    summary = re.findall(
        r"^fuzz-(\w+): (libFuzzer|standalone), \d+ s, (\d+) runs, (\d+) exec/s", res.stdout, re.M
    )
    assert sorted(s[0] for s in summary) == ["escape", "reply"], res.stdout
    for target, _engine, runs, _rate in summary:
        assert int(runs) >= FUZZ_RUNS, f"fuzz-{target}: only {runs} runs"
