// IDX file reader and writer (the MNIST container format), through zlib so a gzip-compressed
// file and a plain one read the same way.
// It handles only unsigned-byte IDX (type 0x08) with 1 to 4 dimensions, which is all the
// image/label data sets need; it is not a general IDX library (no int/float element types)
// and knows nothing about what the bytes mean: see fashion_mnist.h for that.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace quiver {

struct IdxArray {
  std::vector<int64_t> dims;  // outermost first, e.g. (count, rows, cols)
  std::vector<uint8_t> data;  // row-major, product(dims) bytes
};

// Throws quiver::Error naming the path on: a file that cannot be opened or read, a bad magic
// number (shown in hex), implausible dims, a header that claims more than `max_bytes` of data
// (refused before any is read: a gzip file of a few MB can inflate to any size, so a loader passes
// what memory allows), a header or data section shorter than the header promises, or a gzip
// stream that is corrupt or cut short (the check bytes of the member holding the data's end are
// read and checked), or such a member holding more than 1 MiB (or the data's size) past the data.
// Bytes after the data, later gzip members too, are otherwise ignored, unread.
IdxArray read_idx(const std::string& path, int64_t max_bytes = std::numeric_limits<int64_t>::max());

// Writes `a` as unsigned-byte IDX, gzip-compressed when `gzip` is set, atomically (a failed write
// leaves what was at `path`). Throws quiver::Error naming the path when the array is malformed or
// the file cannot be written.
void write_idx(const std::string& path, const IdxArray& a, bool gzip);

}  // namespace quiver
