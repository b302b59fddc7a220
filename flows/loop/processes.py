"""The memory and CPU of the loop's processes, read from ``/proc`` (with their children, the way a
service's engine or model worker belongs to it), the memory summary of a run (at 10 minutes, at the end,
at most) that the soak reports, and the cores each process had after warm-up, beside the machine's idle
(:func:`cpu_share`): how much of what the loop's other processes leave its engine gets."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["CpuSample", "cpu_by_root", "cpu_share", "machine_ticks", "rss_mib", "rss_summary"]


def rss_mib(pid: int, *, descendants: bool = True) -> float | None:
    """Resident memory of ``pid`` (and its descendants), in MiB (None: the process is gone)."""
    if not descendants:
        return _own_rss(pid)
    children: dict[int, list[int]] = defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[-1].split()
            children[int(fields[1])].append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    total, todo, seen = 0.0, [pid], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            if current == pid:
                return None
        todo += children.get(current, [])
    return round(total, 1)


def _own_rss(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def rss_summary(samples: dict[str, list[tuple[float, float]]], warm_s: float = 600.0) -> dict[str, Any]:
    """Per process: resident MiB at the first sample after ``warm_s`` (10 minutes), at the end, and at most."""
    out: dict[str, Any] = {}
    for name, points in samples.items():
        if not points:
            continue
        warm = next((mib for at, mib in points if at >= warm_s), None)
        out[name] = {"after_10_min": warm, "last": points[-1][1], "max": max(mib for _, mib in points)}
    return out


#: (seconds into the run, CPU seconds by process name, the machine's (total, idle) ticks)
CpuSample = tuple[float, dict[str, float], tuple[int, int] | None]


def _process_table() -> dict[int, tuple[int, float]]:
    """Every living process: pid -> (parent pid, user + system CPU seconds)."""
    ticks = os.sysconf("SC_CLK_TCK")
    table: dict[int, tuple[int, float]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[-1].split()
            table[int(stat.parent.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)
        except (OSError, ValueError, IndexError):
            continue
    return table


def cpu_by_root(roots: Mapping[str, int], table: Mapping[int, tuple[int, float]] | None = None) -> dict[str, float]:
    """CPU seconds of each named process and its living descendants, from one read of ``/proc``.

    A process counts once, under its nearest named ancestor: the driver (which started the services)
    gets its own children, such as the grading helper, and not the services. A named process that is
    gone gets no entry.
    """
    table = _process_table() if table is None else table
    name_of = {pid: name for name, pid in roots.items() if pid in table}
    out = dict.fromkeys(name_of.values(), 0.0)
    for pid, (_, cpu) in table.items():
        current, hops = pid, 0
        while current not in name_of and current in table and hops < 64:
            current, hops = table[current][0], hops + 1
        if current in name_of:
            out[name_of[current]] += cpu
    return {name: round(cpu, 2) for name, cpu in out.items()}


def machine_ticks() -> tuple[int, int] | None:
    """The machine's (total, idle + iowait) clock ticks since boot, from ``/proc/stat``; None off Linux."""
    try:
        with open("/proc/stat") as stat:
            values = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(values[:8]), values[3] + values[4]) if len(values) >= 5 else None


def cpu_share(
    samples: Sequence[CpuSample], *, since_s: float, cores: int, engine: str = "engine"
) -> dict[str, Any] | None:
    """The cores each process used between the first sample at or after ``since_s`` and the last one,
    the machine's idle cores, the cores used outside the loop (other users, the kernel's threads), and
    ``engine_share_of_left``: the engine's cores over what the loop's other processes left it (``cores``
    less theirs). None with fewer than two such samples, or no engine in both.
    """
    window = [s for s in samples if s[0] >= since_s]
    if len(window) < 2 or window[-1][0] <= window[0][0]:
        return None
    (t0, cpu0, ticks0), (t1, cpu1, ticks1) = window[0], window[-1]
    span = t1 - t0
    if engine not in cpu0 or engine not in cpu1:
        return None
    used = {name: max(0.0, (cpu1[name] - cpu0[name]) / span) for name in cpu1 if name in cpu0}
    engine_cores = used.pop(engine)
    others = sum(used.values())
    idle = None
    if ticks0 is not None and ticks1 is not None and ticks1[0] > ticks0[0]:
        idle = cores * (ticks1[1] - ticks0[1]) / (ticks1[0] - ticks0[0])
    left = cores - others
    return {
        "from_s": round(t0, 1),
        "to_s": round(t1, 1),
        "cores": cores,
        "engine": round(engine_cores, 2),
        "others": round(others, 2),
        "by_process": {name: round(v, 3) for name, v in sorted(used.items(), key=lambda kv: -kv[1])},
        "idle": None if idle is None else round(idle, 2),
        "outside": None if idle is None else round(max(0.0, cores - idle - engine_cores - others), 2),
        "engine_share_of_left": round(engine_cores / left, 3) if left > 0 else None,
    }
