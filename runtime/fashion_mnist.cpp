// Fashion-MNIST loading on top of read_idx: file naming, cross-file consistency checks and the
// byte-to-float conversion. The IDX format itself lives in idx.cpp.
#include "runtime/fashion_mnist.h"

#include <cstdlib>
#include <filesystem>
#include <limits>
#include <new>

#include "core/error.h"
#include "runtime/idx.h"
#include "runtime/memory.h"

namespace quiver {
namespace {

constexpr const char* kDefaultDir = "/usr/share/datasets/fashion-mnist";
constexpr int32_t kNumClasses = 10;
constexpr const char* kHowToGetIt =
    "install it with `apt-get install dataset-fashion-mnist`, or point QUIVER_DATA_DIR (quiver-train: "
    "--data) at a directory holding the IDX files";

// What is at `path`: file_type::not_found when nothing is; an error that is not "nothing there"
// (a directory on the way the user may not search) is said as it is, not as a missing file.
std::filesystem::file_type type_at(const std::filesystem::path& path) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (error && status.type() != std::filesystem::file_type::not_found)
    throw Error(cat("fashion-mnist: cannot access '", path.string(), "': ", error.message()));
  return status.type();
}

std::string find_file(const std::filesystem::path& dir, const std::string& stem) {
  const std::filesystem::path gz = dir / (stem + ".gz");
  const std::filesystem::path plain = dir / stem;
  for (const std::filesystem::path& path : {gz, plain}) {
    const std::filesystem::file_type type = type_at(path);
    if (type == std::filesystem::file_type::not_found) continue;
    // A pipe would block the reader for ever, a directory cannot be read: named now.
    if (type != std::filesystem::file_type::regular)
      throw Error(cat("fashion-mnist: '", path.string(), "' is not a regular file"));
    return path.string();
  }
  throw Error(cat("fashion-mnist: neither '", gz.string(), "' nor '", plain.string(),
                  "' exists; ", kHowToGetIt));
}

}  // namespace

void check_consistent(const Dataset& data, const std::string& who) {
  // An empty set (a default Dataset among them) is consistent; whoever needs samples says so.
  if (data.count == 0 && data.images.empty() && data.labels.empty()) return;
  // Extents of 1 and more, and a product that fits: 2^31 x 2^31 x 4 once wrapped to 0 and matched
  // an empty image vector.
  int64_t features = 0, floats = 0;
  if (data.rows < 1 || data.cols < 1 || __builtin_mul_overflow(data.rows, data.cols, &features))
    throw Error(cat(who, ": dataset is inconsistent: samples of ", data.rows, " x ", data.cols,
                    " (rows and cols must be >= 1, their product fit in 64 bits)"));
  if (data.count < 0 || __builtin_mul_overflow(data.count, features, &floats))
    throw Error(cat(who, ": dataset is inconsistent: count ", data.count, " of ", features,
                    " features each (the count must be >= 0, count x features fit in 64 bits)"));
  if (static_cast<int64_t>(data.images.size()) != floats || static_cast<int64_t>(data.labels.size()) != data.count)
    throw Error(cat(who, ": dataset is inconsistent: count ", data.count, " x features ", features,
                    " but images holds ", data.images.size(), " floats and labels ", data.labels.size()));
}

std::string default_fashion_mnist_dir() {
  const char* from_env = std::getenv("QUIVER_DATA_DIR");
  if (from_env != nullptr && from_env[0] != '\0') return from_env;
  return kDefaultDir;
}

Dataset load_fashion_mnist(const std::string& dir, Split split) {
  if (const std::filesystem::file_type type = type_at(dir); type != std::filesystem::file_type::directory) {
    const bool exists = type != std::filesystem::file_type::not_found;
    throw Error(cat("fashion-mnist: data directory '", dir, exists ? "' is not a directory; " : "' does not exist; ",
                    kHowToGetIt));
  }
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  const std::string images_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_file(dir, prefix + "-labels-idx1-ubyte");

  // Each byte read becomes a float (an int32 label) beside it: a header that claims more than
  // memory holds (a corrupt one, or a gzip file of a few MB that inflates to gigabytes) is refused
  // before its data is inflated, naming the file, not left to the out-of-memory killer.
  const int64_t available = available_memory_bytes();
  const int64_t most = available > 0 ? available / static_cast<int64_t>(1 + sizeof(float))
                                     : std::numeric_limits<int64_t>::max();
  IdxArray images = read_idx(images_path, most);
  if (images.dims.size() != 3) {
    throw Error(cat("fashion-mnist: '", images_path, "' has ", images.dims.size(),
                    " dimensions; images must be 3-D (count, rows, cols)"));
  }
  IdxArray labels = read_idx(labels_path, most);
  if (labels.dims.size() != 1) {
    throw Error(cat("fashion-mnist: '", labels_path, "' has ", labels.dims.size(),
                    " dimensions; labels must be 1-D (count)"));
  }
  if (images.dims[0] != labels.dims[0]) {
    throw Error(cat("fashion-mnist: count mismatch: '", images_path, "' holds ", images.dims[0],
                    " images but '", labels_path, "' holds ", labels.dims[0], " labels"));
  }
  // An empty set trains nothing and its accuracy would read 0%: refused, naming the file.
  if (images.dims[0] == 0 || images.dims[1] == 0 || images.dims[2] == 0)
    throw Error(cat("fashion-mnist: '", images_path, "' holds no samples (", images.dims[0], " images of ",
                    images.dims[1], "x", images.dims[2], ")"));

  Dataset result;
  result.count = images.dims[0];
  result.rows = images.dims[1];
  result.cols = images.dims[2];

  try {  // what memory held when the files were checked may have gone meanwhile
    result.labels.resize(labels.data.size());
    result.images.resize(images.data.size());
  } catch (const std::bad_alloc&) {
    throw Error(cat("fashion-mnist: out of memory for the ", images.data.size(), " pixels of '", images_path,
                    "' as floats"));
  }
  for (size_t i = 0; i < labels.data.size(); ++i) {
    const int32_t label = labels.data[i];
    if (label >= kNumClasses) {
      throw Error(cat("fashion-mnist: '", labels_path, "': label ", label, " at index ", i,
                      " is outside 0..", kNumClasses - 1));
    }
    result.labels[i] = label;
  }

  // Division rather than multiplying by a rounded 1/255 keeps 255 mapping to exactly 1.0f.
  for (size_t i = 0; i < images.data.size(); ++i) {
    result.images[i] = static_cast<float>(images.data[i]) / 255.0f;
  }
  return result;
}

}  // namespace quiver
