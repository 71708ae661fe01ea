"""Was a round disturbed by other processes? CPU time used by others during the round.

From ``/proc/stat``'s ``cpu`` line (all CPUs, in clock ticks): busy = user + nice + system + irq +
softirq + steal (everything but idle and iowait; ``guest`` is already inside ``user``); from
``/proc/self/stat``: this process's utime + stime (all its threads). Over a round, others' CPU
time = Δbusy − Δown (``steal``, the hypervisor running someone else, counts as others), quoted
as a fraction of the capacity of all CPUs over the round (Δ of every field). A round whose
others' share is above ``DISTURBED_SHARE`` is flagged: it ran next to other work, so its figures
are suspect (on a 2-core VM another process busy on one core is a 50 % share).

Caveat: ``/proc/stat`` counts the CPUs the kernel sees; in a container with a cpuset it is the
host's, so the share is of the whole host.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Others' share of all CPUs' time above which a round is flagged as disturbed.
DISTURBED_SHARE = 0.10


@dataclass(frozen=True)
class CpuTimes:
    """One sample, in clock ticks: every CPU's time (``total``), of which busy, and this
    process's own user + system time."""

    total: int
    busy: int
    own: int


def parse_proc_stat(text: str) -> tuple[int, int]:
    """(total, busy) ticks from ``/proc/stat``'s aggregate ``cpu`` line."""
    for line in text.splitlines():
        f = line.split()
        if f and f[0] == "cpu":
            v = [int(x) for x in f[1:9]]  # user nice system idle iowait irq softirq steal
            v += [0] * (8 - len(v))
            total = sum(v)
            return total, total - v[3] - v[4]
    raise ValueError("no aggregate 'cpu' line in /proc/stat")


def parse_self_stat(text: str) -> int:
    """utime + stime ticks from ``/proc/self/stat`` (fields 14 and 15; the command name in
    parentheses may hold spaces, so fields are counted after the last ``)``)."""
    rest = text.rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])  # rest[0] is field 3 (state)


def sample() -> CpuTimes | None:
    """Now, or None where ``/proc`` cannot be read (not Linux)."""
    try:
        total, busy = parse_proc_stat(Path("/proc/stat").read_text())
        own = parse_self_stat(Path("/proc/self/stat").read_text())
    except (OSError, ValueError, IndexError):
        return None
    return CpuTimes(total, busy, own)


def disturbance(
    before: CpuTimes | None,
    after: CpuTimes | None,
    *,
    threshold: float = DISTURBED_SHARE,
    hz: int | None = None,
) -> dict[str, Any]:
    """Others' CPU time between two samples: ``others_cpu_s``, ``own_cpu_s``, ``others_share``
    (of all CPUs' time), ``disturbed`` (share above ``threshold``; None when not measured)."""
    if before is None or after is None:
        return {"others_cpu_s": None, "own_cpu_s": None, "others_share": None, "disturbed": None}
    hz = hz or os.sysconf("SC_CLK_TCK")
    d_total = after.total - before.total
    d_own = after.own - before.own
    others = max(0, (after.busy - before.busy) - d_own)
    share = others / d_total if d_total > 0 else 0.0
    return {
        "others_cpu_s": others / hz,
        "own_cpu_s": d_own / hz,
        "others_share": share,
        "disturbed": share > threshold,
    }
