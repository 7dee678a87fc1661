// Writes of files users care about (traces, results, profile caches, checkpoints) are atomic: the
// text goes to a new temporary file beside the target (never one another writer holds), synced to
// the disk, then rename() replaces the target in one step and the directory is synced, so a crash,
// a power loss or a full disk never leaves a half-written file where a good one was. A target that
// is a symbolic link is written through: the file it names is replaced and the link stays.
#pragma once

#include <string>

namespace quiver {

// Throws quiver::Error naming `what` and the path when the file cannot be written, and, leaving
// it as it was, when the target exists and is not a regular file or is read-only (see
// check_writable: the same refusals, checked again at the write).
void write_file_atomically(const std::string& path, const std::string& text, const std::string& what);

// The file write_file_atomically(path, ...) replaces: `path`, or what its chain of symbolic links
// names (a writer that locks the file's directory must lock that one). Throws quiver::Error naming
// `what` on a link it cannot read or one into /proc (a process's open file).
std::string atomic_write_target(const std::string& path, const std::string& what);

// Refuses, before any work is done, a destination write_file_atomically could not write: an empty
// name, a directory or another file that is not a regular one (a device, a pipe, a process's open
// file such as /dev/stdout), a parent directory that is missing or where no file can be created,
// a name longer than the file system allows, a read-only file, a file of another user in a sticky
// directory (/tmp).
// A typo in an output path then costs nothing instead of a whole training run. Throws
// quiver::Error naming `what`.
void check_writable(const std::string& path, const std::string& what);

// Whether `user` may replace (rename over) a file of `file_owner` in a directory of `directory_mode`
// and `directory_owner`: in a sticky one only the file's owner, the directory's or root may.
// (Root without CAP_FOWNER, in some containers, is taken to have it.)
bool may_replace_in(unsigned directory_mode, unsigned directory_owner, unsigned file_owner, unsigned user);

}  // namespace quiver
