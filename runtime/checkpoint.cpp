#include "runtime/checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "runtime/atomic_file.h"
#include "runtime/json_text.h"

namespace quiver {

namespace {

constexpr const char* kMagic = "QUIVER-CHECKPOINT 1\n";
// What every version's magic starts with: a file of another version is named as such.
constexpr const char* kFamily = "QUIVER-CHECKPOINT ";
// The header length, the floats and the checksum are stored little-endian, as the host holds them.
static_assert(std::endian::native == std::endian::little, "checkpoints are written in the host's byte order");
// The JSON header (model, counts, the parameters' names and shapes): a few KB for the bundled
// models; a file whose header would be larger is not read.
constexpr std::uintmax_t kLargestHeader = std::uintmax_t{64} << 20;

uint32_t crc_of(const char* data, size_t bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes uInt lengths: feed large buffers in pieces.
  while (bytes > 0) {
    const uInt piece = static_cast<uInt>(std::min<size_t>(bytes, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), piece);
    data += piece, bytes -= piece;
  }
  return static_cast<uint32_t>(crc);
}

// A count in the header: absent is 0 (an older checkpoint); 1.5, -1, "3" or 1e30 are refused (a
// float would be cut, and one past int64_t converted with undefined behaviour).
int64_t header_count(const nlohmann::json& header, const char* name) {
  if (!header.contains(name)) return 0;
  const nlohmann::json& value = header.at(name);
  constexpr int64_t kMost = int64_t{1} << 48;
  if (!value.is_number_integer() || (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t{kMost}) ||
      value.get<int64_t>() < 0 || value.get<int64_t>() > kMost)
    throw Error(cat("\"", name, "\" is ", json_for_message(value), ", not a count in [0, 2^48]"));
  return value.get<int64_t>();
}

nlohmann::json layout_json(const ParamStore& layout) {
  nlohmann::json params = nlohmann::json::array();
  for (const ParamSlot& slot : layout.slots())
    params.push_back({{"name", slot.name}, {"shape", slot.shape.dims()}, {"offset", slot.offset}});
  return params;
}

}  // namespace

void save_checkpoint(const std::string& path, const ParamStore& layout, const Tensor& flat, const CheckpointInfo& info) {
  if (flat.numel() != layout.flat_size())
    throw Error(cat("checkpoint '", path, "': buffer of ", flat.numel(), " values, the model has ", layout.flat_size()));
  nlohmann::json header = {{"model", info.model},
                           {"rounds", info.rounds},
                           {"epochs_done", info.epochs_done},
                           {"epoch_samples", info.epoch_samples},
                           {"flat_size", layout.flat_size()},
                           {"params", layout_json(layout)}};
  if (info.seed_known) header["seed"] = info.seed;
  if (info.data_samples > 0) header["data_samples"] = info.data_samples;
  std::string text = kMagic;
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::exception& error) {  // names of bytes that are not UTF-8 text
    throw Error(cat("checkpoint '", path, "': not saved: the model's or a parameter's name is not UTF-8 text (",
                    error.what(), ")"));
  }
  if (header_text.size() > kLargestHeader)  // load would not read it
    throw Error(cat("checkpoint '", path, "': not saved: its header (the parameters' names and shapes) takes ",
                    header_text.size(), " bytes, more than the ", kLargestHeader, " a checkpoint may hold"));
  const uint64_t header_bytes = header_text.size();
  text.append(reinterpret_cast<const char*>(&header_bytes), sizeof(header_bytes));
  text += header_text;
  const Tensor host = flat.to_cpu();  // a device model is copied out first
  // A diverged model is not saved: load would refuse it, and the file it replaces may be the last
  // good one (with one learner the average model is its replica, whose failed step ran in full).
  for (int64_t i = 0; i < host.numel(); ++i)
    if (!std::isfinite(host.f32()[i]))
      throw Error(cat("checkpoint '", path, "': not saved: parameter value ", i, " is ", host.f32()[i],
                      " (the model has diverged)"));
  text.append(reinterpret_cast<const char*>(host.f32()), static_cast<size_t>(host.bytes()));
  const uint32_t crc = crc_of(text.data(), text.size());
  text.append(reinterpret_cast<const char*>(&crc), sizeof(crc));
  write_file_atomically(path, text, "checkpoint");
}

