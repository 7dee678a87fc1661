#include "runtime/placement.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <system_error>
#include <thread>

#include "core/error.h"

namespace quiver {

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  return cpus;
}

namespace {

bool pin_this_thread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

// The line the two threads hand back and forth, alone in its cache line.
struct alignas(64) Turn {
  std::atomic<int64_t> value{0};
  char padding[64 - sizeof(std::atomic<int64_t>)];
};

}  // namespace

double handoff_ns(int a, int b, int round_trips, int batches) {
  const std::vector<int> cpus = allowed_cpus();
  for (int cpu : {a, b})
    if (std::find(cpus.begin(), cpus.end(), cpu) == cpus.end())
      throw Error(cat("handoff_ns: cpu ", cpu, " is not one this process may run on (", cpus.size(), " allowed)"));
  if (a == b) throw Error(cat("handoff_ns: needs two different CPUs, got cpu ", a, " twice"));
  if (round_trips < 1 || batches < 1)
    throw Error(cat("handoff_ns: round_trips and batches must be at least 1, got ", round_trips, " and ", batches));

  Turn turn;
  std::atomic<int> ready{0};
  std::atomic<bool> failed{false};
  // Both threads pin themselves, then meet: a thread that could not pin says so before the
  // meeting, so both see it after and neither starts the exchange.
  auto pin_and_meet = [&](int cpu) {
    if (!pin_this_thread(cpu)) failed.store(true);
    ready.fetch_add(1);
    while (ready.load() < 2) std::this_thread::yield();
    return !failed.load();
  };
  const int64_t total = static_cast<int64_t>(round_trips) * batches;
  std::vector<double> batch_ns;
  batch_ns.reserve(static_cast<size_t>(batches));  // the timer thread only appends: no allocation there
  std::thread responder;
  try {
    responder = std::thread([&] {
      if (!pin_and_meet(b)) return;
      for (int64_t i = 0; i < total; ++i) {
        while (turn.value.load(std::memory_order_acquire) != 2 * i + 1) {
        }
        turn.value.store(2 * i + 2, std::memory_order_release);
      }
    });
  } catch (const std::system_error& error) {
    throw Error(cat("handoff_ns: cannot start a thread: ", error.what()));
  }
  // A timer thread that cannot start would leave the responder waiting to meet it, and a joinable
  // std::thread destroyed by the unwinding ends the process: it is released and joined first.
  std::thread timer;
  try {
    timer = std::thread([&] {
      if (!pin_and_meet(a)) return;
      using Clock = std::chrono::steady_clock;
      int64_t i = 0;
      for (int batch = 0; batch < batches; ++batch) {
        const Clock::time_point start = Clock::now();
        for (int r = 0; r < round_trips; ++r, ++i) {
          turn.value.store(2 * i + 1, std::memory_order_release);
          while (turn.value.load(std::memory_order_acquire) != 2 * i + 2) {
          }
        }
        const double ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
        batch_ns.push_back(ns / (2.0 * round_trips));
      }
    });
  } catch (const std::system_error& error) {
    failed.store(true);
    ready.fetch_add(1);
    responder.join();
    throw Error(cat("handoff_ns: cannot start a thread: ", error.what()));
  }
  timer.join();
  responder.join();
  if (failed.load()) throw Error(cat("handoff_ns: could not pin a thread to cpu ", a, " or cpu ", b));
  std::sort(batch_ns.begin(), batch_ns.end());
  return batch_ns[batch_ns.size() / 2];
}

PlacementLog::PlacementLog(double far_factor) : far_factor_(far_factor) {
  if (!(far_factor > 1.0)) throw Error(cat("PlacementLog: far_factor must be above 1, got ", far_factor));
  cpus_ = allowed_cpus();
}

double PlacementLog::probe() {
  if (!enabled()) return -1.0;
  const double ns = handoff_ns(cpus_[0], cpus_[1]);
  record(ns);
  return ns;
}

void PlacementLog::record(double ns) {
  if (!(ns > 0.0)) throw Error(cat("PlacementLog: a hand-off time must be positive, got ", ns));
  lowest_ = count_ == 0 ? ns : std::min(lowest_, ns);
  highest_ = count_ == 0 ? ns : std::max(highest_, ns);
  ++count_;
}

bool PlacementLog::far(double ns) const { return count_ > 0 && ns > far_factor_ * lowest_; }

std::string PlacementLog::summary() const {
  if (!enabled()) return "one CPU: no cache-line hand-off to probe";
  if (count_ == 0) return "no cache-line hand-off probed yet";
  char text[200];
  std::snprintf(text, sizeof(text), "cpu%d <-> cpu%d cache-line hand-off: %.0f-%.0f ns over %d probes (far: above %.0f ns)",
                cpus_[0], cpus_[1], lowest_, highest_, count_, far_factor_ * lowest_);
  return text;
}

}  // namespace quiver
