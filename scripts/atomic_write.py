"""Atomic writes of result files for the scripts: a reader sees the old file or the whole new one
(the project's rule for files users care about; runtime/atomic_file.h is the library's)."""
import os
import stat
import sys
import tempfile


def may_replace_in(folder_mode, folder_uid, file_uid, euid):
    """Whether a process of `euid` may rename a file over one of `file_uid` in a folder of
    `folder_mode` and `folder_uid`: in a sticky folder (/tmp) only the file's owner, the folder's
    or root may (runtime/atomic_file.cpp's rule)."""
    return not folder_mode & stat.S_ISVTX or euid in (0, folder_uid, file_uid)


def target_of(path):
    """The file a write to `path` replaces: a symbolic link is written through (the file it names
    is replaced, the link stays), as runtime/atomic_file.cpp does. Raises OSError when that is
    something other than a regular file (a pipe, a device, a directory), which a rename would
    replace, when it is read-only (kept, as a plain write would keep it), or when its folder is
    missing or takes no new files, or when a link on the way leads into /proc (/dev/stdout,
    /dev/fd/N: a process's open file, which a rename cannot write into and would replace), or
    when it belongs to another user in a sticky folder such as /tmp (the rename at the end of a
    run would be refused there, however writable the file)."""
    hop = path
    for _ in range(40):
        if not os.path.islink(hop):
            break
        folder = os.path.realpath(os.path.dirname(hop) or ".")
        if folder == "/proc" or folder.startswith("/proc/"):
            raise OSError(f"{path} is a process's open file ({os.path.join(folder, os.path.basename(hop))}): "
                          "give a file name")
        link = os.readlink(hop)
        hop = link if os.path.isabs(link) else os.path.join(os.path.dirname(hop), link)
    target = os.path.realpath(path)
    if os.path.isdir(target):
        raise OSError(f"{path} is a directory")
    if os.path.lexists(target) and not stat.S_ISREG(os.stat(target).st_mode):
        raise OSError(f"{path} is not a regular file")
    if os.path.lexists(target) and (not os.access(target, os.W_OK) or os.stat(target).st_mode & 0o222 == 0):
        raise OSError(f"{path} is read-only")  # no write bit at all: kept, also by root
    folder = os.path.dirname(target)
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
        raise OSError(f"cannot write in {folder}")
    if os.path.lexists(target):
        folder_status, target_status = os.stat(folder), os.stat(target)
        if not may_replace_in(folder_status.st_mode, folder_status.st_uid, target_status.st_uid, os.geteuid()):
            raise OSError(f"{path} belongs to another user in the sticky directory {folder}, where only its "
                          "owner may replace it")
    return target


def write_atomically(path, text):
    """Writes `text` to a scratch file beside the file `path` names (target_of), flushes it to
    disk, renames it over that file and flushes the folder, as runtime/atomic_file.cpp does. The
    scratch file is removed on any failure, and the error reaches the caller."""
    target = target_of(path)
    folder = os.path.dirname(target)
    scratch = tempfile.NamedTemporaryFile("w", dir=folder, delete=False)
    try:
        with scratch:
            scratch.write(text)
            scratch.flush()
            os.fsync(scratch.fileno())
        if os.path.exists(target):  # a replaced file keeps its permissions (a private one stays private)
            os.chmod(scratch.name, stat.S_IMODE(os.stat(target).st_mode) & 0o777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(scratch.name, 0o666 & ~umask)  # as an ordinary new file, not the scratch file's 0600
        os.replace(scratch.name, target)
    except BaseException:
        if os.path.exists(scratch.name):
            os.unlink(scratch.name)
        raise
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)  # the rename itself on disk
    finally:
        os.close(descriptor)


def keep_partial(output, text, program, what):
    """After a failed run: `text` (what it finished) goes to OUTPUT.partial, beside --output, which
    stays as it was; says where on stderr, naming `what` it holds (a write that fails is said too)."""
    partial = output + ".partial"
    try:
        write_atomically(partial, text)
        print(f"{program}: {what} before it are in {partial}", file=sys.stderr)
    except OSError as error:
        print(f"{program}: cannot write {partial}: {error}", file=sys.stderr)
