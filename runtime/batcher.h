// Batcher: endless, reproducible mini-batch iteration over a Dataset, with batches assembled
// ahead of time on a background thread so the training loop never waits on copying.
// The order of epoch e depends only on (seed, e) and is the same on every standard library.
// It is not a data loader (see fashion_mnist.h), does no augmentation, and is not meant to be
// shared between consumer threads: one Batcher feeds one training loop.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/fashion_mnist.h"

namespace quiver {

struct Batch {
  int64_t size = 0;
  std::vector<float> images;    // (size, features)
  std::vector<int32_t> labels;  // (size)
  int64_t epoch = 0;
  int64_t index_in_epoch = 0;
};

struct BatcherOptions {
  int64_t batch_size = 64;
  uint64_t seed = 1;
  bool shuffle = true;
  bool drop_last = true;   // false: the last batch of an epoch holds the remainder
  int prefetch_depth = 4;  // batches assembled ahead of the consumer
  int64_t first_epoch = 0;  // the epoch to start from: a resumed run continues the order
  int64_t first_batch = 0;  // and the batch of first_epoch to start from (one cut short goes on)
};

// The sample order of `epoch`: a Fisher-Yates shuffle of 0..count-1 driven by an mt19937_64
// seeded from (seed, epoch), or 0..count-1 when `shuffle` is false. Exposed so a run can be
// audited or resumed without building a Batcher.
std::vector<int64_t> epoch_order(int64_t count, uint64_t seed, int64_t epoch, bool shuffle);

// Bytes of a batch of `batch_size` samples of `features` floats and a label each.
int64_t batch_bytes(int64_t batch_size, int64_t features);
// The most a Batcher holds at once, in bytes: its queue (prefetch_depth batches) and the batch it
// has assembled while it waits for a slot. The consumer's batch in hand is the caller's to count.
int64_t batcher_bytes(const BatcherOptions& options, int64_t features);

class Batcher {  // iterates epochs forever; batches_per_epoch() batches per epoch
 public:
  // Keeps a reference to `data`, which must outlive the Batcher and not change while it runs.
  // Throws quiver::Error on batch_size <= 0, batch_size > count (when drop_last), an empty or
  // inconsistent dataset, prefetch_depth < 1, or first_batch outside [0, batches_per_epoch()).
  Batcher(const Dataset& data, BatcherOptions options);
  // Stops and joins the prefetch thread, even if the consumer stopped mid-epoch.
  ~Batcher();

  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  int64_t batches_per_epoch() const;
  // Blocks until the prefetch thread has a batch ready; rethrows an exception the prefetch
  // thread hit, once the batches it finished before it have been handed out.
  Batch next();

 private:
  void produce();
  Batch assemble(const std::vector<int64_t>& order, int64_t epoch, int64_t index) const;

  const Dataset& data_;
  const BatcherOptions options_;
  const int64_t features_;
  const int64_t batches_per_epoch_;

  std::mutex mutex_;
  std::condition_variable batch_ready_;  // consumer waits: queue non-empty or error
  std::condition_variable slot_free_;    // producer waits: queue below depth or stopping
  std::deque<Batch> queue_;
  std::exception_ptr producer_error_;
  bool stopping_ = false;

  std::thread producer_;  // last member: started once everything above is initialised
};

}  // namespace quiver
