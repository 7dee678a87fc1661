#include "runtime/atomic_file.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace quiver {

void write_file_atomically(const std::string& path, const std::string& text, const std::string& what) {
  // The process id keeps two writers of one path from sharing a temporary file.
  const std::string temporary = cat(path, ".tmp.", ::getpid());
  {
    std::ofstream out(temporary, std::ios::trunc | std::ios::binary);
    if (!out) throw Error(cat(what, ": cannot write '", path, "'"));
    out << text;
    if (!out.flush()) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      throw Error(cat(what, ": writing '", path, "' failed"));
    }
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw Error(cat(what, ": cannot move '", temporary, "' to '", path, "': ", error.message()));
  }
}

}  // namespace quiver
