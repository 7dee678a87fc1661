// Tests for the data path: IDX reading/writing, the Fashion-MNIST loader (on small synthetic
// files, and on the real data set when it is installed) and the Batcher's ordering and
// shutdown. Not a performance test.
#include <gtest/gtest.h>

#include <limits>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "models/models.h"
#include "runtime/batcher.h"
#include "runtime/fashion_mnist.h"
#include "runtime/idx.h"
#include "runtime/memory.h"
#include "runtime/trainer.h"

namespace quiver {
namespace {

namespace fs = std::filesystem;

// Runs `action` twice: once for EXPECT_THROW, once to check that the quiver::Error's message
// holds every one of `parts`.
template <typename Action>
void expect_error(Action&& action, const std::vector<std::string>& parts) {
  EXPECT_THROW(action(), Error);
  try {
    action();
    ADD_FAILURE() << "expected quiver::Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos)
          << "message lacks '" << part << "': " << message;
    }
  }
}

void write_bytes(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// A well-formed gzip stream around arbitrary (possibly malformed IDX) bytes.
void write_gz_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  EXPECT_EQ(gzclose(file), Z_OK);
}

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

IdxArray patterned(std::vector<int64_t> dims) {
  IdxArray a;
  a.dims = std::move(dims);
  int64_t elements = 1;
  for (int64_t d : a.dims) elements *= d;
  for (int64_t i = 0; i < elements; ++i) {
    a.data.push_back(static_cast<uint8_t>((i * 37 + 11) % 256));
  }
  return a;
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           (std::string("quiver_data_") + info->test_suite_name() + "_" + info->name() + "_" +
            std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

// ---------------------------------------------------------------------------- IDX

using DataIdx = TempDir;

TEST_F(DataIdx, RoundTripsGzipAndPlain) {
  for (const IdxArray& a : {patterned({3, 5, 7}), patterned({11}), patterned({2, 2, 2, 3})}) {
    for (bool gzip : {true, false}) {
      const std::string file = path(gzip ? "a.idx.gz" : "a.idx");
      write_idx(file, a, gzip);
      const std::vector<uint8_t> raw = read_bytes(file);
      ASSERT_GE(raw.size(), 2u);
      if (gzip) {
        EXPECT_EQ(raw[0], 0x1f);
        EXPECT_EQ(raw[1], 0x8b);
      } else {
        EXPECT_EQ(raw.size(), 4 + 4 * a.dims.size() + a.data.size());
        EXPECT_EQ(raw[2], 0x08);
      }
      const IdxArray back = read_idx(file);
      EXPECT_EQ(back.dims, a.dims);
      EXPECT_EQ(back.data, a.data);
      if (gzip) {  // what gzip(1) would read: zlib's own reader, not ours, inflates the same bytes
        gzFile in = gzopen(file.c_str(), "rb");
        ASSERT_NE(in, nullptr);
        std::vector<uint8_t> inflated(raw.size() + a.data.size() + 64);
        const int got = gzread(in, inflated.data(), static_cast<unsigned>(inflated.size()));
        gzclose(in);
        ASSERT_EQ(got, static_cast<int>(4 + 4 * a.dims.size() + a.data.size()));
        EXPECT_TRUE(std::equal(a.data.begin(), a.data.end(), inflated.begin() + got - a.data.size()));
      }
    }
  }
}

// A write that cannot finish leaves the file that was there: here the process may not write files
// larger than 1 KB (RLIMIT_FSIZE binds root too), so the new file is cut at 1 KB.
TEST_F(DataIdx, AFailedWriteLeavesTheOldFile) {
  for (const bool gzip : {false, true}) {
    const std::string file = path(gzip ? "kept.idx.gz" : "kept.idx");
    write_idx(file, patterned({16, 16}), gzip);
    const std::vector<uint8_t> before = read_bytes(file);
    IdxArray large = patterned({256, 256});
    for (size_t i = 0; i < large.data.size(); ++i) large.data[i] = static_cast<uint8_t>((i * 2654435761u) >> 24);
    rlimit limit{};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &limit), 0);
    const rlimit small{1024, limit.rlim_max};
    const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    bool thrown = false;
    try {
      write_idx(file, large, gzip);
    } catch (const Error&) {
      thrown = true;
    }
    ::setrlimit(RLIMIT_FSIZE, &limit);
    std::signal(SIGXFSZ, old_handler);
    EXPECT_TRUE(thrown) << (gzip ? "gzip" : "plain");
    EXPECT_EQ(read_bytes(file), before) << (gzip ? "gzip" : "plain");
  }
}

// A header that claims more data than the caller allows is refused before any data is read.
TEST_F(DataIdx, AClaimAboveTheLimitIsRefusedBeforeReading) {
  const std::string file = path("a.gz");
  write_idx(file, patterned({64, 64}), true);
  expect_error([&] { read_idx(file, 4095); }, {file, "claims 4096 bytes", "more than the 4095 allowed"});
  EXPECT_EQ(read_idx(file, 4096).data, patterned({64, 64}).data);
}

TEST_F(DataIdx, TrailingBytesAreIgnored) {
  const IdxArray a = patterned({4, 2});
  write_idx(path("a"), a, false);
  std::vector<uint8_t> raw = read_bytes(path("a"));
  raw.insert(raw.end(), {1, 2, 3});
  write_bytes(path("a"), raw);
  EXPECT_EQ(read_idx(path("a")).data, a.data);
}

TEST_F(DataIdx, MissingFileSaysCannotOpen) {
  const std::string file = path("nope-ubyte.gz");
  expect_error([&] { read_idx(file); }, {file, "cannot open"});
}

// read_idx itself refuses what is not a regular file, without blocking: a pipe with no writer would
// block the open for ever (the Fashion-MNIST loader checks first; other callers need not), and a
// directory cannot be read.
TEST_F(DataIdx, APipeOrADirectoryIsNotRead) {
  const std::string pipe = path("pipe-ubyte");
  ASSERT_EQ(::mkfifo(pipe.c_str(), 0600), 0);
  expect_error([&] { read_idx(pipe); }, {pipe, "not a regular file"});
  expect_error([&] { read_idx(dir_.string()); }, {dir_.string(), "not a regular file"});
}

TEST_F(DataIdx, TruncatedDataPlain) {
  const std::string file = path("short");
  write_bytes(file, {0, 0, 8, 1, 0, 0, 0, 10, 1, 2, 3, 4, 5});
  expect_error([&] { read_idx(file); },
               {file, "truncated", "expected 10 bytes of data, got 5"});
}

TEST_F(DataIdx, TruncatedDataInsideValidGzip) {
  const std::string file = path("short.gz");
  std::vector<uint8_t> bytes = {0, 0, 8, 2, 0, 0, 0, 4, 0, 0, 0, 25};  // promises 100 bytes
  bytes.resize(bytes.size() + 60, 7);
  write_gz_bytes(file, bytes);
  expect_error([&] { read_idx(file); },
               {file, "truncated", "expected 100 bytes of data, got 60"});
}

TEST_F(DataIdx, CutGzipStream) {
  const std::string file = path("cut.gz");
  write_idx(file, patterned({64, 64}), true);
  std::vector<uint8_t> raw = read_bytes(file);
  raw.resize(raw.size() / 2);
  write_bytes(file, raw);
  expect_error([&] { read_idx(file); }, {file, "truncated", "expected 4096 bytes of data"});
}

// The data is whole but the gzip trailer (CRC-32 and length) is cut or wrong: zlib checks it
// only when asked to read past the data, which the reader does.
TEST_F(DataIdx, GzipTrailerIsChecked) {
  const std::string file = path("trailer.gz");
  write_idx(file, patterned({16, 16}), true);
  const std::vector<uint8_t> whole = read_bytes(file);
  std::vector<uint8_t> cut(whole.begin(), whole.end() - 8);  // no trailer
  write_bytes(file, cut);
  expect_error([&] { read_idx(file); }, {file, "truncated gzip stream after the data"});
  std::vector<uint8_t> bad_crc = whole;
  bad_crc[bad_crc.size() - 8] ^= 0xff;  // the CRC-32's first byte
  write_bytes(file, bad_crc);
  expect_error([&] { read_idx(file); }, {file, "incorrect data check"});  // while reading the data or after it
  write_bytes(file, whole);
  EXPECT_EQ(read_idx(file).data, patterned({16, 16}).data);
  // The same for a file whose data is larger than a read from zlib's gz API goes through its
  // buffer for (gzread's large reads bypassed the buffer and took the end of the input for the
  // end of the stream: a cut trailer read as whole).
  const std::string large = path("large.gz");
  write_idx(large, patterned({1024, 1024}), true);
  const std::vector<uint8_t> large_whole = read_bytes(large);
  for (size_t cut_bytes : {1, 4, 8}) {
    write_bytes(large, std::vector<uint8_t>(large_whole.begin(), large_whole.end() - static_cast<std::ptrdiff_t>(cut_bytes)));
    expect_error([&] { read_idx(large); }, {large, "truncated gzip stream after the data"});
  }
  std::vector<uint8_t> large_bad_crc = large_whole;
  large_bad_crc[large_bad_crc.size() - 8] ^= 0xff;
  write_bytes(large, large_bad_crc);
  expect_error([&] { read_idx(large); }, {large, "incorrect data check"});
  write_bytes(large, large_whole);
  EXPECT_EQ(read_idx(large).data, patterned({1024, 1024}).data);
}

// One gzip member holding `bytes`, deflated at `level` (0: stored blocks, whose size is exact).
std::vector<uint8_t> gzip_member(const uint8_t* bytes, size_t size, int level) {
  z_stream stream{};
  EXPECT_EQ(deflateInit2(&stream, level, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::vector<uint8_t> out(deflateBound(&stream, static_cast<uLong>(size)));
  stream.next_in = const_cast<uint8_t*>(bytes);
  stream.avail_in = static_cast<uInt>(size);
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&stream, Z_FINISH), Z_STREAM_END);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

// Compressed data that takes many reads of the reader's 128 KiB buffer, and files of several gzip
// members (concatenated files, bgzip's blocks): read whole, every member's trailer checked, also
// where the next member's magic bytes straddle the end of a buffer.
TEST_F(DataIdx, GzipAcrossBuffersAndMembers) {
  IdxArray a;
  a.dims = {512, 1024};
  std::mt19937 random(7);
  for (int i = 0; i < 512 * 1024; ++i) a.data.push_back(static_cast<uint8_t>(random()));  // incompressible
  const std::string plain = path("random.idx");
  write_idx(plain, a, false);
  const std::vector<uint8_t> raw = read_bytes(plain);
  const std::string file = path("random.idx.gz");
  const std::vector<uint8_t> one = gzip_member(raw.data(), raw.size(), 6);
  ASSERT_GT(one.size(), size_t{4} << 17) << "more than four buffers of compressed data";
  write_bytes(file, one);
  EXPECT_EQ(read_idx(file).data, a.data);
  write_bytes(file, std::vector<uint8_t>(one.begin(), one.end() - 4));
  expect_error([&] { read_idx(file); }, {file, "truncated gzip stream after the data"});
  write_bytes(file, std::vector<uint8_t>(one.begin(), one.begin() + static_cast<std::ptrdiff_t>(one.size() / 2)));
  expect_error([&] { read_idx(file); }, {file, "truncated", "bytes of data"});
  // Two members, the first of stored blocks sized so that it ends 2, 1 and 0 bytes before the
  // end of the reader's first buffer (131072 bytes): its successor's magic bytes fit, straddle
  // the end, or start the next buffer.
  for (size_t first_size : {size_t{131070}, size_t{131071}, size_t{131072}}) {
    size_t split = first_size - 40;  // stored blocks add a header, a trailer and 5 bytes a block
    std::vector<uint8_t> head = gzip_member(raw.data(), split, 0);
    while (head.size() < first_size) head = gzip_member(raw.data(), ++split, 0);
    ASSERT_EQ(head.size(), first_size);
    std::vector<uint8_t> both = head;
    const std::vector<uint8_t> tail = gzip_member(raw.data() + split, raw.size() - split, 6);
    both.insert(both.end(), tail.begin(), tail.end());
    write_bytes(file, both);
    EXPECT_EQ(read_idx(file).data, a.data) << "first member of " << first_size << " bytes";
    both[both.size() - 8] ^= 0xff;  // the second member's CRC-32
    write_bytes(file, both);
    expect_error([&] { read_idx(file); }, {file, "incorrect data check"});
  }
  // Many small members, as bgzip writes them.
  std::vector<uint8_t> blocks;
  for (size_t at = 0; at < raw.size(); at += 50000) {
    const std::vector<uint8_t> block = gzip_member(raw.data() + at, std::min<size_t>(50000, raw.size() - at), 1);
    blocks.insert(blocks.end(), block.begin(), block.end());
  }
  write_bytes(file, blocks);
  EXPECT_EQ(read_idx(file).data, a.data);
}

// What follows the data in a gzip file is ignored as in a plain file, without inflating it all:
// later members are not read (a member of a gigabyte of zeros took seconds), and the member that
// holds the data's end may hold at most 1 MiB (or the data's size) more, whose check bytes are
// still checked.
TEST_F(DataIdx, GzipBytesAfterTheDataAreBoundedAndLaterMembersUnread) {
  const IdxArray a = patterned({4, 8});
  const std::string plain = path("small.idx");
  write_idx(plain, a, false);
  std::vector<uint8_t> raw = read_bytes(plain);
  const std::string file = path("trailing.idx.gz");
  // A later member that is not even gzip data past its magic: not read.
  std::vector<uint8_t> two = gzip_member(raw.data(), raw.size(), 6);
  const std::vector<uint8_t> garbage = {0x1f, 0x8b, 0x08, 0x00, 0xde, 0xad, 0xbe, 0xef};
  two.insert(two.end(), garbage.begin(), garbage.end());
  write_bytes(file, two);
  EXPECT_EQ(read_idx(file).data, a.data);
  // Inside the data's own member: up to 1 MiB is read (and checked), more is refused.
  std::vector<uint8_t> padded = raw;
  padded.resize(raw.size() + (size_t{1} << 20), 0);
  std::vector<uint8_t> member = gzip_member(padded.data(), padded.size(), 6);
  write_bytes(file, member);
  EXPECT_EQ(read_idx(file).data, a.data);
  member[member.size() - 8] ^= 0xff;  // its CRC-32
  write_bytes(file, member);
  expect_error([&] { read_idx(file); }, {file, "incorrect data check"});
  padded.resize(raw.size() + (size_t{1} << 20) + 1, 0);
  write_bytes(file, gzip_member(padded.data(), padded.size(), 6));
  expect_error([&] { read_idx(file); }, {file, "more than 1048576 bytes follow the data inside its gzip member"});
}

TEST_F(DataIdx, TruncatedHeader) {
  const std::string file = path("hdr");
  write_bytes(file, {0, 0, 8, 3, 0, 0, 0, 9});
  expect_error([&] { read_idx(file); }, {file, "truncated", "header"});
  write_bytes(file, {0, 0});
  expect_error([&] { read_idx(file); }, {file, "truncated", "header"});
}

TEST_F(DataIdx, BadMagicShowsValueInHex) {
  const std::string file = path("magic");
  write_bytes(file, {0x08, 0x03, 0, 0, 0, 0, 0, 1, 7});
  expect_error([&] { read_idx(file); }, {file, "bad magic", "0x08030000"});
  write_bytes(file, {0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0});  // float IDX
  expect_error([&] { read_idx(file); }, {file, "bad magic", "0x00000d01"});
  write_bytes(file, {0, 0, 8, 0});
  expect_error([&] { read_idx(file); }, {file, "bad magic", "0x00000800"});
  write_bytes(file, {0, 0, 8, 5});
  expect_error([&] { read_idx(file); }, {file, "bad magic", "0x00000805"});
}

// Every cut and every single-byte corruption of a small file, plain and gzip: read_idx either
// reads it (the same data: a flip in a gzip header's time field is harmless) or throws
// quiver::Error naming the file; never another exception or a crash, and a gzip file never
// yields other data unnoticed (its CRC-32).
TEST_F(DataIdx, EveryCutAndByteFlipIsReadOrAClearError) {
  const IdxArray a = patterned({3, 4, 5});
  for (bool gzip : {false, true}) {
    const std::string file = path(gzip ? "fuzz.gz" : "fuzz");
    write_idx(file, a, gzip);
    const std::vector<uint8_t> whole = read_bytes(file);
    auto outcome = [&](const std::vector<uint8_t>& bytes) -> std::string {
      write_bytes(file, bytes);
      try {
        const IdxArray back = read_idx(file);
        return back.dims == a.dims && back.data == a.data ? "same" : "different";
      } catch (const Error& error) {
        EXPECT_NE(std::string(error.what()).find(file), std::string::npos) << error.what();
        return "error";
      }
    };
    for (size_t length = 0; length < whole.size(); ++length) {
      const std::vector<uint8_t> cut(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(length));
      EXPECT_EQ(outcome(cut), "error") << (gzip ? "gzip" : "plain") << " file cut to " << length << " bytes";
    }
    for (size_t at = 0; at < whole.size(); ++at) {
      std::vector<uint8_t> flipped = whole;
      flipped[at] ^= 0x5a;
      const std::string result = outcome(flipped);
      // A plain file has no checksum: a flipped data byte reads as other data. Its header bytes,
      // flipped with 0x5a here, give a bad magic or dimensions larger than the file holds.
      if (!gzip && at < 4 + 4 * a.dims.size()) {
        EXPECT_EQ(result, "error") << "plain header byte " << at;
      }
      if (gzip && result == "different") {
        ADD_FAILURE() << "gzip byte " << at << " changed the data unnoticed";
      }
    }
  }
}

TEST_F(DataIdx, WriterRejectsInconsistentArray) {
  IdxArray a = patterned({3, 3});
  a.data.pop_back();
  expect_error([&] { write_idx(path("x"), a, false); }, {path("x"), "need 9 bytes"});
  expect_error([&] { write_idx(path("y"), IdxArray{}, true); }, {path("y"), "0 dimensions"});
}

// ---------------------------------------------------------------------------- Fashion-MNIST

using DataFashionMnist = TempDir;

IdxArray labels_of(std::vector<uint8_t> values) {
  IdxArray a;
  a.dims = {static_cast<int64_t>(values.size())};
  a.data = std::move(values);
  return a;
}

TEST_F(DataFashionMnist, LoadsSmallFilesAndScalesPixels) {
  IdxArray images = patterned({3, 2, 2});
  images.data[0] = 255;
  images.data[1] = 0;
  write_idx(path("train-images-idx3-ubyte.gz"), images, true);
  write_idx(path("train-labels-idx1-ubyte.gz"), labels_of({9, 0, 4}), true);
  const Dataset d = load_fashion_mnist(dir_.string(), Split::Train);
  EXPECT_EQ(d.count, 3);
  EXPECT_EQ(d.rows, 2);
  EXPECT_EQ(d.cols, 2);
  EXPECT_EQ(d.labels, (std::vector<int32_t>{9, 0, 4}));
  ASSERT_EQ(d.images.size(), 12u);
  EXPECT_EQ(d.images[0], 1.0f);
  EXPECT_EQ(d.images[1], 0.0f);
  for (size_t i = 0; i < d.images.size(); ++i) {
    EXPECT_FLOAT_EQ(d.images[i], images.data[i] / 255.0f);
  }
}

TEST_F(DataFashionMnist, PrefersGzipAndFallsBackToPlain) {
  write_idx(path("t10k-images-idx3-ubyte"), patterned({2, 1, 1}), false);
  write_idx(path("t10k-labels-idx1-ubyte"), labels_of({1, 2}), false);
  EXPECT_EQ(load_fashion_mnist(dir_.string(), Split::Test).labels,
            (std::vector<int32_t>{1, 2}));
  write_idx(path("t10k-labels-idx1-ubyte.gz"), labels_of({3, 4}), true);
  EXPECT_EQ(load_fashion_mnist(dir_.string(), Split::Test).labels,
            (std::vector<int32_t>{3, 4}));
}

TEST_F(DataFashionMnist, CountMismatchNamesBothFiles) {
  write_idx(path("train-images-idx3-ubyte.gz"), patterned({3, 2, 2}), true);
  write_idx(path("train-labels-idx1-ubyte.gz"), labels_of({1, 2}), true);
  expect_error([&] { load_fashion_mnist(dir_.string(), Split::Train); },
               {"count mismatch", path("train-images-idx3-ubyte.gz"),
                path("train-labels-idx1-ubyte.gz"), "3 images", "2 labels"});
}

TEST_F(DataFashionMnist, LabelOutOfRange) {
  write_idx(path("train-images-idx3-ubyte.gz"), patterned({3, 2, 2}), true);
  write_idx(path("train-labels-idx1-ubyte.gz"), labels_of({1, 10, 2}), true);
  expect_error([&] { load_fashion_mnist(dir_.string(), Split::Train); },
               {path("train-labels-idx1-ubyte.gz"), "label 10", "index 1", "0..9"});
}

TEST_F(DataFashionMnist, ImagesMustBe3D) {
  write_idx(path("train-images-idx3-ubyte.gz"), patterned({3, 4}), true);
  write_idx(path("train-labels-idx1-ubyte.gz"), labels_of({1, 2, 3}), true);
  expect_error([&] { load_fashion_mnist(dir_.string(), Split::Train); },
               {path("train-images-idx3-ubyte.gz"), "3-D"});
}

// A gzip file of a few KB whose header claims 2^39 pixels (a gzip bomb, or a corrupt header) is
// refused before its data is inflated, naming the file: not an out-of-memory kill, not bad_alloc.
TEST_F(DataFashionMnist, AClaimAboveWhatMemoryHoldsIsRefusedBeforeInflating) {
  const int64_t claimed = int64_t{1} << 39;
  const int64_t available = available_memory_bytes();
  if (available <= 0 || available / 5 >= claimed) GTEST_SKIP() << "memory unknown, or 2.5 TiB available";
  std::vector<uint8_t> bytes = {0, 0, 8, 3, 0, 0, 0x40, 0, 0, 0, 0x20, 0, 0, 0, 0x10, 0};  // (2^14, 2^13, 2^12)
  bytes.resize(bytes.size() + (1 << 20), 0);
  write_gz_bytes(path("train-images-idx3-ubyte.gz"), bytes);
  write_idx(path("train-labels-idx1-ubyte.gz"), labels_of({1, 2}), true);
  expect_error([&] { load_fashion_mnist(dir_.string(), Split::Train); },
               {path("train-images-idx3-ubyte.gz"), "claims 549755813888 bytes", "allowed"});
}

// An empty set would train nothing and report 0% accuracy; a pipe would block the loader for
// ever; a file given as the directory is not "missing". Each is named when the data is loaded.
TEST_F(DataFashionMnist, EmptySetsPipesAndAFileForTheDirectoryAreNamed) {
  write_idx(path("train-images-idx3-ubyte.gz"), patterned({0, 28, 28}), true);
  write_idx(path("train-labels-idx1-ubyte.gz"), labels_of({}), true);
  expect_error([&] { load_fashion_mnist(dir_.string(), Split::Train); },
               {path("train-images-idx3-ubyte.gz"), "holds no samples", "0 images of 28x28"});
  write_idx(path("t10k-images-idx3-ubyte"), patterned({2, 1, 1}), false);
  ASSERT_EQ(::mkfifo(path("t10k-labels-idx1-ubyte").c_str(), 0600), 0);
  expect_error([&] { load_fashion_mnist(dir_.string(), Split::Test); },
               {path("t10k-labels-idx1-ubyte"), "is not a regular file"});
  expect_error([&] { load_fashion_mnist(path("t10k-images-idx3-ubyte"), Split::Test); },
               {path("t10k-images-idx3-ubyte"), "is not a directory"});
}

TEST_F(DataFashionMnist, MissingDirectoryOrFileSaysHowToGetIt) {
  const std::string missing = path("no-such-dir");
  expect_error([&] { load_fashion_mnist(missing, Split::Train); },
               {missing, "does not exist", "apt-get install dataset-fashion-mnist",
                "QUIVER_DATA_DIR", "--data"});
  expect_error([&] { load_fashion_mnist(dir_.string(), Split::Test); },
               {path("t10k-images-idx3-ubyte.gz"), path("t10k-images-idx3-ubyte"),
                "apt-get install dataset-fashion-mnist"});
}

// A path that cannot be looked at (here a link to itself, as a directory the user may not search
// would be for a non-root user) is said as it is, not as a missing package to install.
TEST_F(DataFashionMnist, APathThatCannotBeAccessedIsNotCalledMissing) {
  const std::string loop = path("loop");
  ASSERT_EQ(::symlink("loop", loop.c_str()), 0);
  expect_error([&] { load_fashion_mnist(loop, Split::Train); }, {"cannot access '" + loop + "'", "symbolic links"});
  ASSERT_EQ(::symlink("train-images-idx3-ubyte.gz", path("train-images-idx3-ubyte.gz").c_str()), 0);
  expect_error([&] { load_fashion_mnist(dir_.string(), Split::Train); },
               {"cannot access '" + path("train-images-idx3-ubyte.gz") + "'", "symbolic links"});
}

TEST(DataFashionMnistDir, DefaultDirHonoursEnvironment) {
  const char* saved = std::getenv("QUIVER_DATA_DIR");
  const std::string saved_value = saved ? saved : "";
  ::setenv("QUIVER_DATA_DIR", "/some/where", 1);
  EXPECT_EQ(default_fashion_mnist_dir(), "/some/where");
  ::setenv("QUIVER_DATA_DIR", "", 1);
  EXPECT_EQ(default_fashion_mnist_dir(), "/usr/share/datasets/fashion-mnist");
  ::unsetenv("QUIVER_DATA_DIR");
  EXPECT_EQ(default_fashion_mnist_dir(), "/usr/share/datasets/fashion-mnist");
  if (saved) ::setenv("QUIVER_DATA_DIR", saved_value.c_str(), 1);
}

void check_real_split(Split split, int64_t expected_count) {
  const std::string dir = default_fashion_mnist_dir();
  if (!fs::is_directory(dir)) {  // a declared dependency: missing is a failure unless skipping is asked for
    const char* allow = std::getenv("QUIVER_ALLOW_MISSING_DATA");
    if (allow && std::string(allow) == "1") GTEST_SKIP() << "Fashion-MNIST not found at '" << dir << "'";
    FAIL() << "Fashion-MNIST not found at '" << dir << "' (apt-get install dataset-fashion-mnist, or set "
           << "QUIVER_DATA_DIR; QUIVER_ALLOW_MISSING_DATA=1 skips this test)";
  }
  const Dataset d = load_fashion_mnist(dir, split);
  EXPECT_EQ(d.count, expected_count);
  EXPECT_EQ(d.rows, 28);
  EXPECT_EQ(d.cols, 28);
  ASSERT_EQ(d.images.size(), static_cast<size_t>(expected_count * 28 * 28));
  ASSERT_EQ(d.labels.size(), static_cast<size_t>(expected_count));
  const auto [lo, hi] = std::minmax_element(d.images.begin(), d.images.end());
  EXPECT_GE(*lo, 0.0f);
  EXPECT_LE(*hi, 1.0f);
  EXPECT_GT(*hi, 0.5f) << "pixels look unscaled or blank";
  std::map<int32_t, int64_t> per_class;
  for (int32_t label : d.labels) ++per_class[label];
  ASSERT_EQ(per_class.size(), 10u);
  for (const auto& [label, n] : per_class) {
    EXPECT_GE(label, 0);
    EXPECT_LE(label, 9);
    EXPECT_EQ(n, expected_count / 10) << "class " << label;
  }
}

TEST(DataFashionMnistReal, TrainSplit) { check_real_split(Split::Train, 60000); }
TEST(DataFashionMnistReal, TestSplit) { check_real_split(Split::Test, 10000); }

// ---------------------------------------------------------------------------- Batcher

// Sample i has every pixel equal to i and label i % 10, so a batch row names its sample.
Dataset numbered(int64_t count, int64_t rows = 2, int64_t cols = 3) {
  Dataset d;
  d.count = count;
  d.rows = rows;
  d.cols = cols;
  for (int64_t i = 0; i < count; ++i) {
    d.images.insert(d.images.end(), static_cast<size_t>(rows * cols), static_cast<float>(i));
    d.labels.push_back(static_cast<int32_t>(i % 10));
  }
  return d;
}

// The sample indices of one epoch, read from consecutive batches; checks batch bookkeeping.
std::vector<int64_t> take_epoch(Batcher& batcher, int64_t epoch, int64_t features) {
  std::vector<int64_t> seen;
  for (int64_t b = 0; b < batcher.batches_per_epoch(); ++b) {
    const Batch batch = batcher.next();
    EXPECT_EQ(batch.epoch, epoch);
    EXPECT_EQ(batch.index_in_epoch, b);
    EXPECT_EQ(batch.images.size(), static_cast<size_t>(batch.size * features));
    EXPECT_EQ(batch.labels.size(), static_cast<size_t>(batch.size));
    for (int64_t row = 0; row < batch.size; ++row) {
      const auto sample = static_cast<int64_t>(batch.images[static_cast<size_t>(row * features)]);
      EXPECT_EQ(batch.images[static_cast<size_t>(row * features + features - 1)], sample);
      EXPECT_EQ(batch.labels[static_cast<size_t>(row)], sample % 10);
      seen.push_back(sample);
    }
  }
  return seen;
}

TEST(DataBatcher, EverySampleOncePerEpochAndSmallerLastBatchWithoutDropLast) {
  const Dataset d = numbered(103);
  BatcherOptions options;
  options.batch_size = 10;
  options.drop_last = false;
  Batcher batcher(d, options);
  ASSERT_EQ(batcher.batches_per_epoch(), 11);
  for (int64_t b = 0; b < 11; ++b) EXPECT_EQ(batcher.next().size, b < 10 ? 10 : 3);
  for (int64_t epoch = 1; epoch < 4; ++epoch) {
    std::vector<int64_t> seen = take_epoch(batcher, epoch, 6);
    ASSERT_EQ(seen.size(), 103u);
    std::sort(seen.begin(), seen.end());
    for (int64_t i = 0; i < 103; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], i);
  }
}

TEST(DataBatcher, DropLastCount) {
  const Dataset d = numbered(103);
  BatcherOptions options;
  options.batch_size = 10;
  Batcher batcher(d, options);
  ASSERT_EQ(batcher.batches_per_epoch(), 10);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    EXPECT_EQ(take_epoch(batcher, epoch, 6).size(), 100u);  // every batch full, 3 left out
  }
}

