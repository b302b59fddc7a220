"""The memory and CPU of the loop's processes, read from ``/proc`` (with their children, the way a
service's engine or model worker belongs to it), and the memory summary of a run (at 10 minutes, at
the end, at most) that the soak reports."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = ["cpu_seconds", "rss_mib", "rss_summary"]


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


def cpu_seconds(pid: int, *, descendants: bool = True) -> float | None:
    """User and system CPU seconds of ``pid`` (and its descendants, living ones), None: it is gone."""
    ticks = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[-1].split()
            stats[int(stat.parent.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)
        except (OSError, ValueError, IndexError):
            continue
    if pid not in stats:
        return None
    if not descendants:
        return round(stats[pid][1], 1)
    children: dict[int, list[int]] = defaultdict(list)
    for child, (parent, _) in stats.items():
        children[parent].append(child)
    total, todo, seen = 0.0, [pid], set()
    while todo:
        current = todo.pop()
        if current in seen or current not in stats:
            continue
        seen.add(current)
        total += stats[current][1]
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
