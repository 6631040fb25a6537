# SPDX-License-Identifier: Apache-2.0
"""conntrackd's flow-state sync statistics in podnet-gatewayd's metrics (issue 37): the
parser of `conntrackd -s` (general, `network`, `queue`), the reader that runs them, and the
metrics they become.

The fixtures in conntrackd/ are conntrackd's own output, captured on a lab's gateways
(LAB_GATEWAYS=1, Debian 13's conntrackd 1.4.8, the role's FT-FW configuration) after pods'
flows went out through gw1: gw1-* from gw1, the master (its flows in the internal cache),
gw2-* from gw2, the backup (gw1's flows injected into its kernel table). gw1-s-statsmode.txt
is the package's own configuration (stats mode, no sync), seen before the role wrote its
own. Debian 12's conntrackd 1.4.7 prints the same format strings (its binary's)."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
from podnet.gateway import conntrackd
from podnet.gateway.conntrackd import Conntrackd, Stats, parse_stats, run_conntrackd
from podnet.gateway.metrics import GatewayCollector
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_gateway_metrics import Gw

FIXTURES = Path(__file__).resolve().parent / "conntrackd"


def fixture(name: str) -> str:
    return (FIXTURES / f"{name}.txt").read_text()


def answers(gw: str) -> dict[tuple[str, ...], str]:
    """The gateway's answers, by the arguments that asked for them."""
    return {
        ("-s",): fixture(f"{gw}-s"),
        ("-s", "network"): fixture(f"{gw}-s-network"),
        ("-s", "queue"): fixture(f"{gw}-s-queue"),
    }


def test_the_master_s_statistics() -> None:
    st = parse_stats("\n".join(answers("gw1").values()))
    assert st.unknown == []
    assert st.synced
    internal = st.caches["internal"]
    assert internal.entries == 4  # the pods' flows out through gw1
    assert internal.changes == {"created": 4, "updated": 20, "destroyed": 0}
    assert internal.failures == {"created": 0, "updated": 0, "destroyed": 0}
    external = st.caches["external"]  # `external inject:` (DisableExternalCache On)
    assert external.entries is None
    assert external.changes == {"created": 0, "updated": 0, "destroyed": 0}
    assert list(st.channels) == ["host0"]
    assert st.channels["host0"] == {  # in -s and -s network (the later counts)
        ("bytes", "sent"): 6768,
        ("bytes", "received"): 5776,
        ("packets", "sent"): 374,
        ("packets", "received"): 361,
        ("errors", "sent"): 0,
        ("errors", "received"): 0,
    }
    assert (st.malformed, st.lost, st.before) == (0, 0, 0)
    assert sorted(st.queues) == ["errorq", "rsqueue", "txqueue"]
    assert st.queues["rsqueue"].maximum == 131072
    assert st.queues["txqueue"].maximum == 2147483647


def test_the_backup_s_statistics_each_answer_alone() -> None:
    s, network, queue = (parse_stats(t) for t in answers("gw2").values())
    for st in (s, network, queue):
        assert st.unknown == []
    assert s.synced
    assert s.caches["internal"].entries == 0  # no flow of its own
    assert s.caches["external"].changes["updated"] == 14  # gw1's, injected
    assert s.channels["host0"][("packets", "received")] == 375
    assert (s.malformed, s.lost, s.before) == (0, 0, None)  # `before` only in -s network
    assert (network.malformed, network.lost, network.before) == (0, 0, 0)
    assert not network.caches and not network.synced
    assert queue.queues["rsqueue"].elements == 1 and not queue.channels  # a control message


def test_a_channel_of_several_and_errors() -> None:
    link = fixture("gw1-s-link")  # `UDP traffic device=host0 status=RUNNING role=ACTIVE:`
    st = parse_stats(link)
    assert st.unknown == []
    assert st.channels["host0"][("bytes", "sent")] == 6960
    backup = link.replace("host0", "eth1").replace("ACTIVE", "BACKUP")
    text = fixture("gw1-s").replace("0 Lost msgs", "7 Lost msgs") + "\n" + backup
    st = parse_stats(text.replace("0 Malformed msgs", "3 Malformed msgs"))
    assert (st.lost, st.malformed) == (7, 3)
    assert sorted(st.channels) == ["eth1", "host0"]


