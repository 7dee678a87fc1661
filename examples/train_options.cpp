#include "examples/train_options.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/float_range.h"
#include "models/models.h"
#include "runtime/atomic_file.h"
#include "runtime/fashion_mnist.h"
#include "runtime/learners.h"
#include "runtime/perf_model.h"
#include "runtime/thread_budget.h"

namespace quiver {

namespace {

// A file to read later (a checkpoint to resume from): refused now, naming the flag, rather than
// after the data is loaded and the learners are built.
void check_readable(const std::string& path, const std::string& flag) {
  std::error_code error;
  const bool exists = std::filesystem::exists(path, error);
  if (error) throw Error(cat(flag, ": cannot read '", path, "': ", error.message()));
  if (!exists) throw Error(cat(flag, ": cannot read '", path, "': no such file"));
  if (std::filesystem::is_directory(path, error)) throw Error(cat(flag, ": cannot read '", path, "': a directory"));
  // A pipe would block the open, a device such as /dev/zero would be read for ever.
  if (!std::filesystem::is_regular_file(path, error))
    throw Error(cat(flag, ": cannot read '", path, "': not a regular file"));
  if (!std::ifstream(path, std::ios::binary)) throw Error(cat(flag, ": cannot read '", path, "': permission denied"));
}

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min, int64_t max) {
  int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error == std::errc::result_out_of_range && end == text.data() + text.size())
    throw Error(cat(flag, ": ", text, " is out of range [", min, ", ", max, "]"));
  if (error != std::errc() || end != text.data() + text.size())
    throw Error(cat(flag, ": expected an integer, got '", text, "'"));
  if (value < min || value > max)
    throw Error(cat(flag, ": ", value, " is out of range [", min, ", ", max, "]"));
  return value;
}

double parse_number(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double value = 0.0;
  try {
    // stod skips leading blanks; the integer flags do not, and neither do these
    if (!text.empty() && !std::isspace(static_cast<unsigned char>(text[0]))) value = std::stod(text, &used);
  } catch (const std::out_of_range&) {
    throw Error(cat(flag, ": ", text, " is out of range (beyond what a double holds, or too close to 0)"));
  } catch (const std::exception&) {
    used = 0;
  }
  // stod also reads hexadecimal ("0x10" is 16), which the integer flags refuse: so do these.
  const bool hexadecimal = text.find_first_of("xX") != std::string::npos;
  if (used != text.size() || text.empty() || hexadecimal)
    throw Error(cat(flag, ": expected a number, got '", text, "'"));
  return value;
}

// The flags that take a value; the others (--help, --quiet, --explain) stand alone.
bool takes_value(const std::string& flag) {
  static const char* const kFlags[] = {
      "--model", "--epochs", "--max-steps", "--eval-every", "--batch", "--threads", "--optimizer", "--lr",
      "--momentum", "--weight-decay", "--seed", "--device", "--gpus", "--cuda-graphs", "--policy", "--inter", "--intra",
      "--learners", "--threads-per-learner", "--alpha", "--mu-z", "--sync", "--staleness", "--sync-period",
      "--lr-scaling", "--lr-drop", "--lr-drop-factor", "--checkpoint", "--resume", "--profile-cache", "--trace",
      "--data"};
  for (const char* known : kFlags)
    if (flag == known) return true;
  return false;
}

// Whether two file names name the same file, existing or not.
bool same_file(const std::string& a, const std::string& b) {
  std::error_code error;
  // absolute() first: weakly_canonical leaves a relative name with no existing part as it is
  const auto canonical_a = std::filesystem::weakly_canonical(std::filesystem::absolute(a, error), error);
  if (error) return a == b;
  const auto canonical_b = std::filesystem::weakly_canonical(std::filesystem::absolute(b, error), error);
  return error ? a == b : canonical_a == canonical_b;
}

// A float printed with every digit it needs to read back as itself.
std::string exact(float value) {
  std::ostringstream out;
  out << std::setprecision(std::numeric_limits<float>::max_digits10) << value;
  return out.str();
}

