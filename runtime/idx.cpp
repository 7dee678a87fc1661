// IDX reading through zlib's gz* file API, which passes non-gzip files through unchanged, so
// one code path serves both `foo-ubyte.gz` and `foo-ubyte`. Not a parser of element types
// other than unsigned byte.
#include "runtime/idx.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <limits>
#include <memory>
#include <sstream>

#include "core/error.h"

namespace quiver {
namespace {

constexpr uint8_t kUnsignedByteType = 0x08;
constexpr int kMaxDims = 4;
// Larger claims are a corrupt header, not a data set; refusing them keeps the size
// arithmetic far from overflow.
constexpr int64_t kMaxElements = int64_t{1} << 40;
// gzread takes an unsigned length; reading in bounded chunks also means a header that
// promises far more data than the file holds never makes us allocate the promised amount.
constexpr int64_t kReadChunk = int64_t{1} << 22;

struct GzCloser {
  void operator()(gzFile_s* file) const { gzclose(file); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};
using PlainFile = std::unique_ptr<std::FILE, FileCloser>;

std::string gz_error_text(gzFile file) {
  int code = Z_OK;
  const char* text = gzerror(file, &code);
  if (code == Z_ERRNO) return std::strerror(errno);
  return text != nullptr ? text : "unknown zlib error";
}

std::string hex32(uint32_t value) {
  std::ostringstream out;
  out << "0x" << std::hex << std::setw(8) << std::setfill('0') << value;
  return out.str();
}

// Reads up to `want` bytes; returns how many arrived before end of file. A gzip stream that is
// cut short reads as end of file (zlib reports that as Z_BUF_ERROR, not as a failure), which
// the caller turns into a "truncated" message.
int64_t read_bytes(gzFile file, const std::string& path, uint8_t* dst, int64_t want) {
  int64_t got = 0;
  while (got < want) {
    const auto ask = static_cast<unsigned>(std::min(want - got, kReadChunk));
    const int n = gzread(file, dst + got, ask);
    if (n < 0) throw Error(cat("idx '", path, "': cannot read: ", gz_error_text(file)));
    if (n == 0) break;
    got += n;
  }
  return got;
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < dims.size(); ++i) out << (i ? ", " : "") << dims[i];
  out << ")";
  return out.str();
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  GzFile file(gzopen(path.c_str(), "rb"));
  if (!file) {
    throw Error(cat("idx '", path, "': cannot open: ", std::strerror(errno)));
  }
  gzbuffer(file.get(), 1u << 17);

  std::array<uint8_t, 4> magic{};
  const int64_t magic_got = read_bytes(file.get(), path, magic.data(), 4);
  if (magic_got < 4) {
    throw Error(cat("idx '", path, "': truncated: expected 4 bytes of header, got ", magic_got));
  }
  const uint32_t magic_value = (uint32_t{magic[0]} << 24) | (uint32_t{magic[1]} << 16) |
                               (uint32_t{magic[2]} << 8) | uint32_t{magic[3]};
  const int ndims = magic[3];
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != kUnsignedByteType || ndims == 0 ||
      ndims > kMaxDims) {
    throw Error(cat("idx '", path, "': bad magic ", hex32(magic_value),
                    " (expected 0x000008NN: unsigned-byte IDX with NN = 1..", kMaxDims,
                    " dimensions)"));
  }

  std::array<uint8_t, 4 * kMaxDims> dim_bytes{};
  const int64_t dim_want = 4 * ndims;
  const int64_t dim_got = read_bytes(file.get(), path, dim_bytes.data(), dim_want);
  if (dim_got < dim_want) {
    throw Error(cat("idx '", path, "': truncated: expected ", 4 + dim_want,
                    " bytes of header, got ", 4 + dim_got));
  }

  IdxArray result;
  int64_t elements = 1;
  for (int d = 0; d < ndims; ++d) {
    const uint8_t* b = dim_bytes.data() + 4 * d;
    const int64_t dim = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) |
                        int64_t{b[3]};
    result.dims.push_back(dim);
    if (dim != 0 && elements > kMaxElements / dim) {
      throw Error(cat("idx '", path, "': implausible dims ", dims_text(result.dims),
                      "...: more than ", kMaxElements, " elements (corrupt header?)"));
    }
    elements *= dim;
  }

