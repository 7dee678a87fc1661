// quiver-torch-peer: the peer-framework baseline for Quiver's training benchmarks.
//
// Trains one of the bundled models (DESIGN.md section 4: MLP, CNN, LSTM) with libtorch's C++
// frontend on a fixed pool of synthetic batches, SGD lr 0.01 momentum 0.9, and prints
// samples/s in the same line format as the Quiver bench, so a script can set the two side by
// side (same model, batch, thread count). It is not part of Quiver and links nothing of it; it
// is built only when libtorch is installed (bench/torch_peer.cmake).
//
// Thread control: torch::set_num_threads sets the intra-op (OpenMP) pool, inter-op is pinned to
// 1, and OpenBLAS, which libtorch does not size itself, is set to the same count so that
// `--threads 1` really is one core. Debian's libtorch pairs libgomp with the pthread build of
// OpenBLAS; with libgomp's default spin-waiting, its idle workers and OpenBLAS's fight for the
// cores and `--threads 2` on two cores ran 3-10x slower than `--threads 1`, erratically. So the
// program re-executes itself with OMP_WAIT_POLICY=PASSIVE (libgomp reads it only at load) unless
// the caller set OMP_WAIT_POLICY; set it to ACTIVE to measure the untuned behaviour.

#include <torch/torch.h>

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr int kPoolBatches = 64;         // distinct batches cycled through
constexpr uint64_t kDataSeed = 20240531;  // fixed: every run sees the same data
constexpr uint64_t kModelSeed = 7;        // fixed: every run starts from the same weights
constexpr int64_t kImageSide = 28;
constexpr int64_t kClasses = 10;

struct Options {
  std::string model;  // mlp | cnn | lstm
  int batch = 0;
  int threads = 0;
  int warmup = 20;
  int steps = 100;
  int runs = 5;
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr const char* kUsage =
    "usage: quiver-torch-peer --model mlp|cnn|lstm --batch B --threads T\n"
    "                         [--warmup W (20)] [--steps S (100)] [--runs R (5)]\n";

int parse_int(std::string_view flag, std::string_view text, int min_value) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || value < min_value) {
    throw UsageError("bad value for " + std::string(flag) + ": '" + std::string(text) +
                     "' (want an integer >= " + std::to_string(min_value) + ")");
  }
  return value;
}

Options parse_args(int argc, char** argv) {
  Options options;
  bool have_batch = false;
  bool have_threads = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (!arg.starts_with("--")) throw UsageError("unexpected argument '" + std::string(arg) + "'");
    // Accept both "--flag value" and "--flag=value".
    std::string_view flag = arg;
    std::optional<std::string_view> value;
    if (const auto eq = arg.find('='); eq != std::string_view::npos) {
      flag = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    const bool known = flag == "--model" || flag == "--batch" || flag == "--threads" ||
                       flag == "--warmup" || flag == "--steps" || flag == "--runs";
    if (!known) throw UsageError("unknown flag " + std::string(flag));
    if (!value) {
      if (i + 1 >= argc) throw UsageError("missing value for " + std::string(flag));
      value = argv[++i];
    }
    if (flag == "--model") {
      if (*value != "mlp" && *value != "cnn" && *value != "lstm") {
        throw UsageError("bad value for --model: '" + std::string(*value) +
                         "' (want mlp, cnn or lstm)");
      }
      options.model = *value;
    } else if (flag == "--batch") {
      options.batch = parse_int(flag, *value, 1);
      have_batch = true;
    } else if (flag == "--threads") {
      options.threads = parse_int(flag, *value, 1);
      have_threads = true;
    } else if (flag == "--warmup") {
      options.warmup = parse_int(flag, *value, 0);
    } else if (flag == "--steps") {
      options.steps = parse_int(flag, *value, 1);
    } else {
      options.runs = parse_int(flag, *value, 1);
    }
  }
  if (options.model.empty()) throw UsageError("missing required flag --model");
  if (!have_batch) throw UsageError("missing required flag --batch");
  if (!have_threads) throw UsageError("missing required flag --threads");
  return options;
}

// ---- models (DESIGN.md section 4) --------------------------------------------------------

// Every model takes images (B, 1, 28, 28) and returns logits (B, 10).
struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(784, 512))),
        fc2(register_module("fc2", torch::nn::Linear(512, 256))),
        fc3(register_module("fc3", torch::nn::Linear(256, 10))) {}

  torch::Tensor forward(const torch::Tensor& images) {
    auto x = images.flatten(1);  // (B, 784)
    x = torch::relu(fc1->forward(x));
    x = torch::relu(fc2->forward(x));
    return fc3->forward(x);
  }

  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

