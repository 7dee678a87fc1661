#include "runtime/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace quiver {

namespace {

// Writes all of `text` to `fd` and flushes it to the disk; false (errno set) on failure.
bool write_and_sync(int fd, const std::string& text) {
  const char* data = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t wrote = ::write(fd, data, left);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) return false;
    data += wrote;
    left -= static_cast<size_t>(wrote);
  }
  return ::fsync(fd) == 0;
}

// Creates a new temporary file in `directory` (O_EXCL): `name` gets its name, the result is its
// descriptor, or -1 with errno set. The name is short whatever the target's (a target whose name
// is as long as the file system allows still gets one) and holds the process id and a counter;
// two processes of the same id (in two PID namespaces, or a killed one's leftover) meet as
// EEXIST, and the next counter is tried.
std::string temporary_name(const std::string& directory) {
  static std::atomic<uint64_t> serial{0};
  return cat(directory, "/.quiver-tmp.", ::getpid(), ".", serial.fetch_add(1));
}

int create_temporary(const std::string& directory, std::string& name) {
  for (int attempt = 0;; ++attempt) {
    name = temporary_name(directory);
    const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0 || errno != EEXIST || attempt == 64) return fd;
  }
}

// A file with no name yet in `directory` (O_TMPFILE), or -1 where the kernel or the file system
// has none: a process stopped while it writes (Ctrl-C during a save) then leaves nothing behind,
// where a named temporary file stayed, hidden, as large as the file it was to replace.
int create_unnamed(const std::string& directory) {
#ifdef O_TMPFILE
  return ::open(directory.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
#else
  (void)directory;
  errno = EOPNOTSUPP;
  return -1;
#endif
}

// Names the unnamed file `fd` in `directory` (a fresh temporary name, set in `name`), through
// /proc/self/fd (linkat's AT_EMPTY_PATH needs a capability); false where that fails.
bool name_unnamed(int fd, const std::string& directory, std::string& name) {
  const std::string self = cat("/proc/self/fd/", fd);
  for (int attempt = 0; attempt <= 64; ++attempt) {
    name = temporary_name(directory);
    if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) == 0) return true;
    if (errno != EEXIST) return false;
  }
  return false;
}

// The directory `target` is in ("." for a bare name).
std::string directory_of(const std::filesystem::path& target) {
  const std::filesystem::path parent = target.parent_path();
  return parent.empty() ? "." : parent.string();
}

// The file a write to `path` replaces: a symbolic link (or a chain of them) is followed to what it
// names, so the link stays and its target gets the text, as a plain write through it would. A
// link in /proc (where /dev/stdout and /dev/fd/N lead: a process's open file) is refused: a
// rename cannot write into an open file, and would replace the file the process writes to.
std::filesystem::path write_target(const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  if (path.empty()) throw Error(cat(what, ": empty file name"));
  if (path.back() == '/') throw Error(cat(what, ": '", path, "' names a directory, not a file"));
  fs::path target = path;
  for (int hops = 0; hops < 40; ++hops) {
    std::error_code error;
    if (!fs::is_symlink(fs::symlink_status(target, error))) return target;
    const fs::path where = fs::weakly_canonical(directory_of(target), error);  // /dev/fd: a link into /proc
    if (!error && (where == "/proc" || where.string().rfind("/proc/", 0) == 0))
      throw Error(cat(what, ": '", path, "' is a process's open file (", (where / target.filename()).string(),
                      "), which a rename cannot write into: give a file name"));
    const fs::path next = fs::read_symlink(target, error);
    if (error) throw Error(cat(what, ": cannot read the link '", target.string(), "': ", error.message()));
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  throw Error(cat(what, ": '", path, "': too many levels of symbolic links"));
}

// Gives the new file `fd` the permissions of the file it replaces, if there is one: a checkpoint
// its owner made private stays private (a new file is created 0644 less the umask). Best effort:
// where it fails the file keeps the mode it was created with, as before.
void keep_mode_of(const std::filesystem::path& target, int fd) {
  struct stat existing{};
  if (::stat(target.c_str(), &existing) == 0 && S_ISREG(existing.st_mode)) ::fchmod(fd, existing.st_mode & 0777);
}

// Refuses a target that exists and must not be replaced: rename() would put a regular file in
// place of a device, a pipe or a socket (as root, even /dev/null), and a file made read-only (to
// keep it) would be replaced behind its owner's back, as a rename in a writable directory allows:
// one this user may not write, and one nobody may (no write bit at all, which root's access()
// would not see).
void refuse_to_replace(const std::filesystem::path& target, const std::string& path, const std::string& what) {
  std::error_code error;
  if (std::filesystem::exists(target, error) && !std::filesystem::is_regular_file(target, error))
    throw Error(cat(what, ": '", path, "' is not a regular file"));
  if (struct stat file{}; ::stat(target.c_str(), &file) == 0 &&
      ((file.st_mode & 0222) == 0 || (::access(target.c_str(), W_OK) != 0 && errno == EACCES)))
    throw Error(cat(what, ": cannot replace '", path, "': it is read-only"));
}

// Whether `error`, from looking up a path, says only that it is not there (or a component of it is
// not a directory): anything else (a name too long, no permission to search, an I/O error) is a
// reason of its own, to be reported as it is.
bool only_missing(const std::error_code& error) {
  return !error || error == std::errc::no_such_file_or_directory || error == std::errc::not_a_directory;
}

}  // namespace

