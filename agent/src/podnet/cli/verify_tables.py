# SPDX-License-Identifier: Apache-2.0
"""`podnet verify`'s output: truth tables in the format of Kubernetes' network-policy e2e
suite (`.` reachable, `X` blocked, `-` not probed, `?` no result), and the report that
compares the expected tables with the observed ones (`report`, verify's exit status)."""

from __future__ import annotations

from podnet.cli.verify_model import PROTOCOLS

# -- truth tables (Kubernetes' netpol e2e format) -------------------------------------------


class TruthTable:
    """An n x n table of ordered pairs: True (reachable), False (blocked), None (not
    probed); a pair without a value prints `?`."""

    def __init__(self, items: list[str]) -> None:
        self.items = items
        self.values: dict[tuple[str, str], bool | None] = {}

    def set(self, src: str, dst: str, value: bool | None) -> None:
        if src not in self.items or dst not in self.items:
            raise KeyError(f"{src} -> {dst}: not an endpoint")
        self.values[(src, dst)] = value

    def get(self, src: str, dst: str) -> bool | None:
        return self.values[(src, dst)]

    def has(self, src: str, dst: str) -> bool:
        return (src, dst) in self.values

    def compare(self, other: TruthTable) -> TruthTable:
        """`.` where both tables agree (a pair probed in neither agrees), `X` where not,
        `?` where one has no value."""
        out = TruthTable(self.items)
        for a in self.items:
            for b in self.items:
                if self.has(a, b) and other.has(a, b):
                    out.set(a, b, self.get(a, b) == other.get(a, b))
        return out

    def pretty(self, aligned: bool = False) -> str:
        """Kubernetes' layout: tab-separated; `aligned`: the same, padded with spaces (for
        an output that shows tabs as `\\t`, as Ansible's does)."""
        rows = [["-", *self.items]]
        for a in self.items:
            row = [a]
            for b in self.items:
                v = self.values.get((a, b), "?")
                row.append("?" if v == "?" else "-" if v is None else "." if v else "X")
            rows.append(row)
        if not aligned:
            return "\n".join("\t".join(r) for r in rows)
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
        )


def summary(expected: TruthTable, observed: TruthTable) -> tuple[int, int, TruthTable]:
    """(correct, incorrect, comparison); a missing observation counts as incorrect."""
    cmp = expected.compare(observed)
    right = sum(1 for a in cmp.items for b in cmp.items if cmp.values.get((a, b)) is True)
    return right, len(cmp.items) ** 2 - right, cmp


def report(
    observed: dict[str, TruthTable], expected: dict[str, TruthTable], aligned: bool = False
) -> int:
    wrong_total = 0
    for proto in PROTOCOLS:
        right, wrong, cmp = summary(expected[proto], observed[proto])
        wrong_total += wrong
        print(f"=== {proto.upper()}")
        print(f"reachability: correct:{right}, incorrect:{wrong}, result={str(wrong == 0).lower()}")
        print()
        for title, table in (
            ("expected", expected[proto]),
            ("observed", observed[proto]),
            ("comparison", cmp),
        ):
            print(f"{title}:\n\n{table.pretty(aligned)}\n\n")
    for proto in PROTOCOLS:
        exp, obs = expected[proto], observed[proto]
        for a in exp.items:
            for b in exp.items:
                e = exp.values.get((a, b), "?")
                o = obs.values.get((a, b), "?")
                if e != o:
                    show = {True: ".", False: "X", None: "-", "?": "?"}
                    print(f"MISMATCH {proto} {a} -> {b}: expected {show[e]}, observed {show[o]}")
    n = len(next(iter(expected.values())).items)
    if wrong_total:
        print(f"podnet verify: FAILED: {wrong_total} of {3 * n * n} cells differ")
        return 1
    print(f"podnet verify: ok: observed = expected ({3 * n * n} cells, {n} endpoints)")
    return 0