double parse_positive(const std::string& flag, const std::string& text) {
  double value = parse_number(flag, text);
  if (!std::isfinite(value) || value <= 0.0)
    throw Error(cat(flag, ": must be a positive finite number, got '", text, "'"));
  // Training computes in 32-bit floats: a value that is 0, subnormal (flushed to 0 in the
  // kernels) or infinite there would leave the model still or blow it up at once.
  if (value < std::numeric_limits<float>::min() || value > std::numeric_limits<float>::max())
    throw Error(cat(flag, ": ", text, " is out of the range of a 32-bit float, which training computes in [",
                    exact(std::numeric_limits<float>::min()), ", ", exact(std::numeric_limits<float>::max()), "]"));
  return value;
}

}  // namespace

std::string clock_text(double seconds) {
  constexpr double kLongest = 1e9;
  const long long total = std::llround(seconds >= 0.0 ? std::min(seconds, kLongest) : 0.0);  // NaN too: 0
  return cat(total == static_cast<long long>(kLongest) ? ">" : "", total / 60, ":", total % 60 < 10 ? "0" : "",
             total % 60);
}

std::string train_usage() {
  return "usage: quiver-train [options]\n"
         "Train a bundled model on Fashion-MNIST on the CPU or a CUDA GPU.\n\n"
         "  --model mlp|cnn|lstm   model to train (default mlp)\n"
         "  --epochs N             passes over the training set (default 1; a --resume run\n"
         "                         trains those the checkpoint has not done)\n"
         "  --max-steps N          stop after N steps in all (with --learners: N rounds, a batch\n"
         "                         per learner each, the checkpoint's counted on --resume;\n"
         "                         default 0: no limit)\n"
         "  --eval-every N         also evaluate the test set every N batches of the run\n"
         "                         (default 0: after each epoch only)\n"
         "  --batch B              batch size (default 64)\n"
         "  --threads T            threads (default: all available cores)\n"
         "  --device D             cpu (default), cuda or cuda:N; on cuda every learner is a\n"
         "                         CUDA stream and --policy/--threads do not apply\n"
         "  --gpus N               with --device cuda and --learners: spread the learners over\n"
         "                         N GPUs from the given one on (SMA all-reduced with NCCL)\n"
         "  --cuda-graphs on|off   with --device cuda: replay each step as a captured CUDA graph\n"
         "                         after two eager steps (default on)\n"
         "  --optimizer sgd|adam   optimizer (default sgd, momentum 0.9)\n"
         "  --lr X                 learning rate (default 0.01)\n"
         "  --lr-drop E1,E2,...    step decay: multiply the learning rate by --lr-drop-factor\n"
         "                         at the start of each epoch listed (from 2 to --epochs,\n"
         "                         rising; epochs count from the start of training, a --resume\n"
         "                         run's too);\n"
         "                         with --learners every replica restarts from the average model\n"
         "                         there (default: one rate throughout)\n"
         "  --lr-drop-factor F     with --lr-drop: the factor, in (0, 1] (default 0.1)\n"
         "  --momentum X           SGD momentum (default 0.9; not with --optimizer adam)\n"
         "  --weight-decay X       L2 regularisation, 0 or a normal 32-bit float: X w is added\n"
         "                         to each gradient, for sgd and adam alike (default 0)\n"
         "  --seed S               seed for initialisation and shuffling (default 1)\n"
         "  --data DIR             Fashion-MNIST directory (default $QUIVER_DATA_DIR or\n"
         "                         /usr/share/datasets/fashion-mnist)\n"
         "  --policy P             executor: auto | serial | intra | fixed (default auto: a\n"
         "                         performance model grants each op its threads and runs\n"
         "                         independent ops side by side)\n"
         "  --inter I --intra J    with --policy fixed (both needed): I ops side by side, J\n"
         "                         threads each\n"
         "  --profile-cache FILE   auto: op profiles cached here (default $QUIVER_PROFILE_CACHE,\n"
         "                         else quiver/profiles-<cpu>-<N>cores-<build type>.json in\n"
         "                         $XDG_CACHE_HOME or ~/.cache);\n"
         "                         'none' for no cache\n"
         "  --explain              after training, print each op's grant, predicted and\n"
         "                         measured time and bottom level (--policy auto on the\n"
         "                         CPU; not with --learners)\n"
         "  --trace FILE           write a Chrome trace of every op execution (Perfetto; with\n"
         "                         --learners a row per learner, the feeder and the SMA pass)\n"
         "  --learners N|auto      train N replicas at once, kept consistent by synchronous\n"
         "                         model averaging (SMA); auto tunes N while training\n"
         "                         (default: one model, no SMA)\n"
         "  --threads-per-learner T  threads of each learner (default: --threads split evenly;\n"
         "                         learners x T must fit in --threads)\n"
         "  --alpha X              SMA correction weight in [0, 1] (default 1/learners)\n"
         "  --mu-z X               SMA momentum of the average model's move, in [0, 1)\n"
         "                         (default 0.9; with auto, once there are 2+ learners)\n"
         "  --sync sma|ssgd        how learners are kept consistent: sma (default) or synchronous\n"
         "                         SGD (gradients averaged, one update: k x batch B = batch kB;\n"
         "                         CPU and --optimizer sgd only, no --alpha or --mu-z)\n"
         "  --staleness S          with --sync sma on the CPU: learners may be up to S rounds\n"
         "                         apart, each folding its correction into the average model as\n"
         "                         it finishes (default 0: synchronous rounds)\n"
         "  --sync-period N        with --sync sma and synchronous rounds: average every N\n"
         "                         rounds, the rounds between local steps (default 1: every\n"
         "                         round, as Crossbow does)\n"
         "  --lr-scaling none|linear|sqrt  with --learners: linear trains k learners at k x --lr\n"
         "                         (the linear scaling rule), sqrt at sqrt(k) x --lr; default\n"
         "                         none: every learner at --lr\n"
         "  --checkpoint FILE      with --learners: save the average model there after every\n"
         "                         epoch and at the end (atomic, checksummed)\n"
         "  --resume FILE          with --learners: start from a checkpoint (verified on load);\n"
         "                         an epoch it cut short goes on where it stopped\n"
         "  --quiet                no live progress line\n"
         "  --help, -h             this text\n"
         "A value follows its flag (--epochs 3) or an '=' (--epochs=3). Out-of-range values and\n"
         "combinations that cannot work (e.g. --threads-per-learner or --policy fixed with\n"
         "--learners auto, learners x threads above --threads) are refused, naming the flag.\n";
}