TEST(DataBatcher, OrderDependsOnlyOnSeedAndEpoch) {
  const Dataset d = numbered(200);
  BatcherOptions options;
  options.batch_size = 20;
  options.seed = 7;
  Batcher a(d, options);
  Batcher same(d, options);
  const std::vector<int64_t> epoch0 = take_epoch(a, 0, 6);
  const std::vector<int64_t> epoch1 = take_epoch(a, 1, 6);
  EXPECT_EQ(take_epoch(same, 0, 6), epoch0);
  EXPECT_EQ(take_epoch(same, 1, 6), epoch1);
  EXPECT_NE(epoch0, epoch1);
  EXPECT_EQ(epoch0, epoch_order(200, 7, 0, true));
  EXPECT_EQ(epoch1, epoch_order(200, 7, 1, true));
  options.seed = 8;
  Batcher other_seed(d, options);
  EXPECT_NE(take_epoch(other_seed, 0, 6), epoch0);
}

// A Batcher started at epoch e hands out epoch e's order first (a resumed run continues).
TEST(DataBatcher, FirstEpochContinuesTheOrder) {
  const Dataset d = numbered(120);
  BatcherOptions options{.batch_size = 20, .seed = 5, .first_epoch = 2};
  Batcher from_two(d, options);
  EXPECT_EQ(take_epoch(from_two, 2, 6), epoch_order(120, 5, 2, true));
  EXPECT_EQ(take_epoch(from_two, 3, 6), epoch_order(120, 5, 3, true));
  options.first_epoch = -1;
  EXPECT_THROW(Batcher(d, options), Error);
}