std::string atomic_write_target(const std::string& path, const std::string& what) {
  return write_target(path, what).string();
}

void write_file_atomically(const std::string& path, const std::string& text, const std::string& what) {
  const std::filesystem::path target = write_target(path, what);
  // Checked again here, not only up front (check_writable): a library caller may not have called
  // it, and a file may have been made read-only since.
  refuse_to_replace(target, path, what);
  const std::string directory = directory_of(target);
  std::string temporary;
  // The text goes to an unnamed file, named only once it is on the disk; where there is none (or
  // it cannot be named), to a named temporary file from the start.
  if (const int unnamed = create_unnamed(directory); unnamed >= 0) {
    keep_mode_of(target, unnamed);
    const bool written = write_and_sync(unnamed, text);
    const int write_errno = errno;
    const bool named = written && name_unnamed(unnamed, directory, temporary);
    const bool closed = ::close(unnamed) == 0;
    if (!written) throw Error(cat(what, ": writing '", path, "' failed: ", std::strerror(write_errno)));
    if (named && !closed) {
      const int close_errno = errno;
      ::unlink(temporary.c_str());
      throw Error(cat(what, ": writing '", path, "' failed: ", std::strerror(close_errno)));
    }
    if (!named) temporary.clear();
  }
  if (temporary.empty()) {
    const int fd = create_temporary(directory, temporary);
    if (fd < 0) throw Error(cat(what, ": cannot write '", path, "': ", std::strerror(errno)));
    keep_mode_of(target, fd);
    const bool written = write_and_sync(fd, text);
    const int write_errno = errno;
    const bool closed = ::close(fd) == 0;
    if (!written || !closed) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      throw Error(cat(what, ": writing '", path, "' failed: ", std::strerror(written ? errno : write_errno)));
    }
  }
  std::error_code error;
  std::filesystem::rename(temporary, target, error);
  if (error) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw Error(cat(what, ": cannot move '", temporary, "' to '", path, "': ", error.message()));
  }
  // The rename itself is durable once the directory is synced (best effort: some file systems
  // refuse to open a directory for it).
  if (const int dir = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

bool may_replace_in(unsigned directory_mode, unsigned directory_owner, unsigned file_owner, unsigned user) {
  if (!(directory_mode & S_ISVTX)) return true;
  return user == 0 || user == file_owner || user == directory_owner;
}

void check_writable(const std::string& path, const std::string& what) {
  if (path.empty()) throw Error(cat(what, ": empty file name"));
  std::error_code error;
  // A lookup of the path itself that fails is looked into below: its directory's lookup names
  // the reason, and a name too long for the file system is checked against the directory's limit.
  if (std::filesystem::is_directory(path, error)) throw Error(cat(what, ": '", path, "' is a directory"));
  const std::filesystem::path target = write_target(path, what);
  const std::string directory = directory_of(target);
  const std::filesystem::file_status directory_type = std::filesystem::status(directory, error);
  if (!only_missing(error))
    throw Error(cat(what, ": cannot write '", path, "': directory '", directory, "': ", error.message()));
  if (!std::filesystem::is_directory(directory_type))
    throw Error(cat(what, ": cannot write '", path, "': directory '", directory,
                    std::filesystem::exists(directory_type) ? "' is not a directory" : "' does not exist"));
  refuse_to_replace(target, path, what);
  // In a sticky directory (/tmp) only the file's owner, the directory's or root may replace it:
  // the rename at the end of a run would be refused, even for a file anyone may write to.
  struct stat directory_status{}, target_status{};
  if (::stat(directory.c_str(), &directory_status) == 0 && ::stat(target.c_str(), &target_status) == 0 &&
      !may_replace_in(directory_status.st_mode, directory_status.st_uid, target_status.st_uid, ::geteuid()))
    throw Error(cat(what, ": cannot replace '", path, "': it belongs to another user in the sticky directory '",
                    directory, "', where only its owner may replace it"));
  const long name_max = ::pathconf(directory.c_str(), _PC_NAME_MAX);
  if (name_max > 0 && static_cast<long>(target.filename().string().size()) > name_max)
    throw Error(cat(what, ": cannot write '", path, "': the file name is longer than the ", name_max,
                    " characters '", directory, "' allows"));
  // The temporary file is created in `directory` and renamed there: create one now and remove it.
  // (access() is not enough: root may "write" /proc and /sys, which refuse new files.)
  std::string probe;
  const int fd = create_temporary(directory, probe);
  if (fd < 0)
    throw Error(cat(what, ": cannot write '", path, "': cannot create files in '", directory, "': ",
                    std::strerror(errno)));
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace quiver
