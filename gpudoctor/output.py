"""``-o FILE``: where a report, a comparison or a SARIF file is written, the way a careful Unix tool does.

One helper for every command (``report``, ``analyze``, ``check``, ``profile``, ``compare``,
``verify``). What happens depends on what the path names, never on its spelling:

- **a regular file, or a new path**: written to a temporary name beside it, flushed to disk,
  renamed into place (a reader never sees half a report; a failure leaves the old file as it
  was). An existing file keeps its permission bits (and, as root, its owner).
- **a symlink**: followed to its target, which is written as above; the link stays a link.
  A dangling link creates its target, as the shell's ``>`` does.
- **an open descriptor** (``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``, ``/proc/self/fd/N``):
  opened and written through, whatever it leads to (a pipe, a terminal, the file the shell
  redirected to). Replacing the file behind a descriptor would leave the shell's own descriptor
  on an unlinked copy.
- **a FIFO or a character device** (``/dev/null``, ``/dev/full``, a terminal): opened and written
  through, never replaced. A FIFO with no reader yet is waited for, with one line that says so.
- **a folder, a block device or a socket**: refused, nothing touched.

A temporary file that a write killed by SIGKILL left beside its target (``.NAME.PID.tmp``, its
process gone) is removed by the next write of that target (``remove_stale_temporaries``).

Every failure is a one-line :class:`UsageError` (exit 2) with the path and the system's reason:
``-o /dev/full`` gives "No space left on device" and leaves the device a device.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

from gpudoctor.errors import UsageError

_MAX_HOPS = 40  # symlinks followed before ELOOP, as the kernel's own limit


def os_reason(err: OSError) -> str:
    """The system's reason with its errno name: ``No space left on device (ENOSPC)``."""
    name = errno.errorcode.get(err.errno or 0, "")
    return f"{err.strerror or err}" + (f" ({name})" if name else "")


def _in_proc(path: str) -> bool:
    return path == "/proc" or path.startswith("/proc/")


def through_descriptor(path: str) -> bool:
    """Does ``path`` lead through ``/proc`` (``/dev/stdout`` → ``/proc/self/fd/1``, ``/dev/fd/3``)?

    Such a path names an open descriptor of this process: the kernel resolves it, not its text
    (a pipe's link reads ``pipe:[1234]``), so it must be opened, never resolved and replaced.
    """
    p = os.path.abspath(path)
    for _ in range(_MAX_HOPS):
        parent = os.path.realpath(os.path.dirname(p))
        if _in_proc(parent):
            return True
        full = os.path.join(parent, os.path.basename(p))
        if not os.path.islink(full):
            return _in_proc(full)
        p = os.path.join(parent, os.readlink(full))  # an absolute link replaces the parent
    return False


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return ""


