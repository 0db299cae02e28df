"""A real kernel mount that a test can make hang, slow down or fail writes: a FUSE server.

A FUSE server that stops answering makes every call on its mount block in the kernel, as a
hard NFS mount whose server is gone does, and the calls return when it answers again. The
server is an in-memory filesystem (`mfusepy` over Debian's libfuse3) run as its own process
(`python -m testbed.fuse MOUNTPOINT CONTROL`), so a hang holds only the callers' threads;
each operation first reads the control file (outside the mount), which holds one mode:

- `ok`: answer at once;
- `hang`: block every operation until the mode changes;
- `slow SECONDS`: answer each operation after that delay;
- `erofs` / `enospc`: fail writes (create, write, mkdir, truncate) with EROFS or ENOSPC;
- `die`: the server exits at the next write (the mount then answers ENOTCONN).

`fuse_mount` mounts it for a test and always unmounts (releasing a hang first). Needs root
and /dev/fuse; `fuse_unavailable` says why a machine cannot.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetwatch.sim.loopback_servers import wait_until

FUSERMOUNT = "fusermount3"
_WRITE_ERRORS = {"erofs": errno.EROFS, "enospc": errno.ENOSPC}


def fuse_unavailable() -> str | None:
    """Why FUSE mounts cannot be made here, or None when they can."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if shutil.which(FUSERMOUNT) is None:
        return "fusermount3 not installed (Debian package fuse3)"
    if os.geteuid() != 0:
        return "FUSE test mounts need root"
    try:
        import mfusepy  # noqa: F401 - only checking it imports (libfuse found)
    except (ImportError, OSError) as exc:
        return f"mfusepy unusable: {exc}"
    return None


@dataclass(frozen=True)
class FuseMount:
    """A mounted test filesystem and the file that steers it."""

    mountpoint: Path
    control: Path

    def set_mode(self, mode: str) -> None:
        """`ok`, `hang`, `slow SECONDS`, `erofs` or `enospc` (atomically replaced)."""
        staging = self.control.with_suffix(".new")
        staging.write_text(mode)
        staging.replace(self.control)


@contextlib.contextmanager
def fuse_mount(workdir: Path) -> Iterator[FuseMount]:
    """Mount the test filesystem under `workdir` as a separate process; always unmounted."""
    mountpoint = workdir / "mnt"
    mountpoint.mkdir(parents=True)
    mount = FuseMount(mountpoint=mountpoint, control=workdir / "control")
    mount.set_mode("ok")
    log = (workdir / "fuse.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "testbed.fuse", str(mountpoint), str(mount.control)],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        wait_until(
            lambda: _mounted(mountpoint) or process.poll() is not None,
            timeout=30,
            what="the FUSE test mount",
        )
        if process.poll() is not None:
            raise RuntimeError(f"FUSE server exited: {(workdir / 'fuse.log').read_text()}")
        yield mount
    finally:
        mount.set_mode("ok")
        subprocess.run([FUSERMOUNT, "-u", "-z", str(mountpoint)], check=False)
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()


def _mounted(mountpoint: Path) -> bool:
    """True once `mountpoint` is listed in this process's mountinfo as a FUSE mount."""
    wanted = str(mountpoint)
    with open("/proc/self/mountinfo") as file:
        for line in file:
            fields = line.split()
            if fields[4] == wanted and " - fuse" in line:
                return True
    return False


class _Control:
    """Reads the mode from the control file for each operation."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def mode(self) -> str:
        try:
            return self._path.read_text().strip()
        except OSError:
            return "ok"  # mid-replace: the previous mode is being swapped out

    def gate(self, *, writes: bool = False) -> None:
        """Block, delay or fail the operation as the mode says."""
        while (mode := self.mode()) == "hang":
            time.sleep(0.05)
        if mode.startswith("slow "):
            time.sleep(float(mode.split()[1]))
        if writes and mode == "die":
            os._exit(1)  # a crash mid-operation, as a FUSE daemon's would be
        if writes and mode in _WRITE_ERRORS:
            from mfusepy import FuseOSError

            raise FuseOSError(_WRITE_ERRORS[mode])


def _operations(control: _Control) -> Any:
    """An in-memory filesystem whose every operation passes `control.gate()` first."""
    from mfusepy import FuseOSError, Operations

    class Memory(Operations):  # type: ignore[misc]
        use_ns = True

        def __init__(self) -> None:
            now = time.time_ns()
            self.lock = threading.Lock()
            self.files: dict[str, bytearray] = {}
            self.dirs: dict[str, dict[str, int]] = {
                "/": {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2, "st_mtime": now}
            }

        def _file_attrs(self, path: str) -> dict[str, int]:
            return {
                "st_mode": stat.S_IFREG | 0o644,
                "st_nlink": 1,
                "st_size": len(self.files[path]),
                "st_mtime": time.time_ns(),
            }

        def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
            control.gate()
            with self.lock:
                if path in self.dirs:
                    return self.dirs[path]
                if path in self.files:
                    return self._file_attrs(path)
            raise FuseOSError(errno.ENOENT)

        def readdir(self, path: str, fh: int) -> list[str]:
            control.gate()
            with self.lock:
                prefix = path.rstrip("/") + "/"
                names = [p[len(prefix) :] for p in (*self.files, *self.dirs) if p != path]
                return [".", "..", *(n for n in names if n and "/" not in n)]

        def mkdir(self, path: str, mode: int) -> int:
            control.gate(writes=True)
            with self.lock:
                self.dirs[path] = {"st_mode": stat.S_IFDIR | mode, "st_nlink": 2}
            return 0

        def rmdir(self, path: str) -> int:
            control.gate()
            with self.lock:
                self.dirs.pop(path, None)
            return 0

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            control.gate(writes=True)
            with self.lock:
                self.files[path] = bytearray()
            return 0

        def open(self, path: str, flags: int) -> int:
            control.gate()
            if path not in self.files:
                raise FuseOSError(errno.ENOENT)
            return 0

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            control.gate(writes=True)
            with self.lock:
                content = self.files[path]
                content[offset : offset + len(data)] = data
            return len(data)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            control.gate()
            with self.lock:
                return bytes(self.files[path][offset : offset + size])

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            control.gate(writes=True)
            with self.lock:
                del self.files[path][length:]
            return 0

        def unlink(self, path: str) -> int:
            control.gate()
            with self.lock:
                self.files.pop(path, None)
            return 0

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            control.gate(writes=True)
            return 0

        def flush(self, path: str, fh: int) -> int:
            control.gate()
            return 0

        def statfs(self, path: str) -> dict[str, int]:
            control.gate()
            used = sum(len(content) for content in self.files.values()) // 4096
            return {
                "f_bsize": 4096,
                "f_frsize": 4096,
                "f_blocks": 262144,
                "f_bfree": 262144 - used,
                "f_bavail": 262144 - used,
                "f_files": 1000,
                "f_ffree": 1000 - len(self.files),
                "f_namemax": 255,
            }

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            control.gate()
            return 0

    return Memory()


def main(argv: list[str]) -> None:
    """`python -m testbed.fuse MOUNTPOINT CONTROL`: serve until unmounted."""
    from mfusepy import FUSE

    mountpoint, control = argv
    FUSE(
        _operations(_Control(Path(control))), mountpoint, foreground=True, fsname="fleetwatch-test"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