// A Batcher started at batch b of epoch e (a resumed run whose epoch was cut short) hands out that
// epoch's order from sample b x batch on, then the next epoch whole; b must be one of the epoch's.
TEST(DataBatcher, FirstBatchContinuesACutEpoch) {
  const Dataset d = numbered(120);
  BatcherOptions options{.batch_size = 20, .seed = 5, .first_epoch = 2, .first_batch = 4};
  Batcher from_four(d, options);
  const std::vector<int64_t> order = epoch_order(120, 5, 2, true);
  for (int64_t b = 4; b < 6; ++b) {
    const Batch batch = from_four.next();
    EXPECT_EQ(batch.epoch, 2);
    EXPECT_EQ(batch.index_in_epoch, b);
    for (int64_t row = 0; row < batch.size; ++row)
      EXPECT_EQ(static_cast<int64_t>(batch.images[static_cast<size_t>(row * 6)]), order[b * 20 + row]);
  }
  EXPECT_EQ(take_epoch(from_four, 3, 6), epoch_order(120, 5, 3, true));
  for (int64_t bad : {-1, 6, 7}) {
    options.first_batch = bad;
    try {
      Batcher refused(d, options);
      ADD_FAILURE() << "first_batch " << bad << " accepted";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("must be in [0, 6)"), std::string::npos) << error.what();
    }
  }
}

