"""Atomic writes of result files for the scripts: a reader sees the old file or the whole new one
(the project's rule for files users care about; runtime/atomic_file.h is the library's)."""
import os
import tempfile


def write_atomically(path, text):
    """Writes `text` to a scratch file beside `path`, flushes it to disk, renames it over `path`
    and flushes the folder, as runtime/atomic_file.cpp does. The scratch file is removed on any
    failure, and the error reaches the caller."""
    folder = os.path.dirname(os.path.abspath(path))
    scratch = tempfile.NamedTemporaryFile("w", dir=folder, delete=False)
    try:
        with scratch:
            scratch.write(text)
            scratch.flush()
            os.fsync(scratch.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(scratch.name, 0o666 & ~umask)  # as an ordinary new file, not the scratch file's 0600
        os.replace(scratch.name, path)
    except BaseException:
        if os.path.exists(scratch.name):
            os.unlink(scratch.name)
        raise
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)  # the rename itself on disk
    finally:
        os.close(descriptor)