  int64_t got = 0;
  while (got < elements) {
    const int64_t step = std::min(elements - got, kReadChunk);
    result.data.resize(static_cast<size_t>(got + step));
    const int64_t n = read_bytes(file.get(), path, result.data.data() + got, step);
    got += n;
    if (n < step) break;
  }
  if (got < elements) {
    throw Error(cat("idx '", path, "': truncated: expected ", elements, " bytes of data, got ",
                    got, " (dims ", dims_text(result.dims), ")"));
  }
  // The data is all there. For gzip, reading on is what makes zlib check the stream's trailer
  // (CRC-32 and length): a cut or corrupt trailer surfaces only then. Bytes after the data are
  // ignored, as in a plain file.
  if (!gzdirect(file.get())) {
    uint8_t extra = 0;
    const int more = gzread(file.get(), &extra, 1);
    int code = Z_OK;
    gzerror(file.get(), &code);
    if (more < 0 || (more == 0 && code != Z_OK)) {
      throw Error(cat("idx '", path, "': ", code == Z_BUF_ERROR ? "truncated" : "corrupt",
                      " gzip stream after the data (its check bytes: ", gz_error_text(file.get()), ")"));
    }
  }
  result.data.resize(static_cast<size_t>(elements));
  return result;
}

void write_idx(const std::string& path, const IdxArray& a, bool gzip) {
  const auto ndims = static_cast<int64_t>(a.dims.size());
  if (ndims < 1 || ndims > kMaxDims) {
    throw Error(cat("idx '", path, "': cannot write ", ndims, " dimensions; IDX here takes 1..",
                    kMaxDims));
  }
  int64_t elements = 1;
  for (int64_t dim : a.dims) {
    if (dim < 0 || dim > std::numeric_limits<uint32_t>::max()) {
      throw Error(cat("idx '", path, "': dim ", dim, " in ", dims_text(a.dims),
                      " does not fit an unsigned 32-bit IDX dimension"));
    }
    if (dim != 0 && elements > kMaxElements / dim) {
      throw Error(cat("idx '", path, "': dims ", dims_text(a.dims), " are too large"));
    }
    elements *= dim;
  }
  if (elements != static_cast<int64_t>(a.data.size())) {
    throw Error(cat("idx '", path, "': dims ", dims_text(a.dims), " need ", elements,
                    " bytes but data has ", a.data.size()));
  }

  std::vector<uint8_t> header = {0, 0, kUnsignedByteType, static_cast<uint8_t>(ndims)};
  for (int64_t dim : a.dims) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      header.push_back(static_cast<uint8_t>((dim >> shift) & 0xff));
    }
  }

  if (gzip) {
    GzFile file(gzopen(path.c_str(), "wb"));
    if (!file) {
      throw Error(cat("idx '", path, "': cannot open for writing: ", std::strerror(errno)));
    }
    auto put = [&](const uint8_t* bytes, size_t size) {
      if (size == 0) return;
      if (gzfwrite(bytes, 1, size, file.get()) != size) {
        throw Error(cat("idx '", path, "': cannot write: ", gz_error_text(file.get())));
      }
    };
    put(header.data(), header.size());
    put(a.data.data(), a.data.size());
    // gzclose flushes the compressor, so its status is the one that says the file is whole.
    if (gzclose(file.release()) != Z_OK) {
      throw Error(cat("idx '", path, "': cannot finish writing gzip stream"));
    }
  } else {
    PlainFile file(std::fopen(path.c_str(), "wb"));
    if (!file) {
      throw Error(cat("idx '", path, "': cannot open for writing: ", std::strerror(errno)));
    }
    auto put = [&](const uint8_t* bytes, size_t size) {
      if (size == 0) return;
      if (std::fwrite(bytes, 1, size, file.get()) != size) {
        throw Error(cat("idx '", path, "': cannot write: ", std::strerror(errno)));
      }
    };
    put(header.data(), header.size());
    put(a.data.data(), a.data.size());
    if (std::fclose(file.release()) != 0) {
      throw Error(cat("idx '", path, "': cannot finish writing: ", std::strerror(errno)));
    }
  }
}

}  // namespace quiver