// Without drop_last a batch larger than the data is one batch of every sample, up to INT64_MAX
// (whose rounded-up count overflowed to 0 batches, and the producer spun for ever).
TEST(DataBatcher, AHugeBatchWithoutDropLastIsOneBatch) {
  const Dataset d = numbered(10);
  for (int64_t batch_size : {int64_t{11}, std::numeric_limits<int64_t>::max() - 5, std::numeric_limits<int64_t>::max()}) {
    BatcherOptions options;
    options.batch_size = batch_size;
    options.drop_last = false;
    Batcher batcher(d, options);
    ASSERT_EQ(batcher.batches_per_epoch(), 1) << batch_size;
    EXPECT_EQ(batcher.next().size, 10);
  }
}

TEST(DataBatcher, NoShuffleIsIdentityOrder) {
  const Dataset d = numbered(30);
  BatcherOptions options;
  options.batch_size = 7;
  options.shuffle = false;
  options.drop_last = false;
  Batcher batcher(d, options);
  std::vector<int64_t> expected(30);
  for (int64_t i = 0; i < 30; ++i) expected[static_cast<size_t>(i)] = i;
  EXPECT_EQ(take_epoch(batcher, 0, 6), expected);
  EXPECT_EQ(take_epoch(batcher, 1, 6), expected);
}