CheckpointInfo load_checkpoint(const std::string& path, const ParamStore& layout, const Tensor& flat,
                               const std::string& model) {
  // A pipe would block the open, a device such as /dev/zero would be read for ever.
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    if (error && error != std::errc::no_such_file_or_directory)
      throw Error(cat("checkpoint '", path, "': cannot read it: ", error.message()));
    const bool exists = std::filesystem::exists(path, error);
    throw Error(cat("checkpoint '", path, "': ", exists ? "not a regular file" : "no such file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(cat("checkpoint '", path, "': cannot open it"));
  // A file given by mistake (an archive, a disk image) is refused by its first bytes, and one
  // larger than any checkpoint of this model by its size, before it is read whole.
  const size_t magic = std::strlen(kMagic);
  std::string head(magic, '\0');
  in.read(head.data(), static_cast<std::streamsize>(magic));
  if (static_cast<size_t>(in.gcount()) != magic || head != kMagic) {
    const size_t family = std::strlen(kFamily);
    if (static_cast<size_t>(in.gcount()) > family && head.compare(0, family, kFamily) == 0) {
      std::string version = head.substr(family);  // up to its line's end, which may lie further on
      for (char c = 0; version.find('\n') == std::string::npos && version.size() < 32 && in.get(c);) version += c;
      version.resize(std::min(version.size(), version.find('\n')));
      throw Error(cat("checkpoint '", path, "': a Quiver checkpoint of format version ", json_for_message(version),
                      "; this build reads version 1"));
    }
    throw Error(cat("checkpoint '", path, "': not a Quiver checkpoint (bad magic)"));
  }
  const std::uintmax_t largest = magic + sizeof(uint64_t) + kLargestHeader + static_cast<std::uintmax_t>(flat.bytes()) +
                                 sizeof(uint32_t);
  if (const std::uintmax_t size = std::filesystem::file_size(path, error); !error && size > largest)
    throw Error(cat("checkpoint '", path, "': ", size, " bytes, more than a checkpoint of model '", model,
                    "' can hold (at most ", largest, ")"));
  in.seekg(0);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  if (text.size() < magic || text.compare(0, magic, kMagic) != 0)  // the file changed meanwhile
    throw Error(cat("checkpoint '", path, "': not a Quiver checkpoint (bad magic)"));
  uint64_t header_bytes = 0;
  if (text.size() < magic + sizeof(header_bytes) + sizeof(uint32_t))
    throw Error(cat("checkpoint '", path, "': truncated (", text.size(), " bytes)"));
  std::memcpy(&header_bytes, text.data() + magic, sizeof(header_bytes));
  if (header_bytes > text.size() - magic - sizeof(header_bytes))
    throw Error(cat("checkpoint '", path, "': corrupted or truncated (its header length reads ", header_bytes,
                    " bytes; the file holds ", text.size(), ")"));
  // The checksum covers the header too: check it first, so a damaged header is reported as damage.
  uint32_t stored = 0;
  std::memcpy(&stored, text.data() + text.size() - sizeof(stored), sizeof(stored));
  if (crc_of(text.data(), text.size() - sizeof(stored)) != stored)
    throw Error(cat("checkpoint '", path, "': checksum mismatch (the file is corrupted or truncated)"));
  nlohmann::json header;
  std::string holds;
  int64_t flat_size = -1;
  bool same_layout = false;
  CheckpointInfo info;
  info.model = model;
  try {
    header = nlohmann::json::parse(text.substr(magic + sizeof(header_bytes), header_bytes));
    if (!header.is_object()) throw Error("the header is not an object");
    holds = header.value("model", "?");
    // A count like the others: a float of 1e300 would convert with undefined behaviour.
    flat_size = header.contains("flat_size") ? header_count(header, "flat_size") : -1;
    same_layout = header.contains("params") && header.at("params") == layout_json(layout);
    info.rounds = header_count(header, "rounds");
    info.epochs_done = header_count(header, "epochs_done");
    info.epoch_samples = header_count(header, "epoch_samples");
    if (header.contains("seed")) {
      if (!header.at("seed").is_number_unsigned() && !(header.at("seed").is_number_integer() && header.at("seed").get<int64_t>() >= 0))
        throw Error(cat("\"seed\" is ", json_for_message(header.at("seed")), ", not a seed"));
      info.seed = header.at("seed").get<uint64_t>();
      info.seed_known = true;
    }
    if (header.contains("data_samples")) info.data_samples = header_count(header, "data_samples");
  } catch (const std::exception& error) {  // a malformed header, or a field of the wrong type
    throw Error(cat("checkpoint '", path, "': unreadable header: ", error.what()));
  }
  // A checksum vouches for the bytes, not for the values a writer put there.
  if (info.epochs_done > info.rounds)
    throw Error(cat("checkpoint '", path, "': implausible header: ", info.rounds, " rounds and ", info.epochs_done,
                    " epochs done (0 <= epochs <= rounds <= 2^48)"));
  // A cut epoch's samples: some rounds trained them, and fewer than its training set holds.
  if (info.epoch_samples > 0 && (info.rounds == 0 || (info.data_samples > 0 && info.epoch_samples >= info.data_samples)))
    throw Error(cat("checkpoint '", path, "': implausible header: ", info.epoch_samples, " samples of a cut epoch after ",
                    info.rounds, " rounds, over a training set of ", info.data_samples,
                    " (0 < samples < the training set's, after a round)"));
  if (holds != model) throw Error(cat("checkpoint '", path, "': holds model '", holds, "', not '", model, "'"));
  if (flat_size != layout.flat_size() || !same_layout)
    throw Error(cat("checkpoint '", path, "': its parameters (names, shapes, layout) differ from model '", model, "'"));
  const size_t data_at = magic + sizeof(header_bytes) + header_bytes;
  const size_t expected = data_at + static_cast<size_t>(flat.bytes()) + sizeof(uint32_t);
  if (text.size() != expected)
    throw Error(cat("checkpoint '", path, "': truncated or the wrong size (", text.size(), " bytes, expected ", expected, ")"));
  // Checked before anything is written: a refused checkpoint leaves the model as it was.
  Tensor host = Tensor::empty(flat.shape(), DType::F32);
  std::memcpy(host.f32(), text.data() + data_at, static_cast<size_t>(flat.bytes()));
  for (int64_t i = 0; i < host.numel(); ++i)
    if (!std::isfinite(host.f32()[i]))
      throw Error(cat("checkpoint '", path, "': parameter value ", i, " is ", host.f32()[i],
                      " (a model that had diverged when it was saved)"));
  flat.copy_from(host);
  return info;
}

}  // namespace quiver
