"""A FUSE filesystem that forgets what was not fsynced when the power is cut (the power-loss test's disk).

Run as ``python tests/integration/powerloss_fs.py BACKING MOUNTPOINT SEED``. Every file and directory lives in
this process's memory in two versions: what programs see, and what is on "disk". ``fsync`` of a file makes its
content durable (the writes since the last fsync, in order); ``fsync`` of a directory makes its entries durable
(names created, renamed or removed in it). Nothing else is: POSIX promises no more, so a program that is correct
here is correct on any filesystem that keeps POSIX's promises.

``mkdir MOUNTPOINT/.power-cut`` cuts the power: the durable version is written to BACKING, plus, for each file,
a random prefix of its unsynced writes, the last one possibly torn (disks write back some of their cache, in
order, before they stop), and the process exits at once. Mounting BACKING again is the machine coming back.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fuse import FUSE, FuseOSError, Operations

POWER_CUT = "/.power-cut"


@dataclass
class Inode:
    directory: bool
    mode: int
    data: bytearray = field(default_factory=bytearray)
    durable: bytearray = field(default_factory=bytearray)
    pending: list[tuple[int, bytes | None, int]] = field(default_factory=list)  # (offset, data, new size)
    mtime: float = field(default_factory=time.time)

    def sync(self) -> None:
        for offset, data, size in self.pending:
            _apply(self.durable, offset, data, size)
        self.pending.clear()


def _apply(content: bytearray, offset: int, data: bytes | None, size: int) -> None:
    if data is None:  # a truncate
        del content[size:]
        content.extend(bytes(size - len(content)))
        return
    if offset > len(content):
        content.extend(bytes(offset - len(content)))
    content[offset:offset + len(data)] = data


class PowerLossFS(Operations):  # type: ignore[misc]
    def __init__(self, backing: Path, seed: int) -> None:
        self.backing = backing
        self.rng = random.Random(seed)
        self.mutex = threading.Lock()
        self.tree: dict[str, Inode] = {"/": Inode(True, stat.S_IFDIR | 0o755)}
        for root, dirs, files in os.walk(backing):
            rel = "/" + os.path.relpath(root, backing).lstrip(".")
            for name in dirs:
                self.tree[_join(rel, name)] = Inode(True, stat.S_IFDIR | 0o755)
            for name in files:
                content = (Path(root) / name).read_bytes()
                self.tree[_join(rel, name)] = Inode(False, stat.S_IFREG | 0o644, bytearray(content),
                                                    bytearray(content))
        self.durable_tree = dict(self.tree)
        self.handles: dict[int, Inode] = {}
        self.next_fh = 1

    # -- the power cut ---------------------------------------------------------------------------------

    def power_cut(self) -> None:
        target = self.backing.with_name(self.backing.name + ".new")
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        for path, inode in sorted(self.durable_tree.items()):
            if path == "/" or not _reachable(path, self.durable_tree):
                continue  # its directory's entry never reached the disk
            if inode.directory:
                (target / path[1:]).mkdir(parents=True, exist_ok=True)
                continue
            content = bytearray(inode.durable)
            kept = self.rng.randint(0, len(inode.pending))
            for i, (offset, data, size) in enumerate(inode.pending[:kept]):
                torn = data is not None and i == kept - 1 and self.rng.random() < 0.5
                _apply(content, offset, data[:self.rng.randint(0, len(data))] if torn and data else data, size)
            (target / path[1:]).parent.mkdir(parents=True, exist_ok=True)
            (target / path[1:]).write_bytes(bytes(content))
        shutil.rmtree(self.backing)
        target.rename(self.backing)
        os._exit(0)

    # -- helpers ----------------------------------------------------------------------------------------

    def _get(self, path: str) -> Inode:
        inode = self.tree.get(path)
        if inode is None:
            raise FuseOSError(errno.ENOENT)
        return inode

    def _handle(self, inode: Inode) -> int:
        fh = self.next_fh
        self.next_fh += 1
        self.handles[fh] = inode
        return fh

    def _inode(self, path: str, fh: int | None) -> Inode:
        return self.handles[fh] if fh else self._get(path)

    # -- operations -------------------------------------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        with self.mutex:
            inode = self._inode(path, fh) if fh in self.handles else self._get(path)
            return {"st_mode": inode.mode, "st_nlink": 2 if inode.directory else 1, "st_size": len(inode.data),
                    "st_mtime": inode.mtime, "st_ctime": inode.mtime, "st_atime": inode.mtime,
                    "st_uid": os.getuid(), "st_gid": os.getgid()}

    def readdir(self, path: str, fh: int) -> list[str]:
        with self.mutex:
            prefix = path.rstrip("/") + "/"
            return [".", "..", *(p[len(prefix):] for p in self.tree
                                 if p.startswith(prefix) and p != prefix and "/" not in p[len(prefix):])]

    def mkdir(self, path: str, mode: int) -> None:
        if path == POWER_CUT:
            with self.mutex:
                self.power_cut()
        with self.mutex:
            if path in self.tree:
                raise FuseOSError(errno.EEXIST)
            self._get(path.rsplit("/", 1)[0] or "/")
            self.tree[path] = Inode(True, stat.S_IFDIR | (mode & 0o7777))

    def rmdir(self, path: str) -> None:
        with self.mutex:
            if any(p.startswith(path + "/") for p in self.tree):
                raise FuseOSError(errno.ENOTEMPTY)
            self._get(path)
            del self.tree[path]

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        with self.mutex:
            self._get(path.rsplit("/", 1)[0] or "/")
            inode = self.tree.get(path)
            if inode is None:
                inode = self.tree[path] = Inode(False, stat.S_IFREG | (mode & 0o7777))
            return self._handle(inode)

    def open(self, path: str, flags: int) -> int:
        with self.mutex:
            return self._handle(self._get(path))

    def opendir(self, path: str) -> int:
        with self.mutex:
            return self._handle(self._get(path))

    def release(self, path: str, fh: int) -> None:
        with self.mutex:
            self.handles.pop(fh, None)

    releasedir = release

    def flush(self, path: str, fh: int) -> None:
        return None

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        with self.mutex:
            return bytes(self._inode(path, fh).data[offset:offset + size])

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self.mutex:
            inode = self._inode(path, fh)
            _apply(inode.data, offset, bytes(data), 0)
            inode.pending.append((offset, bytes(data), 0))
            inode.mtime = time.time()
            return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        with self.mutex:
            inode = self._inode(path, fh)
            _apply(inode.data, 0, None, length)
            inode.pending.append((0, None, length))
            inode.mtime = time.time()

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        with self.mutex:
            self._inode(path, fh).sync()

    def fsyncdir(self, path: str, datasync: int, fh: int) -> None:
        with self.mutex:
            prefix = path.rstrip("/") + "/"

            def child(p: str) -> bool:
                return p.startswith(prefix) and p != prefix and "/" not in p[len(prefix):]

            for p in [p for p in self.durable_tree if child(p)]:
                del self.durable_tree[p]
            for p, inode in self.tree.items():
                if child(p):
                    self.durable_tree[p] = inode

    def unlink(self, path: str) -> None:
        with self.mutex:
            self._get(path)
            del self.tree[path]

    def rename(self, old: str, new: str) -> None:
        with self.mutex:
            inode = self._get(old)
            if inode.directory:
                for p in [p for p in self.tree if p.startswith(old + "/")]:
                    self.tree[new + p[len(old):]] = self.tree.pop(p)
            self.tree.pop(new, None)
            self.tree[new] = self.tree.pop(old)

    def chmod(self, path: str, mode: int) -> None:
        with self.mutex:
            inode = self._get(path)
            inode.mode = (inode.mode & ~0o7777) | (mode & 0o7777)

    def chown(self, path: str, uid: int, gid: int) -> None:
        return None

    def utimens(self, path: str, times: tuple[float, float] | None = None) -> None:
        with self.mutex:
            self._get(path).mtime = times[1] if times else time.time()

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 1 << 20, "f_bfree": 1 << 19,
                "f_bavail": 1 << 19, "f_files": 1 << 16, "f_ffree": 1 << 15, "f_namemax": 255}


def _reachable(path: str, tree: dict[str, Inode]) -> bool:
    parent = path.rsplit("/", 1)[0]
    return not parent or (parent in tree and _reachable(parent, tree))


def _join(directory: str, name: str) -> str:
    return directory.rstrip("/") + "/" + name


if __name__ == "__main__":
    backing, mountpoint, seed = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    backing.mkdir(parents=True, exist_ok=True)
    FUSE(PowerLossFS(backing, seed), mountpoint, foreground=True, nothreads=True)
