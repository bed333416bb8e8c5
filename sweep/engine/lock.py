"""An advisory lock on a run folder, so two runs never write one folder at once.

A run (``sweep run``, or ``sweep reduce``) holds ``<dir>/.sweep.lock`` exclusively while it
works; the shards of a job array, which legitimately share a folder, hold it shared and each
holds its own ``.shard-<I>.lock`` exclusively. A second run in the same folder is refused
with a one-line error instead of both "succeeding" with interleaved part files. The lock is
``flock(2)``: released by the kernel when the process ends, however it ends. On a file
system without locks (some Lustre mounts) a warning is printed and the run goes on.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import sys
from pathlib import Path

from ..errors import StoreError

__all__ = ["RunLock", "LOCK_NAME", "holders"]

LOCK_NAME = ".sweep.lock"


class RunLock:
    """Held from :meth:`acquire` until :meth:`release` (or the process ends)."""

    def __init__(self, run_dir: Path, shard: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.shard = shard
        self._fds: list[int] = []

    def _take(self, name: str, exclusive: bool, what: str) -> None:
        path = self.run_dir / name
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StoreError(f"{path}: cannot create the run lock ({exc.strerror})") from None
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
                os.close(fd)
                self.release()
                raise StoreError(f"{self.run_dir}: {what} is using this folder"
                                 + (f" ({holder})" if holder else "")
                                 + "; wait for it to end (a new run can use another --out)"
                                 ) from None
            os.close(fd)
            print(f"sweep: warning: {path}: this file system does not lock files "
                  f"({exc.strerror}); do not start two runs in {self.run_dir} at once",
                  file=sys.stderr)
            return
        if exclusive:  # who holds it, for the message of the one refused (best effort)
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
            except OSError:  # a full disk: the lock holds without the note
                pass
        self._fds.append(fd)

    def acquire(self) -> RunLock:
        """Take the folder lock (shared for a shard, which also takes its own).

        Raises:
            StoreError: another run, shard or reduction holds it.
        """
        if self.shard is None:
            self._take(LOCK_NAME, True, "another sweep run or reduce")
        else:
            self._take(LOCK_NAME, False, "a sweep run or reduce that is not a shard")
            self._take(f".shard-{self.shard}.lock", True, f"another run of shard {self.shard}")
        return self

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def holders(run_dir: Path) -> list[str]:
    """Who works in ``run_dir`` now: a run or reduction holding the folder lock ("pid N on
    HOST"), and each shard holding its own lock ("shard I: pid N on HOST"); empty when
    nobody does (or the file system does not lock). Takes no lock itself."""
    found = []
    names = [LOCK_NAME] + sorted(p.name for p in Path(run_dir).glob(".shard-*.lock"))
    for name in names:
        try:
            fd = os.open(Path(run_dir) / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            # a shared lock fails only against an exclusive holder; the shards hold the
            # folder lock shared, so they show up by their own locks
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                who = os.pread(fd, 200, 0).decode(errors="replace").strip() or "a process"
                shard = name.removeprefix(".shard-").removesuffix(".lock")
                found.append(who if name == LOCK_NAME else f"shard {shard}: {who}")
        finally:
            os.close(fd)
    return found