struct CnnImpl : torch::nn::Module {
  CnnImpl()
      : conv1(register_module(
            "conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 5).padding(2)))),
        conv2(register_module(
            "conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5).padding(2)))),
        fc1(register_module("fc1", torch::nn::Linear(1568, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}

  torch::Tensor forward(const torch::Tensor& images) {
    auto x = torch::max_pool2d(torch::relu(conv1->forward(images)), 2);  // (B, 16, 14, 14)
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2);            // (B, 32, 7, 7)
    x = torch::relu(fc1->forward(x.flatten(1)));                         // (B, 128)
    return fc2->forward(x);
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Cnn);

struct LstmImpl : torch::nn::Module {
  LstmImpl()
      : lstm(register_module(
            "lstm", torch::nn::LSTM(torch::nn::LSTMOptions(28, 128).batch_first(true)))),
        fc(register_module("fc", torch::nn::Linear(128, 10))) {}

  torch::Tensor forward(const torch::Tensor& images) {
    auto rows = images.view({images.size(0), kImageSide, kImageSide});  // (B, T=28, F=28)
    auto [output, state] = lstm->forward(rows);
    auto last_hidden = std::get<0>(state).select(0, 0);  // h_n (layers=1, B, 128) -> (B, 128)
    return fc->forward(last_hidden);
  }

  torch::nn::LSTM lstm;
  torch::nn::Linear fc;
};
TORCH_MODULE(Lstm);

// Type-erased so the training loop is written once.
torch::nn::AnyModule make_model(const std::string& name) {
  torch::manual_seed(kModelSeed);
  if (name == "mlp") return torch::nn::AnyModule(Mlp());
  if (name == "cnn") return torch::nn::AnyModule(Cnn());
  return torch::nn::AnyModule(Lstm());
}

// ---- data ----------------------------------------------------------------------------------

struct Batch {
  torch::Tensor images;  // (B, 1, 28, 28) float32, uniform [0, 1)
  torch::Tensor labels;  // (B) int64, uniform 0..9
};

std::vector<Batch> make_pool(int batch) {
  torch::manual_seed(kDataSeed);
  std::vector<Batch> pool;
  pool.reserve(kPoolBatches);
  for (int i = 0; i < kPoolBatches; ++i) {
    pool.push_back({torch::rand({batch, 1, kImageSide, kImageSide}),
                    torch::randint(0, kClasses, {batch}, torch::kLong)});
  }
  return pool;
}

// ---- threads -------------------------------------------------------------------------------

// libtorch sizes its OpenMP pool but not OpenBLAS's own pthread pool, which defaults to every
// core. Found at run time so the bench neither links OpenBLAS directly nor needs it.
const char* limit_blas_threads(int threads) {
  using SetThreads = void (*)(int);
  if (auto* set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(threads);
    return "openblas";
  }
  return "none found (BLAS threads left as they are)";
}

// libgomp reads OMP_WAIT_POLICY once, when it is loaded, so the only way to set it from here is
// to start again with it in the environment. Returns only if no re-exec happened.
void reexec_with_passive_omp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  if (setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0) return;
  execv("/proc/self/exe", argv);
  // Still here: exec failed; go on with the default policy, and say so in the header line.
  unsetenv("OMP_WAIT_POLICY");
}

// ---- bench ---------------------------------------------------------------------------------

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

// One run: a fresh model and optimizer, `warmup` untimed steps, then `steps` timed ones.
// Returns samples/s over the timed steps.
double timed_run(const Options& options, const std::vector<Batch>& pool) {
  torch::nn::AnyModule model = make_model(options.model);
  model.ptr()->train();
  torch::optim::SGD optimizer(model.ptr()->parameters(),
                              torch::optim::SGDOptions(0.01).momentum(0.9));
  size_t next = 0;
  auto step = [&]() -> torch::Tensor {
    const Batch& batch = pool[next];
    next = (next + 1) % pool.size();
    optimizer.zero_grad();
    auto logits = model.forward(batch.images);
    auto loss = torch::nn::functional::cross_entropy(logits, batch.labels);
    loss.backward();
    optimizer.step();
    return loss;
  };

  for (int i = 0; i < options.warmup; ++i) step();

  const auto start = std::chrono::steady_clock::now();
  torch::Tensor loss;
  for (int i = 0; i < options.steps; ++i) loss = step();
  // CPU ops are synchronous already; reading the loss mirrors the Quiver bench's sync point.
  const float last_loss = loss.item<float>();
  const auto stop = std::chrono::steady_clock::now();

  if (!std::isfinite(last_loss)) {
    throw std::runtime_error("loss is not finite after the timed steps: " +
                             std::to_string(last_loss));
  }
  const double seconds = std::chrono::duration<double>(stop - start).count();
  return static_cast<double>(options.batch) * options.steps / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    options = parse_args(argc, argv);
  } catch (const UsageError& error) {
    std::fprintf(stderr, "quiver-torch-peer: %s\n%s", error.what(), kUsage);
    return 2;
  }

  reexec_with_passive_omp_wait(argv);

  try {
    // Inter-op threads can be set only once and before any parallel work, so first.
    torch::set_num_interop_threads(1);
    torch::set_num_threads(options.threads);
    const char* blas = limit_blas_threads(options.threads);
    const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
    std::fprintf(stderr,
                 "# libtorch %s, intra-op threads %d, inter-op threads %d, BLAS threads: %s, "
                 "OMP_WAIT_POLICY=%s\n",
                 TORCH_VERSION, torch::get_num_threads(), torch::get_num_interop_threads(), blas,
                 wait_policy != nullptr ? wait_policy : "(default)");

    const std::vector<Batch> pool = make_pool(options.batch);
    std::vector<double> samples_per_s;
    for (int run = 0; run < options.runs; ++run) {
      samples_per_s.push_back(timed_run(options, pool));
      std::printf("run model=%s batch=%d threads=%d samples_per_s=%.1f\n", options.model.c_str(),
                  options.batch, options.threads, samples_per_s.back());
      std::fflush(stdout);
    }
    std::printf("result model=%s batch=%d threads=%d median_samples_per_s=%.1f runs=%d\n",
                options.model.c_str(), options.batch, options.threads, median(samples_per_s),
                options.runs);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "quiver-torch-peer: %s\n", error.what());
    return 1;
  }
  return 0;
}
