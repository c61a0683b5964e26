"""Facts about this process worth printing at the end of a long job."""

import resource
from pathlib import Path


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far.

    Linux's VmHWM belongs to the address space, so it starts fresh at exec; ru_maxrss does not (a tool started
    by a large parent would report the parent's size), so it is only the fallback elsewhere.
    """
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