def test_conntrackd_not_in_sync_mode() -> None:
    st = parse_stats(fixture("gw1-s-statsmode"))
    assert st.unknown == []
    assert list(st.caches) == ["stats"]
    assert not st.synced


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        "can't connect: Connection refused\n",
        "cache internal:\ncurrent active connections:\tmany\n",
        "cache internal:\nconnections created:\t\t5\tfailed:\n",
        "UDP traffic (active device=host0):\n   12 Bytes sent   x Bytes recv\n",
        "UDP traffic (active device=host0):\n 2 Bytes recv 1 Kilos sent\n",
        "message tracking:\n 1 Malformed msgs 2 Found msgs\n",
        "queue rsqueue:\ncurrent elements:\t-1\nbogus:\t1\n",
        "\x00\xff binary \ud800",
        "current active connections:\t5\n",  # outside any section
        "cache internal:\ncurrent active connections:\t" + "9" * 5000 + "\n",
        "UDP traffic (active device=host0):\n" + "9" * 5000 + " Bytes sent 1 Bytes recv\n",
    ],
)
def test_malformed_or_empty_text_is_no_statistics(text: str) -> None:
    st = parse_stats(text)
    assert not st.synced
    assert all(line.strip() for line in st.unknown)
    if text.strip():
        assert st.unknown, "a line that says nothing known is reported"


def test_the_parser_never_raises_on_cut_or_mangled_answers() -> None:
    whole = "\n".join(answers("gw1").values())
    rng = random.Random(37)
    for _ in range(500):
        cut = whole[rng.randrange(len(whole)) :][: rng.randrange(1, len(whole))]
        chars = list(cut)
        for _ in range(rng.randrange(4)):
            chars[rng.randrange(len(chars))] = rng.choice("0:\t\n x(=)")
        assert isinstance(parse_stats("".join(chars)), Stats)


# -- the reader and the metrics --------------------------------------------------------------
class Fake:
    """conntrackd's client: the answers given, RuntimeError for the rest."""

    def __init__(self, answers: dict[tuple[str, ...], str]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, ...]] = []

    def __call__(self, args: tuple[str, ...] | list[str], timeout: float) -> str:
        assert timeout == conntrackd.TIMEOUT
        self.asked.append(tuple(args))
        if tuple(args) not in self.answers:
            raise RuntimeError(f"conntrackd {' '.join(args)}: can't connect")
        return self.answers[tuple(args)]


