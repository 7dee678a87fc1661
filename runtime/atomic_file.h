// Writes of files users care about (traces, results, profile caches, checkpoints) are atomic: the
// text goes to a temporary file beside the target (unique per process and call) and is synced to
// the disk, then rename() replaces the target in one step and the directory is synced, so a crash,
// a power loss or a full disk never leaves a half-written file where a good one was.
#pragma once

#include <string>

namespace quiver {

// Throws quiver::Error naming `what` and the path when the file cannot be written.
void write_file_atomically(const std::string& path, const std::string& text, const std::string& what);

}  // namespace quiver
