// IDX files, gzip-compressed or plain: one code path serves both `foo-ubyte.gz` and `foo-ubyte`
// (reading inflates a file that starts with gzip's magic bytes and passes any other through;
// writing deflates in memory and replaces the file atomically). Not a parser of element types
// other than unsigned byte.
#include "runtime/idx.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <limits>
#include <memory>
#include <new>
#include <sstream>

#include "core/error.h"
#include "runtime/atomic_file.h"

namespace quiver {
namespace {

constexpr uint8_t kUnsignedByteType = 0x08;
constexpr int kMaxDims = 4;
// Larger claims are a corrupt header, not a data set; refusing them keeps the size
// arithmetic far from overflow.
constexpr int64_t kMaxElements = int64_t{1} << 40;
// inflate takes an unsigned length; reading in bounded chunks also means a header that
// promises far more data than the file holds never makes us allocate the promised amount.
constexpr int64_t kReadChunk = int64_t{1} << 22;
// What a gzip member may hold past the data it ends with, at least (more, up to the data's own
// size, for larger data): inflating it only checks the member's check bytes.
constexpr int64_t kTrailingAtMost = int64_t{1} << 20;

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};
using PlainFile = std::unique_ptr<std::FILE, FileCloser>;

std::string hex32(uint32_t value) {
  std::ostringstream out;
  out << "0x" << std::hex << std::setw(8) << std::setfill('0') << value;
  return out.str();
}

// A file's bytes, inflated where it is gzip (it starts with 1f 8b) and passed through where it is
// not. zlib's inflate checks each gzip member's CRC-32 and length when it reaches the member's
// end, and finish() reads on to that end. (gzread missed a cut trailer: when a large read used up
// the input just as it was filled, it took the end of the file for the end of the stream.)
class ByteSource {
  // The file at `path`, opened without blocking (a pipe would block the open and the reads for
  // ever) and only when it is a regular file: a pipe, a device or a directory is named.
  static std::FILE* open_regular(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) throw Error(cat("idx '", path, "': cannot open: ", std::strerror(errno)));
    struct stat status{};
    if (::fstat(fd, &status) != 0 || !S_ISREG(status.st_mode)) {
      ::close(fd);
      throw Error(cat("idx '", path, "': not a regular file"));
    }
    std::FILE* file = ::fdopen(fd, "rb");
    if (!file) {
      const int error = errno;
      ::close(fd);
      throw Error(cat("idx '", path, "': cannot open: ", std::strerror(error)));
    }
    return file;
  }

 public:
  explicit ByteSource(const std::string& path) : path_(path), file_(open_regular(path)) {
    refill();
    gzip_ = have_ >= 2 && in_[0] == 0x1f && in_[1] == 0x8b;
    if (!gzip_) return;
    if (inflateInit2(&stream_, 16 + MAX_WBITS) != Z_OK)  // 16: a gzip wrapper, not zlib's
      throw Error(cat("idx '", path, "': cannot start inflating: out of memory"));
    inflating_ = true;
  }
  ~ByteSource() {
    if (inflating_) inflateEnd(&stream_);
  }
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  // Up to `want` bytes; fewer only where the data ends or a gzip stream is cut short.
  int64_t read(uint8_t* dst, int64_t want) { return gzip_ ? inflate_into(dst, want) : copy_into(dst, want); }

  // After the data: the gzip member holding its last bytes is read on to its end, so that its
  // check bytes are checked (a cut or wrong trailer throws). What follows the data is otherwise
  // ignored, as in a plain file: later members are not read, and what the member itself holds
  // past the data may inflate to at most `most` bytes (a small file is not inflated for minutes).
  void finish(int64_t most) {
    if (!gzip_ || ended_) return;
    if (member_out_ == 0) return;  // the data ended with its member: a later one is not read
    last_member_ = true;
    std::array<uint8_t, 4096> rest{};
    for (int64_t after = 0; !ended_;) {
      after += inflate_into(rest.data(), static_cast<int64_t>(rest.size()));
      if (cut_) throw Error(cat("idx '", path_, "': truncated gzip stream after the data (its check bytes are missing)"));
      if (after > most)
        throw Error(cat("idx '", path_, "': more than ", most, " bytes follow the data inside its gzip member"));
    }
  }

 private:
  // More raw bytes into in_, behind the `keep` bytes at `rest`, which move to its front; the
  // inflater's input is then all of in_. False when nothing more came (the end of the file).
  bool refill(const uint8_t* rest = nullptr, size_t keep = 0) {
    if (keep > 0) std::memmove(in_.data(), rest, keep);
    const size_t read = std::fread(in_.data() + keep, 1, in_.size() - keep, file_.get());
    if (read == 0 && std::ferror(file_.get())) throw Error(cat("idx '", path_, "': cannot read: ", std::strerror(errno)));
    have_ = keep + read;
    used_ = 0;
    stream_.next_in = in_.data();
    stream_.avail_in = static_cast<uInt>(have_);
    return read > 0;
  }

  int64_t copy_into(uint8_t* dst, int64_t want) {
    int64_t got = 0;
    while (got < want) {
      if (used_ == have_ && !refill()) break;
      const size_t n = std::min(have_ - used_, static_cast<size_t>(want - got));
      std::memcpy(dst + got, in_.data() + used_, n);
      used_ += n;
      got += static_cast<int64_t>(n);
    }
    return got;
  }