def scrape(ctd: Conntrackd | None, tmp_path: Path) -> tuple[dict[tuple[str, str], float], str]:
    reg = CollectorRegistry()
    reg.register(GatewayCollector(Gw(), str(tmp_path / "fib_trie"), ctd))  # type: ignore[arg-type]
    text = generate_latest(reg).decode()
    got = {
        (s.name, ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name.startswith("podnet_gateway_conntrackd_")
    }
    return got, text


def test_metrics_of_the_master(tmp_path: Path) -> None:
    fake = Fake(answers("gw1"))
    ctd = Conntrackd(fake)
    assert ctd.latest() is None  # not read yet
    assert ctd.read() is not None
    assert fake.asked == [("-s",), ("-s", "network"), ("-s", "queue")]
    got, text = scrape(ctd, tmp_path)
    p = "podnet_gateway_conntrackd_"
    assert got[(f"{p}up", "")] == 1
    assert got[(f"{p}sync_packets_total", "direction=sent")] == 374
    assert got[(f"{p}sync_packets_total", "direction=received")] == 361
    assert got[(f"{p}sync_bytes_total", "direction=sent")] == 6768
    assert got[(f"{p}sync_errors_total", "direction=received")] == 0
    for what in ("lost", "malformed", "before"):
        assert got[(f"{p}sync_messages_{what}_total", "")] == 0
    assert got[(f"{p}cache_entries", "cache=internal")] == 4
    assert (f"{p}cache_entries", "cache=external") not in got  # no external cache
    assert got[(f"{p}cache_changes_total", "cache=internal,change=updated")] == 20
    assert got[(f"{p}cache_failures_total", "cache=external,change=created")] == 0
    assert got[(f"{p}queue_elements", "queue=rsqueue")] == 0
    assert got[(f"{p}queue_full_total", "queue=txqueue")] == 0
    for name in {n for n, _labels in got}:
        assert f"# HELP {name} " in text, name


def test_metrics_when_conntrackd_does_not_answer(tmp_path: Path) -> None:
    ctd = Conntrackd(Fake({}))
    assert ctd.read() is None
    got, _text = scrape(ctd, tmp_path)
    assert got == {("podnet_gateway_conntrackd_up", ""): 0}  # no stale counts
    ctd = Conntrackd(Fake({("-s",): fixture("gw1-s-statsmode")}))  # not syncing
    assert ctd.read() is None
    assert scrape(ctd, tmp_path)[0] == {("podnet_gateway_conntrackd_up", ""): 0}
    ctd = Conntrackd(Fake({("-s",): ""}))
    assert ctd.read() is None
    assert ctd.latest() is None


def test_metrics_when_only_the_general_request_answers(tmp_path: Path) -> None:
    ctd = Conntrackd(Fake({("-s",): fixture("gw2-s")}))
    ctd.read()
    got, _text = scrape(ctd, tmp_path)
    p = "podnet_gateway_conntrackd_"
    assert got[(f"{p}up", "")] == 1
    assert got[(f"{p}sync_packets_total", "direction=received")] == 375
    assert got[(f"{p}cache_changes_total", "cache=external,change=updated")] == 14
    assert (f"{p}sync_messages_before_total", "") not in got
    assert not any(n.startswith(f"{p}queue_") for n, _labels in got)


def test_stale_statistics_are_no_answer(tmp_path: Path) -> None:
    ctd = Conntrackd(Fake(answers("gw1")))
    ctd.read()
    at, st = ctd._latest
    ctd._latest = (at - 4 * conntrackd.INTERVAL - conntrackd.TIMEOUT, st)  # a stuck reader
    assert ctd.latest() is None
    assert scrape(ctd, tmp_path)[0] == {("podnet_gateway_conntrackd_up", ""): 0}
    assert not any(n.startswith("podnet_gateway_conntrackd") for n in scrape(None, tmp_path)[0])


def test_the_reader_thread_reads_until_stopped() -> None:
    fake = Fake(answers("gw1"))
    ctd = Conntrackd(fake, interval=0.01)
    stop = threading.Event()
    t = ctd.start(stop)
    try:
        for _ in range(500):
            if len(fake.asked) >= 6:
                break
            stop.wait(0.01)
        assert len(fake.asked) >= 6  # read twice at least
        assert ctd.latest() is not None
    finally:
        stop.set()
        t.join(5)
    assert not t.is_alive()


def test_run_conntrackd_errors_are_runtime_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"conntrackd -s: .*No such file"):
        run_conntrackd(["-s"], 1)
    tool = tmp_path / "conntrackd"
    tool.write_text(
        "#!/bin/sh\n"
        'case "$2" in\n'
        '  network) echo "can\'t connect: is conntrackd running?" >&2; exit 1;;\n'
        "  queue) exec /bin/sleep 5;;\n"
        "esac\n"
        "echo ok\n"
    )
    tool.chmod(0o755)
    assert run_conntrackd(["-s"], 1) == "ok\n"
    with pytest.raises(RuntimeError, match="conntrackd -s network: can't connect"):
        run_conntrackd(["-s", "network"], 1)
    with pytest.raises(RuntimeError, match=r"conntrackd -s queue: .*timed out"):
        run_conntrackd(["-s", "queue"], 0.2)
