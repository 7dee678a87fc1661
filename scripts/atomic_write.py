"""Atomic writes of result files for the scripts: a reader sees the old file or the whole new one
(the project's rule for files users care about; runtime/atomic_file.h is the library's)."""
import os
import tempfile


def write_atomically(path, text):
    """Writes `text` to a scratch file beside `path`, flushes it to disk, then renames it over
    `path`. The scratch file is removed on failure; OSError reaches the caller."""
    folder = os.path.dirname(os.path.abspath(path))
    with tempfile.NamedTemporaryFile("w", dir=folder, delete=False) as scratch:
        try:
            scratch.write(text)
            scratch.flush()
            os.fsync(scratch.fileno())
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(scratch.name, 0o666 & ~umask)  # as an ordinary new file, not the scratch file's 0600
        except OSError:
            os.unlink(scratch.name)
            raise
    try:
        os.replace(scratch.name, path)
    except OSError:
        os.unlink(scratch.name)
        raise

