"""Bytes written to the block device that holds a directory (Linux /proc/diskstats).

    dev = BlockDevice.of(".bench-tmp")      # None where it cannot be told (tmpfs, not Linux)
    before = dev.written_bytes()
    ... run ...
    mb_per_s = (dev.written_bytes() - before) / seconds / 1e6

The device is found from the directory's st_dev (major:minor) through
/sys/dev/block; /proc/diskstats counts sectors of 512 bytes whatever the
device's sector size. Everything on that device counts (other processes too),
which is the point: it is what the disk was asked to do while the load ran.
"""
from __future__ import annotations

import os

SECTOR_BYTES = 512


class BlockDevice:
    def __init__(self, name: str):
        self.name = name

    @classmethod
    def of(cls, path: str) -> "BlockDevice | None":
        try:
            st = os.stat(path)
            link = os.readlink(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
        except OSError:
            return None
        dev = cls(os.path.basename(link))
        return dev if dev.written_bytes() is not None else None

    def written_bytes(self) -> int | None:
        """Bytes written to the device since boot (None if it is not in /proc/diskstats)."""
        try:
            with open("/proc/diskstats") as fh:
                for line in fh:
                    fields = line.split()
                    if len(fields) > 9 and fields[2] == self.name:
                        return int(fields[9]) * SECTOR_BYTES  # sectors written
        except OSError:
            return None
        return None
