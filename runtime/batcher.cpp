// Batcher implementation: a portable seeded shuffle and a single producer thread feeding a
// bounded queue. The shuffle avoids std::shuffle and std::uniform_int_distribution because the
// standard leaves their algorithms open, so the same seed would give different orders on
// libstdc++ and libc++; mt19937_64 itself is fully specified.
#include "runtime/batcher.h"

#include <algorithm>
#include <random>
#include <utility>

#include "core/error.h"

namespace quiver {
namespace {

// splitmix64 finaliser: a bijection on 64 bits, so for one seed every epoch maps to a distinct
// engine seed, and nearby (seed, epoch) pairs give unrelated streams.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [0, bound) by rejection: drop the low 2^64 mod bound draws so every residue is
// equally likely.
uint64_t uniform_below(std::mt19937_64& engine, uint64_t bound) {
  const uint64_t reject_below = (0 - bound) % bound;  // == 2^64 mod bound
  for (;;) {
    const uint64_t draw = engine();
    if (draw >= reject_below) return draw % bound;
  }
}

int64_t checked_features(const Dataset& data) {
  int64_t features = 0;
  if (data.rows <= 0 || data.cols <= 0 || __builtin_mul_overflow(data.rows, data.cols, &features)) {
    throw Error(cat("batcher: dataset has rows=", data.rows, " cols=", data.cols,
                    "; both must be positive, their product fit in 64 bits"));
  }
  return features;
}

int64_t count_batches(const Dataset& data, const BatcherOptions& options) {
  if (options.batch_size <= 0) {
    throw Error(cat("batcher: batch_size ", options.batch_size, " must be positive"));
  }
  if (options.prefetch_depth < 1) {
    throw Error(cat("batcher: prefetch_depth ", options.prefetch_depth, " must be at least 1"));
  }
  if (options.first_epoch < 0) {
    throw Error(cat("batcher: first_epoch ", options.first_epoch, " must be >= 0"));
  }
  if (data.count <= 0) {
    throw Error(cat("batcher: dataset is empty (count ", data.count, ")"));
  }
  check_consistent(data, "batcher");
  if (options.drop_last && options.batch_size > data.count) {
    throw Error(cat("batcher: batch_size ", options.batch_size, " exceeds the ", data.count,
                    " samples in the dataset, so drop_last would leave no batches"));
  }
  // Not (count + batch - 1) / batch: that overflows for a batch near INT64_MAX, giving 0 batches,
  // and the producer then looped over empty epochs for ever.
  const int64_t batches = data.count / options.batch_size +
                          (!options.drop_last && data.count % options.batch_size != 0 ? 1 : 0);
  if (options.first_batch < 0 || options.first_batch >= batches) {
    throw Error(cat("batcher: first_batch ", options.first_batch, " must be in [0, ", batches,
                    "), the batches of an epoch"));
  }
  return batches;
}

}  // namespace

std::vector<int64_t> epoch_order(int64_t count, uint64_t seed, int64_t epoch, bool shuffle) {
  if (count < 0 || epoch < 0) {
    throw Error(cat("epoch_order: count ", count, " and epoch ", epoch,
                    " must be non-negative"));
  }
  std::vector<int64_t> order(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) order[static_cast<size_t>(i)] = i;
  if (!shuffle) return order;

  std::mt19937_64 engine(mix64(mix64(seed) ^ static_cast<uint64_t>(epoch)));
  for (int64_t i = count - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(uniform_below(engine, static_cast<uint64_t>(i) + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

Batcher::Batcher(const Dataset& data, BatcherOptions options)
    : data_(data),
      options_(options),
      features_(checked_features(data)),
      batches_per_epoch_(count_batches(data, options)) {
  producer_ = std::thread([this] { produce(); });
}

Batcher::~Batcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  slot_free_.notify_all();
  if (producer_.joinable()) producer_.join();
}

int64_t Batcher::batches_per_epoch() const { return batches_per_epoch_; }

Batch Batcher::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  batch_ready_.wait(lock, [this] { return !queue_.empty() || producer_error_ != nullptr; });
  if (queue_.empty()) std::rethrow_exception(producer_error_);
  Batch batch = std::move(queue_.front());
  queue_.pop_front();
  lock.unlock();
  slot_free_.notify_one();
  return batch;
}

Batch Batcher::assemble(const std::vector<int64_t>& order, int64_t epoch, int64_t index) const {
  const int64_t first = index * options_.batch_size;
  const int64_t size = std::min(options_.batch_size, data_.count - first);
  Batch batch;
  batch.size = size;
  batch.epoch = epoch;
  batch.index_in_epoch = index;
  batch.images.resize(static_cast<size_t>(size * features_));
  batch.labels.resize(static_cast<size_t>(size));
  for (int64_t row = 0; row < size; ++row) {
    const int64_t sample = order[static_cast<size_t>(first + row)];
    const auto src = data_.images.begin() + sample * features_;
    std::copy(src, src + features_, batch.images.begin() + row * features_);
    batch.labels[static_cast<size_t>(row)] = data_.labels[static_cast<size_t>(sample)];
  }
  return batch;
}

int64_t batch_bytes(int64_t batch_size, int64_t features) {
  return batch_size * (features * int64_t{sizeof(float)} + int64_t{sizeof(int32_t)});
}

int64_t batcher_bytes(const BatcherOptions& options, int64_t features) {
  return (options.prefetch_depth + int64_t{1}) * batch_bytes(options.batch_size, features);
}

void Batcher::produce() {
  try {
    for (int64_t epoch = options_.first_epoch;; ++epoch) {
      const std::vector<int64_t> order =
          epoch_order(data_.count, options_.seed, epoch, options_.shuffle);
      for (int64_t index = epoch == options_.first_epoch ? options_.first_batch : 0; index < batches_per_epoch_;
           ++index) {
        Batch batch = assemble(order, epoch, index);
        std::unique_lock<std::mutex> lock(mutex_);
        slot_free_.wait(lock, [this] {
          return stopping_ ||
                 static_cast<int64_t>(queue_.size()) < options_.prefetch_depth;
        });
        if (stopping_) return;
        queue_.push_back(std::move(batch));
        lock.unlock();
        batch_ready_.notify_one();
      }
    }
  } catch (...) {
    // A thread that lets an exception escape terminates the process; hand it to the consumer.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      producer_error_ = std::current_exception();
    }
    batch_ready_.notify_all();
  }
}

}  // namespace quiver
