"""CPU seconds of a process tree (a loader and its workers), read from Linux's /proc."""

from __future__ import annotations

import os
from collections import defaultdict


def cpu_seconds(root: int, exclude: tuple[int, ...] = ()) -> float:
    """User + system CPU seconds of process ``root`` and its live descendants, with the
    children each has reaped; the subtrees of ``exclude`` (servers the benchmark runs,
    not the loader's) are left out."""
    children, own = defaultdict(list), {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
        except OSError:  # gone meanwhile
            continue
        fields = text[text.rindex(")") + 2 :].split()  # state, ppid, ... (proc(5))
        pid = int(entry)
        children[int(fields[1])].append(pid)
        own[pid] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in exclude or pid not in own:
            continue
        total += own[pid]
        todo += children[pid]
    return total / os.sysconf("SC_CLK_TCK")
