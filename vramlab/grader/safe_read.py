"""Read a file that a submission may have tampered with, without ever blocking or reading too much.

The grader (outside the sandbox) reads files back from a grading's folder: each rank's
result-N.json, the tails of stdout and stderr. The learner's code could write into that folder, so
at the moment the parent reads, the name may stand for anything:

- a named pipe (FIFO): a plain `open()` for reading waits until some process opens it for writing,
  and once the sandbox is killed none ever will: the grader hangs forever;
- a symbolic link, resolved by the parent on the host: to `/dev/zero` (a read never ends and
  fills the memory), to `/proc/self/fd/0` (the grader's own terminal), to any file of the
  instructor's (a forged result kept elsewhere);
- a socket, a device, a folder;
- a regular file that is huge, sparse (a terabyte of apparent size and no blocks at all) or still
  growing while it is read.

`read(path, limit)` answers all of them with one rule: open first, then ask the opened file.

    fd = os.open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)

- O_NOFOLLOW: the last component may not be a symbolic link (the open fails with ELOOP); the
  folders above it are the grader's own;
- O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer (and a device is not
  waited on either); O_NOCTTY: a terminal never becomes ours;
- then `os.fstat(fd)`: the checks are made on the file that was opened, not on the name, which
  the submission could swap between a check and the open (TOCTOU). Anything but a regular file
  is refused;
- `st_size` above the limit is refused before a byte is read (the sparse file), and the read
  itself never asks for more than limit + 1 bytes, so a file that grows after the fstat is
  caught as too large instead of being read without end.

A refusal raises `UnsafeFile` with a Chinese reason ("不是普通文件（命名管道）"); the caller names
the file ("结果文件") and decides what it means (for a result file: the learner's doing, 0 points).
A missing file raises FileNotFoundError as usual.
"""
from __future__ import annotations

import errno
import os
import stat

from ..units import fmt_bytes

FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
CHUNK = 1 << 20
_KINDS_ZH = ((stat.S_ISFIFO, "命名管道"), (stat.S_ISSOCK, "套接字"), (stat.S_ISCHR, "字符设备"),
             (stat.S_ISBLK, "块设备"), (stat.S_ISDIR, "文件夹"), (stat.S_ISLNK, "符号链接"))


class UnsafeFile(OSError):
    """The file is not one the grader reads: `reason` (Chinese) says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


def kind_zh(mode: int) -> str:
    return next((name for test, name in _KINDS_ZH if test(mode)), "特殊文件")


def _too_large_zh(size: int, limit: int) -> str:
    a, b = fmt_bytes(size), fmt_bytes(limit)
    if a == b:                          # just over the limit: the rounded sizes would read alike
        a, b = f"{size:,} 字节", f"{limit:,} 字节"
    return f"大得不正常（{a}，上限 {b}）"


def read(path, limit: int, *, tail: bool = False, follow_symlinks: bool = False) -> bytes:
    """At most `limit` bytes of the regular file at `path`, never blocking.

    `tail=False`: the whole file, or UnsafeFile if it is (or grows) larger than `limit`.
    `tail=True`: its last `limit` bytes, whatever its size (a log's tail).
    `follow_symlinks=True` only for a path the instructor gave (a submission), never for a file
    in a grading's folder. Raises UnsafeFile (not a regular file, a symbolic link, too large),
    FileNotFoundError, or another OSError."""
    flags = FLAGS if follow_symlinks else FLAGS | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK) and not follow_symlinks:   # EMLINK: the BSDs' answer
            raise UnsafeFile("是符号链接（评分器不跟随链接）") from None
        if e.errno == errno.ENXIO:          # a unix socket (or a FIFO's other flavour of "no one there")
            raise UnsafeFile("不是普通文件（套接字）") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"不是普通文件（{kind_zh(st.st_mode)}）")
        if tail:
            start, want = max(0, st.st_size - limit), limit
        elif st.st_size > limit:
            raise UnsafeFile(_too_large_zh(st.st_size, limit))
        else:
            start, want = 0, limit + 1       # one byte more than allowed: a file that grew is caught
        chunks, got = [], 0
        while got < want:
            chunk = os.pread(fd, min(CHUNK, want - got), start + got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    if not tail and got > limit:
        raise UnsafeFile(f"大得不正常（读取时还在变大，超过上限 {fmt_bytes(limit)}）")
    return b"".join(chunks)


__all__ = ["UnsafeFile", "read", "kind_zh"]