// The order must not depend on the standard library or platform: these values are what
// mt19937_64 + our own uniform draw give, and a change here silently changes every run.
TEST(DataBatcher, ShuffleOrderIsPinned) {
  EXPECT_EQ(epoch_order(10, 1, 0, true), (std::vector<int64_t>{5, 0, 8, 7, 3, 1, 9, 6, 4, 2}));
  EXPECT_EQ(epoch_order(10, 1, 1, true), (std::vector<int64_t>{4, 3, 6, 5, 8, 7, 2, 0, 1, 9}));
}

TEST(DataBatcher, RejectsBadOptions) {
  const Dataset d = numbered(10);
  BatcherOptions options;
  options.batch_size = 0;
  expect_error([&] { Batcher b(d, options); }, {"batch_size 0"});
  options.batch_size = 11;
  expect_error([&] { Batcher b(d, options); }, {"batch_size 11", "10 samples"});
  options.drop_last = false;
  EXPECT_NO_THROW({ Batcher b(d, options); EXPECT_EQ(b.batches_per_epoch(), 1); });
  options.batch_size = 4;
  options.prefetch_depth = 0;
  expect_error([&] { Batcher b(d, options); }, {"prefetch_depth"});
  Dataset broken = numbered(10);
  broken.labels.pop_back();
  expect_error([&] { Batcher b(broken, BatcherOptions{}); }, {"inconsistent"});
  // Extents whose product wraps (2^31 x 2^31 x 4 read as 0 floats, matching no images) and
  // negative ones are refused, not taken as consistent (the batcher then died of std::length_error).
  Dataset wrapped;
  wrapped.count = 4, wrapped.rows = wrapped.cols = int64_t{1} << 31;
  wrapped.labels.assign(4, 1);
  expect_error([&] { check_consistent(wrapped, "hand-made"); }, {"hand-made: dataset is inconsistent", "fit in 64 bits"});
  wrapped.rows = wrapped.cols = -28;
  expect_error([&] { check_consistent(wrapped, "hand-made"); }, {"rows and cols must be >= 1"});
  wrapped.rows = wrapped.cols = int64_t{1} << 20;  // 2^40 features x 2^24 samples: 2^64 floats
  wrapped.count = int64_t{1} << 24;
  wrapped.labels.assign(0, 0);
  expect_error([&] { check_consistent(wrapped, "hand-made"); }, {"count x features fit in 64 bits"});
  // The batcher and the trainer's sample check multiply the extents before anything checks the
  // set's consistency: a product past 64 bits is refused there too, not computed (UBSan's case).
  wrapped.rows = wrapped.cols = int64_t{1} << 32;
  expect_error([&] { Batcher b(wrapped, BatcherOptions{}); }, {"rows=4294967296", "fit in 64 bits"});
  expect_error([&] { check_samples_fit(models::mlp(), wrapped, "test set"); }, {"takes samples of", "4294967296x4294967296"});
}

TEST(DataBatcher, DestroyMidEpochDoesNotHang) {
  const Dataset d = numbered(1000);
  BatcherOptions options;
  options.batch_size = 10;
  options.prefetch_depth = 2;
  for (int taken = 0; taken < 5; ++taken) {
    Batcher batcher(d, options);
    for (int i = 0; i < taken; ++i) batcher.next();
    // Let the producer fill the queue and block on it before we destroy.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int i = 0; i < 50; ++i) {
    Batcher batcher(d, options);  // destroyed at once, possibly before the thread ran
  }
}

}  // namespace
}  // namespace quiver
