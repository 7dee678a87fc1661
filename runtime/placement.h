// Where the host has put this process's cores, as one measure that can change step times here:
// how long one CPU takes to hand a cache line to another. Two threads pinned to the two CPUs take
// turns on one atomic; half a round trip is the one-way hand-off. Same core complex (a shared L3):
// tens of ns; different dies or sockets: several times that.
//
// Why it is here: on a virtual machine the host places and moves the vCPUs. The benches' step
// times on the 2-vCPU hosts this project is measured on come in phases: in some, intra's step is
// 2-3x its usual time while a one-thread step does not notice (docs/benchmarks.md, "Executor
// policies" and "Where the two vCPUs sit"). Where the two vCPUs sit is one
// candidate cause that can be measured from inside, so the policies and learners benches probe it
// around every timed round and say how many rounds ran with the cores far apart: a median that
// mixes two placements then shows, and a later slow phase can be told apart from a placement.
//
// It is a measurement, not a topology query: it says what a hand-off costs now, whatever the
// reason (dies, sockets, a busy sibling), and it changes under a running program.
#pragma once

#include <string>
#include <vector>

namespace quiver {

// The CPUs this process may run on (its affinity mask), lowest first.
std::vector<int> allowed_cpus();

// One-way cache-line hand-off time between CPUs `a` and `b`, in nanoseconds: the median over
// `batches` batches of `round_trips` round trips each (a batch in which either thread lost its CPU
// reads high; the median does not). Throws quiver::Error for a CPU outside allowed_cpus(), for
// a == b, for counts below 1, and when a thread cannot be pinned. A few milliseconds at most.
double handoff_ns(int a, int b, int round_trips = 2000, int batches = 5);

// The benches' log of hand-off probes between the first two allowed CPUs. A probe more than
// `far_factor` x the lowest one seen so far is "far": the fast phase is the reference, whatever
// its absolute figure on a given machine. With fewer than two allowed CPUs there is nothing to
// probe: probe() returns a negative value and nothing is ever far.
class PlacementLog {
 public:
  explicit PlacementLog(double far_factor = 2.0);
  bool enabled() const { return cpus_.size() >= 2; }
  double probe();              // takes a probe, records it and returns it (ns; negative if disabled)
  void record(double ns);      // records a probe taken elsewhere (tests)
  bool far(double ns) const;   // ns more than far_factor x the lowest recorded
  double lowest() const { return lowest_; }
  double highest() const { return highest_; }
  int probes() const { return count_; }
  // "cpu0 <-> cpu1 cache-line hand-off: 29-168 ns over 12 probes (far: above 58 ns)", or why
  // there is nothing to say.
  std::string summary() const;

 private:
  std::vector<int> cpus_;
  double far_factor_;
  double lowest_ = 0.0, highest_ = 0.0;
  int count_ = 0;
};

}  // namespace quiver