int learner_threads(const TrainCommand& command) {
  return command.threads_per_learner > 0 ? command.threads_per_learner
                                         : std::max(1, command.train.threads / std::max(1, command.learners));
}

TrainCommand parse_train_command(const std::vector<std::string>& args) {
  TrainCommand command;
  command.train.threads = available_cores();
  command.train.profile_cache = default_profile_cache();
  std::string inter_or_intra;
  bool cuda_graphs_given = false, momentum_given = false, sync_given = false, threads_given = false;
  bool inter_given = false, intra_given = false, drop_factor_given = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      command.help = true;
      continue;
    }
    if (arg == "--quiet") {
      command.quiet = true;
      continue;
    }
    if (arg == "--explain") {
      command.explain = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) throw Error(cat("unexpected argument '", arg, "' (see --help)"));
    // --flag value, or --flag=value
    const size_t equals = arg.find('=');
    const std::string flag = arg.substr(0, equals);
    if (!takes_value(flag)) {
      const bool alone = flag == "--help" || flag == "--quiet" || flag == "--explain";
      throw Error(alone ? cat(flag, ": takes no value") : cat("unknown option '", flag, "' (see --help)"));
    }
    if (equals == std::string::npos && i + 1 >= args.size()) throw Error(cat(flag, ": missing value"));
    const std::string value = equals == std::string::npos ? args[++i] : arg.substr(equals + 1);
    if (equals == std::string::npos && value.rfind("--", 0) == 0)  // `--data --quiet`: the value was forgotten
      throw Error(cat(flag, ": missing value (got the option '", value, "'; write ./", value,
                      " for a path that starts with --)"));
    if (flag == "--model") {
      bool known = false;
      for (const std::string& name : models::names()) known = known || name == value;
      if (!known) throw Error(cat("--model: unknown model '", value, "' (choose mlp, cnn or lstm)"));
      command.model = value;
    } else if (flag == "--epochs") {
      command.train.epochs = parse_int(flag, value, 1, 10000);
    } else if (flag == "--max-steps") {
      command.train.max_steps = parse_int(flag, value, 0, int64_t{1} << 40);
    } else if (flag == "--eval-every") {
      command.train.eval_every = parse_int(flag, value, 0, int64_t{1} << 40);
    } else if (flag == "--batch") {
      command.train.batch = parse_int(flag, value, 1, 60000);
    } else if (flag == "--threads") {
      command.train.threads = static_cast<int>(parse_int(flag, value, 1, 4096));
      threads_given = true;
    } else if (flag == "--optimizer") {
      if (value != "sgd" && value != "adam")
        throw Error(cat("--optimizer: expected sgd or adam, got '", value, "'"));
      command.train.optimizer = value;
    } else if (flag == "--lr") {
      command.train.learning_rate = parse_positive(flag, value);
    } else if (flag == "--lr-drop") {
      command.train.lr_drop_epochs.clear();
      size_t start = 0;
      while (true) {
        const size_t comma = value.find(',', start);
        const int64_t epoch = parse_int(flag, value.substr(start, comma - start), 2, 10000);
        if (!command.train.lr_drop_epochs.empty() && epoch <= command.train.lr_drop_epochs.back())
          throw Error(cat(flag, ": epochs must rise, got ", command.train.lr_drop_epochs.back(), " then ", epoch));
        command.train.lr_drop_epochs.push_back(epoch);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (flag == "--lr-drop-factor") {
      const double factor = parse_number(flag, value);
      if (!(factor > 0.0 && factor <= 1.0)) throw Error(cat(flag, ": must be in (0, 1], got '", value, "'"));
      command.train.lr_drop_factor = factor;
      drop_factor_given = true;
    } else if (flag == "--momentum") {
      double momentum = parse_number(flag, value);
      if (!(momentum >= 0.0 && momentum < 1.0))
        throw Error(cat("--momentum: must be in [0, 1), got '", value, "'"));
      if (const std::string problem = float_fraction_problem(momentum, false); !problem.empty())
        throw Error(cat("--momentum: ", problem));
      command.train.momentum = momentum;
      momentum_given = true;
    } else if (flag == "--weight-decay") {
      const double decay = parse_number(flag, value);
      if (!(decay >= 0.0) || !std::isfinite(decay))
        throw Error(cat(flag, ": must be a finite number >= 0, got '", value, "'"));
      command.train.weight_decay = decay == 0.0 ? 0.0 : parse_positive(flag, value);  // 0, or a normal float
    } else if (flag == "--seed") {
      command.train.seed = static_cast<uint64_t>(parse_int(flag, value, 0, INT64_MAX));
    } else if (flag == "--device") {
      try {
        command.train.device = Device::parse(value);
      } catch (const Error& error) {
        throw Error(cat("--device: ", error.what()));
      }
    } else if (flag == "--gpus") {
      command.gpus = static_cast<int>(parse_int(flag, value, 1, 64));
    } else if (flag == "--cuda-graphs") {
      if (value != "on" && value != "off") throw Error(cat("--cuda-graphs: expected on or off, got '", value, "'"));
      command.train.device_graphs = value == "on";
      cuda_graphs_given = true;
    } else if (flag == "--policy") {
      if (value != "auto" && value != "serial" && value != "intra" && value != "fixed")
        throw Error(cat("--policy: expected auto, serial, intra or fixed, got '", value, "'"));
      command.train.policy = value;
    } else if (flag == "--inter") {
      command.train.inter = static_cast<int>(parse_int(flag, value, 1, 4096));
      inter_or_intra = flag;
      inter_given = true;
    } else if (flag == "--intra") {
      command.train.intra = static_cast<int>(parse_int(flag, value, 1, 4096));
      inter_or_intra = flag;
      intra_given = true;
    } else if (flag == "--learners") {
      if (value == "auto") {
        command.learners_auto = true;
        command.learners = 1;
      } else {
        command.learners = static_cast<int>(parse_int(flag, value, 1, 256));
        command.learners_auto = false;
      }
    } else if (flag == "--threads-per-learner") {
      command.threads_per_learner = static_cast<int>(parse_int(flag, value, 1, 4096));
    } else if (flag == "--alpha") {
      double alpha = parse_number(flag, value);
      if (!(alpha >= 0.0 && alpha <= 1.0)) throw Error(cat("--alpha: must be in [0, 1], got '", value, "'"));
      if (const std::string problem = float_fraction_problem(alpha, true); !problem.empty())
        throw Error(cat("--alpha: ", problem));
      command.alpha = alpha;
    } else if (flag == "--mu-z") {
      double mu_z = parse_number(flag, value);
      if (!(mu_z >= 0.0 && mu_z < 1.0)) throw Error(cat("--mu-z: must be in [0, 1), got '", value, "'"));
      if (const std::string problem = float_fraction_problem(mu_z, false); !problem.empty())
        throw Error(cat("--mu-z: ", problem));
      command.mu_z = mu_z;
    } else if (flag == "--sync") {
      if (value != "sma" && value != "ssgd") throw Error(cat("--sync: expected sma or ssgd, got '", value, "'"));
      command.sync = value;
      sync_given = true;
    } else if (flag == "--staleness") {
      command.staleness = static_cast<int>(parse_int(flag, value, 0, kMaxStaleness));
    } else if (flag == "--sync-period") {
      command.sync_period = static_cast<int>(parse_int(flag, value, 1, kMaxSyncPeriod));
    } else if (flag == "--lr-scaling") {
      try {
        command.lr_scaling = parse_lr_scaling(value);
      } catch (const Error& error) {
        throw Error(cat("--lr-scaling: ", error.what()));
      }
    } else if (flag == "--checkpoint" || flag == "--resume") {
      if (value.empty()) throw Error(cat(flag, ": empty file name"));
      if (flag == "--checkpoint") check_writable(value, flag);  // a typo must not cost the training run
      if (flag == "--resume") check_readable(value, flag);      // nor load the data first
      (flag == "--checkpoint" ? command.checkpoint : command.resume) = value;
    } else if (flag == "--profile-cache") {
      if (value.empty()) throw Error("--profile-cache: empty file name (use 'none' for no cache)");
      // The default cache's directory is made on first use; a named one's must exist (a typo in it
      // would otherwise make directories).
      const std::filesystem::path directory = std::filesystem::path(value).parent_path();
      std::error_code error;
      if (value != "none" && !directory.empty() && !std::filesystem::is_directory(directory, error))
        throw Error(cat("--profile-cache: directory '", directory.string(), "' ",
                        std::filesystem::exists(directory, error) ? "is not a directory" : "does not exist",
                        " ('none' for no cache)"));
      // The cache is replaced at the end of the run: a directory, a read-only file or one that
      // cannot be written there is refused now, as --trace's and --checkpoint's are, not warned
      // about after training (a read-only cache was replaced).
      if (value != "none") check_writable(value, flag);
      command.train.profile_cache = value == "none" ? "" : value;
    } else if (flag == "--trace") {
      check_writable(value, flag);
      command.train.trace_path = value;
    } else if (flag == "--data") {
      if (value.empty()) throw Error("--data: empty directory name");
      command.data_dir = value;
    } else {
      throw Error(cat("unknown option '", flag, "' (see --help)"));
    }
  }
  const bool multi = command.learners > 0;
  if (drop_factor_given && command.train.lr_drop_epochs.empty())
    throw Error("--lr-drop-factor: only with --lr-drop (the epochs to drop the rate at)");
  if (!command.train.lr_drop_epochs.empty()) {
    // Epochs count from the start of training, and --epochs is the last (a --resume run's too):
    // a drop after it would never happen.
    const int64_t last_drop = command.train.lr_drop_epochs.back();
    if (last_drop > command.train.epochs)
      throw Error(cat("--lr-drop: epoch ", last_drop, " is after the last epoch of this run (--epochs ",
                      command.train.epochs, "; epochs count from the start of training)"));
    // The rate after the last drop must stay a normal 32-bit float, as --lr must.
    const double lowest = command.train.learning_rate *
                          std::pow(command.train.lr_drop_factor, static_cast<double>(command.train.lr_drop_epochs.size()));
    if (lowest < std::numeric_limits<float>::min())
      throw Error(cat("--lr-drop-factor: ", command.train.lr_drop_epochs.size(), " drop(s) of ",
                      command.train.lr_drop_factor, " take the learning rate to ", lowest,
                      ", below the smallest normal 32-bit float (", exact(std::numeric_limits<float>::min()), ")"));
  }
  if (command.gpus > 1 && command.train.device.is_cpu()) throw Error("--gpus: only with --device cuda");
  if (cuda_graphs_given && command.train.device.is_cpu()) throw Error("--cuda-graphs: only with --device cuda");
  if (command.gpus > 1 && !multi) throw Error("--gpus: only with --learners (one learner uses one GPU)");
  if (command.gpus > 1 && !command.learners_auto && command.learners < command.gpus)
    throw Error(cat("--gpus: ", command.learners, " learner(s) cannot cover ", command.gpus,
                    " GPUs (at least one learner a GPU)"));
  if (!multi && command.threads_per_learner > 0) throw Error("--threads-per-learner: only with --learners");
  if (!multi && command.alpha >= 0.0) throw Error("--alpha: only with --learners");
  if (!multi && sync_given) throw Error("--sync: only with --learners (one model has nothing to synchronise)");
  if (command.sync == "ssgd" && command.alpha >= 0.0) throw Error("--alpha: an SMA option, not used with --sync ssgd");
  if (!multi && command.mu_z >= 0.0) throw Error("--mu-z: only with --learners");
  if (command.sync == "ssgd" && command.mu_z >= 0.0) throw Error("--mu-z: an SMA option, not used with --sync ssgd");
  // One learner with the default alpha trains as single-stream does, with no SMA (LearnerGroup::alone()).
  if (command.learners == 1 && !command.learners_auto && command.alpha < 0.0 && command.mu_z >= 0.0)
    throw Error("--mu-z: one learner with the default --alpha has no average model to move (give --alpha, or 2+ learners)");
  if (command.sync == "ssgd" && command.train.optimizer != "sgd") throw Error("--sync ssgd: needs --optimizer sgd");
  if (command.sync == "ssgd" && !command.train.device.is_cpu())
    throw Error("--sync ssgd: CPU learners only for now (CUDA learners average with SMA)");
  if (momentum_given && command.train.optimizer != "sgd")
    throw Error(cat("--momentum: an SGD option; --optimizer ", command.train.optimizer, " keeps its own moments"));
  if (!multi && command.staleness > 0) throw Error("--staleness: only with --learners");
  if (!multi && command.lr_scaling != LrScaling::None) throw Error("--lr-scaling: only with --learners");
  if (command.staleness > 0 && command.learners == 1 && !command.learners_auto)
    throw Error("--staleness: one learner has nobody to be rounds apart from (2+ learners, or auto)");
  if (command.staleness > 0 && command.sync == "ssgd")
    throw Error("--staleness: synchronous SGD averages every round's gradients; use --sync sma");
  if (command.staleness > 0 && !command.train.device.is_cpu())
    throw Error("--staleness: CPU learners only for now (CUDA learners synchronise every round)");
  if (!multi && command.sync_period > 1) throw Error("--sync-period: only with --learners");
  if (command.sync_period > 1 && command.learners == 1 && !command.learners_auto && command.alpha < 0.0)
    throw Error("--sync-period: one learner with the default --alpha has no average to sync (2+ learners, or auto)");
  if (command.sync_period > 1 && command.sync == "ssgd")
    throw Error("--sync-period: synchronous SGD averages every round's gradients; use --sync sma");
  if (command.sync_period > 1 && command.staleness > 0)
    throw Error("--sync-period: a staleness bound folds every round's corrections in; use one or the other");
  if (!multi && !command.checkpoint.empty())
    throw Error("--checkpoint: only with --learners (for one model, --learners 1 trains exactly as without it)");
  if (!multi && !command.resume.empty())
    throw Error("--resume: only with --learners (for one model, --learners 1 trains exactly as without it)");
  if (multi && command.explain) throw Error("--explain: single-model training only (not with --learners)");
  if (command.explain && !command.train.device.is_cpu())
    throw Error("--explain: reports the CPU executor's grants; on --device cuda no executor runs");
  if (command.explain && command.train.policy != "auto")
    throw Error(cat("--explain: reports the auto policy's grants and predictions; --policy ", command.train.policy,
                    " has none (--trace FILE records every op's time)"));
  if (command.threads_per_learner > 0 && !command.train.device.is_cpu())
    throw Error("--threads-per-learner: CPU learners only (on --device cuda every learner is a CUDA stream)");
  if (command.learners_auto && command.threads_per_learner > 0)
    throw Error("--threads-per-learner: not with --learners auto (the tuner splits the cores)");
  // --threads is the budget: learners of an explicit size must fit in it (raise --threads to run
  // more threads than cores on purpose; that is then warned about below).
  if (multi && !command.learners_auto && command.threads_per_learner > 0 &&
      command.learners * command.threads_per_learner > command.train.threads)
    throw Error(cat("--learners ", command.learners, " x --threads-per-learner ", command.threads_per_learner,
                    " = ", command.learners * command.threads_per_learner, " threads, more than --threads ",
                    command.train.threads));
  // Learners of the default size take a thread each at least: with --threads given, they too
  // must fit in it (more learners than cores, by default, are warned about below).
  if (multi && !command.learners_auto && threads_given && command.threads_per_learner == 0 &&
      command.train.device.is_cpu() && command.learners > command.train.threads)
    throw Error(cat("--learners ", command.learners, ": a thread each at least, more than --threads ",
                    command.train.threads));
  // One learner too: it trains as plain momentum SGD, but z, what is reported, stays put.
  if (multi && command.alpha == 0.0)
    command.warnings.push_back(
        "--alpha 0: the learners never pull toward the average model, and it never moves from its "
        "initial value (what is evaluated and checkpointed)");
  if (command.train.device.is_cpu()) {
    const int running = multi && !command.learners_auto ? command.learners * learner_threads(command)
                                                        : command.train.threads;
    if (running > available_cores())
      command.warnings.push_back(cat(running, " threads on ", available_cores(), " cores",
                                     multi && !command.learners_auto ? cat(" (", command.learners, " learners x ",
                                                                            learner_threads(command), ")")
                                                                      : std::string(),
                                     ": they will take turns on the cores, and throughput will suffer"));
  }
  if (!inter_or_intra.empty() && command.train.policy != "fixed")
    throw Error(cat(inter_or_intra, ": only with --policy fixed (the ", command.train.policy,
                    " policy chooses its own threads)"));
  // fixed runs inter x intra threads whatever the budget: they must fit in the threads granted
  // (all of --threads, or each learner's share), or the executor would oversubscribe the cores.
  if (command.train.policy == "fixed" && command.train.device.is_cpu()) {
    if (command.learners_auto)
      throw Error("--policy fixed: not with --learners auto (the tuner splits the cores among learners)");
    if (!inter_given || !intra_given)
      throw Error("--policy fixed: needs --inter I (ops side by side) and --intra J (threads each)");
    const int granted = multi ? learner_threads(command) : command.train.threads;
    if (command.train.inter * command.train.intra > granted)
      throw Error(cat("--inter ", command.train.inter, " x --intra ", command.train.intra, " = ",
                      command.train.inter * command.train.intra, " threads, more than the ", granted, " granted (",
                      multi ? "each learner's share of --threads" : "--threads", ")"));
  }
  // Two outputs, or an output and the checkpoint being resumed, on one file would overwrite each
  // other (or the checkpoint) without a word. --checkpoint may be --resume: training goes on there.
  const std::vector<std::pair<std::string, std::string>> files = {
      {"--trace", command.train.trace_path}, {"--checkpoint", command.checkpoint},
      {"--profile-cache", command.train.profile_cache}, {"--resume", command.resume}};
  for (size_t a = 0; a < files.size(); ++a)
    for (size_t b = a + 1; b < files.size(); ++b) {
      const bool allowed = files[a].first == "--checkpoint" && files[b].first == "--resume";
      if (!allowed && !files[a].second.empty() && !files[b].second.empty() && same_file(files[a].second, files[b].second))
        throw Error(cat(files[a].first, " and ", files[b].first, ": both name '", files[a].second,
                        "'; one would overwrite the other"));
    }
  // Nor may an output replace one of the data files training reads (--resume only reads).
  const std::string data_dir = command.data_dir.empty() ? default_fashion_mnist_dir() : command.data_dir;
  for (const auto& [flag, path] : files) {
    if (flag == "--resume" || path.empty()) continue;
    for (const char* split : {"train", "t10k"})
      for (const char* kind : {"-images-idx3-ubyte", "-labels-idx1-ubyte"})
        for (const char* suffix : {"", ".gz"}) {
          const std::string data_file = (std::filesystem::path(data_dir) / cat(split, kind, suffix)).string();
          if (same_file(path, data_file))
            throw Error(cat(flag, ": '", path, "' is the data file ", data_file, ", which it would overwrite"));
        }
  }
  return command;
}

}  // namespace quiver
