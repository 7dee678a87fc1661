// quiver-train: train a bundled model (MLP, CNN or LSTM) on Fashion-MNIST, with a live progress
// line, test accuracy per epoch and the final throughput.
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "core/error.h"
#include "examples/train_options.h"
#include "models/models.h"
#include "runtime/fashion_mnist.h"

namespace {

std::string clock_text(double seconds) {
  int total = static_cast<int>(seconds + 0.5);
  char text[32];
  std::snprintf(text, sizeof(text), "%d:%02d", total / 60, total % 60);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace quiver;
  TrainCommand command;
  try {
    command = parse_train_command(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const Error& error) {
    std::cerr << "quiver-train: " << error.what() << "\n";
    return 2;
  }
  if (command.help) {
    std::cout << train_usage();
    return 0;
  }
  try {
    std::string dir = command.data_dir.empty() ? default_fashion_mnist_dir() : command.data_dir;
    Dataset train = load_fashion_mnist(dir, Split::Train);
    Dataset test = load_fashion_mnist(dir, Split::Test);
    const TrainOptions& o = command.train;
    std::cout << "quiver-train: model " << command.model << ", batch " << o.batch << ", "
              << o.threads << " thread(s), policy " << o.policy;
    if (o.policy == "fixed") std::cout << " " << o.inter << "x" << o.intra;
    std::cout << ", " << o.optimizer << " lr " << o.learning_rate
              << ", seed " << o.seed << ", data " << dir << " (" << train.count << " train, "
              << test.count << " test)\n";
    Trainer trainer(models::by_name(command.model), o);
    if (const Executor* executor = trainer.executor(); executor && executor->policy() == Policy::Auto) {
      if (executor->loaded_from_cache())
        std::cout << "auto: op profiles from " << o.profile_cache << "; trying schedules over the first "
                  << executor->tuning_runs_left() << " steps\n";
      else
        std::cout << "auto: profiling ops and trying schedules over the first " << executor->tuning_runs_left()
                  << " steps" << (o.profile_cache.empty() ? std::string() : cat(" (profiles cached in ", o.profile_cache, ")"))
                  << "\n";
    }
    const bool live = !command.quiet && isatty(fileno(stdout));
    if (!command.quiet)
      trainer.on_progress([live](const Progress& p) {
        char line[160];
        std::snprintf(line, sizeof(line),
                      "epoch %lld/%lld  step %lld/%lld  loss %.4f  %.0f samples/s  ETA %s",
                      static_cast<long long>(p.epoch), static_cast<long long>(p.epochs),
                      static_cast<long long>(p.step), static_cast<long long>(p.steps_in_epoch),
                      p.loss, p.samples_per_second, clock_text(p.eta_seconds).c_str());
        if (live) {
          std::cout << "\r" << line << "   " << std::flush;
        } else if (p.step == p.steps_in_epoch || p.step % 100 == 0) {
          std::cout << line << "\n";
        }
      });
    TrainReport report = trainer.fit(train, &test);
    if (live) std::cout << "\n";
    for (const EpochReport& e : report.epochs)
      std::printf("epoch %lld: loss %.4f  train accuracy %.2f%%  test accuracy %.2f%%  (%.1f s, %.0f samples/s)\n",
                  static_cast<long long>(e.epoch), e.mean_loss, 100.0 * e.train_accuracy,
                  100.0 * e.test_accuracy, e.seconds, e.samples_per_second);
    std::printf("throughput: %.0f samples/s over %lld steps (%.1f s)\n", report.samples_per_second,
                static_cast<long long>(report.steps), report.seconds);
    if (command.explain) {
      if (trainer.executor())
        std::cout << trainer.executor()->explain();
      else
        std::cout << "explain: no executor (empty policy)\n";
    }
  } catch (const Error& error) {
    std::cerr << "\nquiver-train: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