class Target:
    """What ``-o PATH`` names, looked at once: ``write`` (through) or ``replace`` (atomic), or refused."""

    def __init__(self, path: str) -> None:
        self.given = path
        self.through = False  # opened and written, not replaced
        self.mode: int | None = None  # the existing regular file's st_mode
        self.owner: tuple[int, int] | None = None
        if not path:
            raise UsageError("-o: an empty path; pass a file name")
        if through_descriptor(path):
            self.path = path
            self.through = True
            return
        try:
            st = os.stat(path)  # follows symlinks
        except FileNotFoundError:
            st = None
        except OSError as err:  # ELOOP, ENOTDIR, EACCES on a parent
            raise UsageError(f"-o {path}: cannot write there: {os_reason(err)}; pass -o with a writable path") from None
        if st is not None:
            refused = _kind(st.st_mode)
            if refused:
                raise UsageError(f"-o {path}: is {refused}, not a file; pass a file name")
            if not stat.S_ISREG(st.st_mode):  # a FIFO or a character device: written through
                self.path = path
                self.through = True
                return
            self.mode = stat.S_IMODE(st.st_mode)
            self.owner = (st.st_uid, st.st_gid)
        # a regular file or a new path: the link's target (a dangling link's too) is replaced, the link kept
        self.path = os.path.realpath(path)

    # ----------------------------------------------------------------------- checks before a long run

    def check_writable(self) -> None:
        """Can it be written at all? Tried without writing: a FIFO is not opened, a device not written."""
        if self.through:
            if not os.access(self.path, os.W_OK):
                raise UsageError(f"-o {self.given}: cannot write the report there: Permission denied; "
                                 "pass -o with a writable path")
            return
        probe = _beside(self.path, "probe")
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as err:
            raise UsageError(f"-o {self.given}: cannot write the report there: {os_reason(err)}; "
                             "pass -o with a writable path") from None
        os.close(fd)
        _unlink_quietly(probe)

    # ----------------------------------------------------------------------- the write

    def write(self, text: str, what: str, say: Callable[[str], None] | None = None) -> None:
        data = text.encode("utf-8")
        try:
            if self.through:
                self._write_through(data, say)
            else:
                self._replace(data)
        except OSError as err:
            raise UsageError(f"-o {self.given}: cannot write the {what}: {os_reason(err)}; "
                             "pass -o with a writable path") from None

    def _write_through(self, data: bytes, say: Callable[[str], None] | None) -> None:
        flags = os.O_WRONLY | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags | os.O_NONBLOCK)
        except OSError as err:
            if err.errno != errno.ENXIO:  # ENXIO: a FIFO that no one reads yet
                raise
            if say is not None:
                say(f"gpudoctor: -o {self.given} is a FIFO with no reader yet: waiting for one (Ctrl-C stops)")
            fd = os.open(self.path, flags)
        try:
            fl = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, fl & ~os.O_NONBLOCK)  # a full pipe waits for its reader
            _write_all(fd, data)
            try:
                os.fsync(fd)
            except OSError as err:  # pipes, terminals and /dev/null cannot be synced: nothing was lost
                if err.errno not in (errno.EINVAL, errno.EROFS, errno.ENOTSUP, errno.EBADF):
                    raise
        finally:
            os.close(fd)

    def _replace(self, data: bytes) -> None:
        remove_stale_temporaries(self.path)
        tmp = _beside(self.path, "tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
            try:
                if self.mode is not None:
                    os.fchmod(fd, self.mode)
                    if self.owner is not None and os.geteuid() == 0:
                        try:
                            os.fchown(fd, *self.owner)
                        except OSError:
                            pass
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except BaseException:
            _unlink_quietly(tmp)
            raise


def _beside(path: str, what: str) -> str:
    head, name = os.path.split(path)
    return os.path.join(head, f".{name}.{os.getpid()}.{what}")


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a process of ours to judge: left alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


def remove_stale_temporaries(path: str) -> list[str]:
    """Remove what a write of ``path`` killed by SIGKILL left beside it: ``.NAME.PID.tmp`` (exactly
    that pattern: the name, a process id, ``tmp``), a regular file (not a symlink), whose process is
    gone (or is this one: a pid reused; its O_EXCL write would fail on it). Another live process's (a
    write in progress) and anything else are left alone. The names removed."""
    head, name = os.path.split(path)
    pattern = re.compile(rf"\.{re.escape(name)}\.([0-9]{{1,10}})\.tmp")
    removed: list[str] = []
    try:
        entries = os.listdir(head or ".")
    except OSError:
        return removed
    for entry in entries:
        m = pattern.fullmatch(entry)
        # this process's own is stale too (it writes one file at a time, and not yet): a pid reused
        if m is None or (int(m.group(1)) != os.getpid() and _pid_alive(int(m.group(1)))):
            continue
        full = os.path.join(head, entry)
        try:
            if not stat.S_ISREG(os.lstat(full).st_mode):
                continue
            os.unlink(full)
        except OSError:
            continue
        removed.append(full)
    return removed


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def write_output(path: str | Path, text: str, what: str = "report", say: Callable[[str], None] | None = None) -> None:
    """Write ``text`` to ``-o PATH`` (see the module's docstring); a one-line ``UsageError`` when it cannot."""
    Target(str(path)).write(text, what, say)


def replace_file(path: str | Path, data: bytes, what: str = "file") -> None:
    """Replace a regular file's bytes the way ``-o`` replaces a report (written beside it, flushed, renamed
    into place; its mode kept, a symlink followed and kept): ``gpudoctor check --fix``. Anything but a
    regular file is refused; every failure is a one-line ``UsageError``."""
    target = Target(str(path))
    if target.through or target.mode is None:
        raise UsageError(f"{path}: not a regular file; the {what} was not written")
    try:
        target._replace(data)
    except OSError as err:
        raise UsageError(f"{path}: cannot write the {what}: {os_reason(err)}") from None


def check_output_writable(path: str | Path | None) -> None:
    """Before a long run: can ``-o PATH`` be written at all? (exit 2 now, rather than after the run)."""
    if path:
        Target(str(path)).check_writable()