  int64_t inflate_into(uint8_t* dst, int64_t want) {
    int64_t got = 0;
    while (got < want && !ended_ && !cut_) {
      if (stream_.avail_in == 0 && !refill()) {
        cut_ = true;
        break;
      }
      const auto room = static_cast<uInt>(std::min<int64_t>(want - got, kReadChunk));
      stream_.next_out = dst + got;
      stream_.avail_out = room;
      const int status = inflate(&stream_, Z_NO_FLUSH);
      got += room - stream_.avail_out;
      member_out_ += room - stream_.avail_out;
      if (status == Z_STREAM_END) {
        if (last_member_)
          ended_ = true;
        else
          next_member();
      } else if (status == Z_DATA_ERROR || status == Z_NEED_DICT) {
        throw Error(cat("idx '", path_, "': corrupt gzip stream: ", stream_.msg ? stream_.msg : "invalid data"));
      } else if (status == Z_MEM_ERROR) {
        throw Error(cat("idx '", path_, "': out of memory inflating it"));
      }
    }
    return got;
  }

  // After a member's end: another member may follow (concatenated gzip files are one stream, as
  // gzip -d reads them); anything else ends the data. Its two magic bytes may straddle the end of
  // the buffer: what is left moves to the front and more is read behind it.
  void next_member() {
    if (stream_.avail_in < 2) refill(stream_.next_in, stream_.avail_in);
    if (stream_.avail_in >= 2 && stream_.next_in[0] == 0x1f && stream_.next_in[1] == 0x8b) {
      inflateReset(&stream_);
      member_out_ = 0;
    } else {
      ended_ = true;
    }
  }

  std::string path_;
  PlainFile file_;
  std::array<uint8_t, 1 << 17> in_{};
  size_t have_ = 0, used_ = 0;  // bytes in in_, and (plain) those already handed out
  bool gzip_ = false, inflating_ = false, ended_ = false, cut_ = false;
  bool last_member_ = false;  // finish(): the member being read is the last one read
  int64_t member_out_ = 0;    // bytes inflated from the member being read
  z_stream stream_{};
};

std::string dims_text(const std::vector<int64_t>& dims) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < dims.size(); ++i) out << (i ? ", " : "") << dims[i];
  out << ")";
  return out.str();
}

// `plain` as one gzip member (what gzip(1) writes), built in memory so the file can be written
// atomically.
std::string gzip_of(const std::string& plain, const std::string& path) {
  z_stream stream{};
  // 15 + 16: the largest window, with gzip's header and trailer instead of zlib's.
  if (deflateInit2(&stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    throw Error(cat("idx '", path, "': cannot start a gzip stream"));
  struct End {
    z_stream& stream;
    ~End() { deflateEnd(&stream); }
  } end{stream};
  std::string packed;
  std::array<uint8_t, 1 << 16> out{};
  size_t fed = 0;
  int status = Z_OK;
  while (status != Z_STREAM_END) {
    if (stream.avail_in == 0 && fed < plain.size()) {  // deflate takes an unsigned length: pieces
      const size_t piece = std::min<size_t>(plain.size() - fed, size_t{1} << 30);
      stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(plain.data() + fed));
      stream.avail_in = static_cast<uInt>(piece);
      fed += piece;
    }
    stream.next_out = out.data();
    stream.avail_out = static_cast<uInt>(out.size());
    status = deflate(&stream, fed == plain.size() ? Z_FINISH : Z_NO_FLUSH);
    if (status != Z_OK && status != Z_STREAM_END && status != Z_BUF_ERROR)
      throw Error(cat("idx '", path, "': cannot compress: ", stream.msg ? stream.msg : "zlib error"));
    packed.append(reinterpret_cast<const char*>(out.data()), out.size() - stream.avail_out);
  }
  return packed;
}

}  // namespace

IdxArray read_idx(const std::string& path, int64_t max_bytes) {
  ByteSource file(path);
  std::array<uint8_t, 4> magic{};
  const int64_t magic_got = file.read(magic.data(), 4);
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
  const int64_t dim_got = file.read(dim_bytes.data(), dim_want);
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
  if (elements > max_bytes)
    throw Error(cat("idx '", path, "': its header claims ", elements, " bytes of data (dims ", dims_text(result.dims),
                    "), more than the ", max_bytes, " allowed (what memory holds; a corrupt header?)"));

  int64_t got = 0;
  while (got < elements) {
    const int64_t step = std::min(elements - got, kReadChunk);
    try {
      result.data.resize(static_cast<size_t>(got + step));
    } catch (const std::bad_alloc&) {
      throw Error(cat("idx '", path, "': out of memory after ", got, " of the ", elements, " bytes its header claims (dims ",
                      dims_text(result.dims), ")"));
    }
    const int64_t n = file.read(result.data.data() + got, step);
    got += n;
    if (n < step) break;
  }
  if (got < elements) {
    throw Error(cat("idx '", path, "': truncated: expected ", elements, " bytes of data, got ",
                    got, " (dims ", dims_text(result.dims), ")"));
  }
  // The data is all there: a gzip stream's check bytes are checked now.
  file.finish(std::max<int64_t>(elements, kTrailingAtMost));
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

  std::string bytes(header.begin(), header.end());
  bytes.append(a.data.begin(), a.data.end());
  write_file_atomically(path, gzip ? gzip_of(bytes, path) : bytes, "idx file");
}

}  // namespace quiver
