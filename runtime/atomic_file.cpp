#include "runtime/atomic_file.h"

#include <fcntl.h>
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

// `prefix` with the process id and a counter: no two writers (two processes, or two threads of
// one) share the name.
std::string unique_name(const std::string& prefix) {
  static std::atomic<uint64_t> serial{0};
  return cat(prefix, ::getpid(), ".", serial.fetch_add(1));
}

// A temporary file's name in `directory`: short whatever the target's name, so a target whose
// name is as long as the file system allows still gets one.
std::string temporary_in(const std::string& directory) { return unique_name(directory + "/.quiver-tmp."); }

// The file a write to `path` replaces: a symbolic link (or a chain of them) is followed to what it
// names, so the link stays and its target gets the text, as a plain write through it would. A
// link into /proc (/dev/stdout, /dev/fd/N) names a process's open file, which a rename cannot
// write into: refused.
std::filesystem::path write_target(const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  fs::path target = path;
  for (int hops = 0; hops < 40; ++hops) {
    std::error_code error;
    if (hops > 0 && target.string().rfind("/proc/", 0) == 0)
      throw Error(cat(what, ": '", path, "' is a link to a process's open file (", target.string(),
                      "), which a rename cannot write into: give a file name"));
    if (!fs::is_symlink(fs::symlink_status(target, error))) return target;
    const fs::path next = fs::read_symlink(target, error);
    if (error) throw Error(cat(what, ": cannot read the link '", target.string(), "': ", error.message()));
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  throw Error(cat(what, ": '", path, "': too many levels of symbolic links"));
}

std::string directory_of(const std::filesystem::path& target) {
  const std::filesystem::path parent = target.parent_path();
  return parent.empty() ? "." : parent.string();
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& text, const std::string& what) {
  const std::filesystem::path target = write_target(path, what);
  const std::string directory = directory_of(target);
  const std::string temporary = temporary_in(directory);
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(cat(what, ": cannot write '", path, "': ", std::strerror(errno)));
  const bool written = write_and_sync(fd, text);
  const int write_errno = errno;
  const bool closed = ::close(fd) == 0;
  if (!written || !closed) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw Error(cat(what, ": writing '", path, "' failed: ", std::strerror(written ? errno : write_errno)));
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

void check_writable(const std::string& path, const std::string& what) {
  if (path.empty()) throw Error(cat(what, ": empty file name"));
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) throw Error(cat(what, ": '", path, "' is a directory"));
  const std::filesystem::path target = write_target(path, what);
  const std::string directory = directory_of(target);
  if (!std::filesystem::is_directory(directory, error))
    throw Error(cat(what, ": cannot write '", path, "': directory '", directory, "' does not exist"));
  // rename() would put a regular file in place of a device, a pipe or a socket (as root, even
  // /dev/null): only a regular file is replaced.
  if (std::filesystem::exists(target, error) && !std::filesystem::is_regular_file(target, error))
    throw Error(cat(what, ": '", path, "' is not a regular file"));
  const long name_max = ::pathconf(directory.c_str(), _PC_NAME_MAX);
  if (name_max > 0 && static_cast<long>(target.filename().string().size()) > name_max)
    throw Error(cat(what, ": cannot write '", path, "': the file name is longer than the ", name_max,
                    " characters '", directory, "' allows"));
  // The temporary file is created in `directory` and renamed there: create one now and remove it.
  // (access() is not enough: root may "write" /proc and /sys, which refuse new files.)
  // (A name per process and call, retried past one a killed process left behind.)
  for (int attempt = 0;; ++attempt) {
    const std::string probe = temporary_in(directory);
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::close(fd);
      ::unlink(probe.c_str());
      return;
    }
    if (errno != EEXIST || attempt == 8)
      throw Error(cat(what, ": cannot write '", path, "': cannot create files in '", directory, "': ",
                      std::strerror(errno)));
  }
}

}  // namespace quiver
