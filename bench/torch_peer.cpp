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
//
// Accuracy mode (`--data DIR`): instead of timing synthetic batches, trains the same model with
// the same optimizer on the real Fashion-MNIST for --epochs epochs, shuffled each epoch by
// torch's generator seeded with --seed (which also seeds the init), and prints the test-set
// accuracy. It is the reference for Quiver's own accuracy runs: same model, init distribution,
// optimizer and data order rules, so a clear gap points at Quiver rather than at the recipe.

#include <torch/torch.h>

#include <dlfcn.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
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
constexpr int64_t kEvalBatch = 1000;  // test-set batch; no gradients, so only memory bounds it

struct Options {
  std::string model;  // mlp | cnn | lstm
  int batch = 0;
  int threads = 0;
  int warmup = 20;
  int steps = 100;
  int runs = 5;
  std::string data;  // non-empty: accuracy mode on the Fashion-MNIST files in this directory
  int epochs = 1;
  int64_t seed = 0;  // 0 to 2^63 - 1, as quiver-train's --seed (scripts/accuracy_seeds.py passes both)
  std::string init = "he_uniform";  // he_uniform | torch_default, as Quiver's LayerInit
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr const char* kUsage =
    "usage: quiver-torch-peer --model mlp|cnn|lstm --batch B --threads T\n"
    "                         [--warmup W (20)] [--steps S (100)] [--runs R (5)]\n"
    "       quiver-torch-peer --model mlp|cnn|lstm --batch B --threads T\n"
    "                         --data DIR [--epochs E (1)] [--seed S (0)]\n"
    "  --init he_uniform|torch_default (he_uniform): how Linear and Conv2d layers draw their\n"
    "              initial parameters, as Quiver's LayerInit: He uniform weights and zero\n"
    "              biases (Quiver's default), or libtorch's own defaults\n"
    "  --data DIR: accuracy mode; DIR holds Fashion-MNIST's {train,t10k}-{images-idx3,\n"
    "              labels-idx1}-ubyte.gz\n";

template <class Whole = int>
Whole parse_int(std::string_view flag, std::string_view text, Whole min_value) {
  Whole value = 0;
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
  std::string timing_flag;    // a flag that means nothing in accuracy mode, if one was given
  std::string accuracy_flag;  // the same the other way round
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
                       flag == "--warmup" || flag == "--steps" || flag == "--runs" ||
                       flag == "--data" || flag == "--epochs" || flag == "--seed" ||
                       flag == "--init";
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
      timing_flag = flag;
    } else if (flag == "--steps") {
      options.steps = parse_int(flag, *value, 1);
      timing_flag = flag;
    } else if (flag == "--runs") {
      options.runs = parse_int(flag, *value, 1);
      timing_flag = flag;
    } else if (flag == "--data") {
      if (value->empty()) throw UsageError("bad value for --data: empty directory name");
      options.data = *value;
    } else if (flag == "--init") {
      if (*value != "he_uniform" && *value != "torch_default") {
        throw UsageError("bad value for --init: '" + std::string(*value) +
                         "' (want he_uniform or torch_default)");
      }
      options.init = *value;
    } else if (flag == "--epochs") {
      options.epochs = parse_int(flag, *value, 1);
      accuracy_flag = flag;
    } else {
      options.seed = parse_int<int64_t>(flag, *value, 0);
      accuracy_flag = flag;
    }
  }
  // Silently ignoring these would make a run look like it measured something it did not.
  if (options.data.empty() && !accuracy_flag.empty()) {
    throw UsageError(accuracy_flag + " needs --data (it applies to accuracy mode only)");
  }
  if (!options.data.empty() && !timing_flag.empty()) {
    throw UsageError(timing_flag + " applies to throughput mode only, not with --data");
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

// Quiver's default layer init (core/nn.h, LayerInit::he_uniform): Linear and Conv2d weights
// U(-sqrt(6/fan_in), sqrt(6/fan_in)) (kaiming_uniform_ with ReLU's gain), biases 0. The LSTM
// keeps libtorch's own init, as Quiver's LSTM does.
void he_uniform_layers(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (const auto& module : model.modules(/*include_self=*/false)) {
    torch::Tensor weight, bias;
    if (auto* linear = module->as<torch::nn::Linear>()) {
      weight = linear->weight;
      bias = linear->bias;
    } else if (auto* conv = module->as<torch::nn::Conv2d>()) {
      weight = conv->weight;
      bias = conv->bias;
    } else {
      continue;
    }
    torch::nn::init::kaiming_uniform_(weight, /*a=*/0.0, torch::kFanIn, torch::kReLU);
    if (bias.defined()) torch::nn::init::zeros_(bias);
  }
}

// Type-erased so the training loop is written once. `seed` fixes the initial weights.
torch::nn::AnyModule make_model(const std::string& name, uint64_t seed, const std::string& init) {
  torch::manual_seed(seed);
  torch::nn::AnyModule model = name == "mlp"   ? torch::nn::AnyModule(Mlp())
                               : name == "cnn" ? torch::nn::AnyModule(Cnn())
                                               : torch::nn::AnyModule(Lstm());
  if (init == "he_uniform") he_uniform_layers(*model.ptr());
  return model;
}

// ---- data ----------------------------------------------------------------------------------

struct Batch {
  torch::Tensor images;  // (B, 1, 28, 28) float32, uniform [0, 1)
  torch::Tensor labels;  // (B) int64, uniform 0..9
};

// kPoolBatches batches, fewer where they would take more than 64 MiB (two at least), as
// quiver-bench-throughput's pool does.
std::vector<Batch> make_pool(int batch) {
  torch::manual_seed(kDataSeed);
  const int64_t fit = (int64_t{64} << 20) / (int64_t{batch} * kImageSide * kImageSide * int64_t{sizeof(float)});
  const int count = static_cast<int>(std::clamp<int64_t>(fit, 2, kPoolBatches));
  std::vector<Batch> pool;
  pool.reserve(count);
  for (int i = 0; i < count; ++i) {
    pool.push_back({torch::rand({batch, 1, kImageSide, kImageSide}),
                    torch::randint(0, kClasses, {batch}, torch::kLong)});
  }
  return pool;
}

// Fashion-MNIST comes as gzip'd IDX files: a big-endian header (magic 0x000008nn, nn the number
// of dimensions; then one uint32 size per dimension) followed by the uint8 values.
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // 1-D: (N)
constexpr uint32_t kIdxImagesMagic = 0x00000803;  // 3-D: (N, rows, cols)

// Returns the file's values as a uint8 tensor of the shape its header gives.
torch::Tensor read_idx(const std::string& path, uint32_t magic) {
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), &gzclose);
  if (!file) throw std::runtime_error("--data: cannot open " + path);
  auto read_exact = [&](void* into, size_t bytes) {
    auto* at = static_cast<unsigned char*>(into);
    while (bytes > 0) {  // gzread takes an unsigned int count, so go in bounded pieces
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(bytes, 1u << 30));
      const int got = gzread(file.get(), at, chunk);
      if (got <= 0) throw std::runtime_error("--data: " + path + " is truncated or not gzip");
      at += got;
      bytes -= static_cast<size_t>(got);
    }
  };
  auto read_u32 = [&]() {
    unsigned char b[4];
    read_exact(b, 4);
    return uint32_t{b[0]} << 24 | uint32_t{b[1]} << 16 | uint32_t{b[2]} << 8 | uint32_t{b[3]};
  };
  // A mismatch also catches swapped image and label files.
  if (const uint32_t found = read_u32(); found != magic) {
    throw std::runtime_error("--data: " + path + " has IDX magic " + std::to_string(found) +
                             ", want " + std::to_string(magic));
  }
  std::vector<int64_t> sizes(magic & 0xff);
  for (auto& size : sizes) size = read_u32();
  torch::Tensor values = torch::empty(sizes, torch::kUInt8);
  read_exact(values.data_ptr<uint8_t>(), static_cast<size_t>(values.numel()));
  return values;
}

struct Dataset {
  torch::Tensor images;  // (N, 1, 28, 28) float32, pixels / 255 in [0, 1]
  torch::Tensor labels;  // (N) int64, 0..9
};

// `split` is "train" or "t10k", the files' own prefixes.
Dataset load_split(const std::string& dir, const std::string& split) {
  const torch::Tensor images = read_idx(dir + "/" + split + "-images-idx3-ubyte.gz",
                                        kIdxImagesMagic);
  const torch::Tensor labels = read_idx(dir + "/" + split + "-labels-idx1-ubyte.gz",
                                        kIdxLabelsMagic);
  if (images.size(1) != kImageSide || images.size(2) != kImageSide ||
      images.size(0) != labels.size(0)) {
    throw std::runtime_error("--data: " + split + " images are " +
                             std::to_string(images.size(0)) + "x" +
                             std::to_string(images.size(1)) + "x" +
                             std::to_string(images.size(2)) + " for " +
                             std::to_string(labels.size(0)) + " labels; want Nx28x28 for N");
  }
  if (labels.max().item<int64_t>() >= kClasses) {
    throw std::runtime_error("--data: " + split + " has a label outside 0..9");
  }
  return {images.unsqueeze(1).to(torch::kFloat32).div_(255.0), labels.to(torch::kLong)};
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
  torch::nn::AnyModule model = make_model(options.model, kModelSeed, options.init);
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

// Trains a fresh model for `epochs` epochs on the training set and returns its accuracy on the
// test set. Each epoch visits a fresh random permutation in whole batches only (the last partial
// batch is dropped, as DataLoader(drop_last=True) would), so every step has the same batch size.
double accuracy_run(const Options& options) {
  const Dataset train = load_split(options.data, "train");
  const Dataset test = load_split(options.data, "t10k");
  const int64_t steps = train.images.size(0) / options.batch;
  if (steps == 0) {
    throw std::runtime_error("--batch " + std::to_string(options.batch) +
                             " is larger than the training set (" +
                             std::to_string(train.images.size(0)) + " images)");
  }

  // Seeds the default generator once: the init draws from it first, then the shuffles, so one
  // seed fixes the whole run.
  torch::nn::AnyModule model = make_model(options.model, static_cast<uint64_t>(options.seed), options.init);
  torch::optim::SGD optimizer(model.ptr()->parameters(),
                              torch::optim::SGDOptions(0.01).momentum(0.9));
  for (int epoch = 0; epoch < options.epochs; ++epoch) {
    model.ptr()->train();
    const torch::Tensor order = torch::randperm(train.images.size(0), torch::kLong);
    torch::Tensor loss;
    for (int64_t step = 0; step < steps; ++step) {
      const torch::Tensor picked = order.slice(0, step * options.batch, (step + 1) * options.batch);
      optimizer.zero_grad();
      auto logits = model.forward(train.images.index_select(0, picked));
      loss = torch::nn::functional::cross_entropy(logits, train.labels.index_select(0, picked));
      loss.backward();
      optimizer.step();
    }
    if (const float last_loss = loss.item<float>(); !std::isfinite(last_loss)) {
      throw std::runtime_error("loss is not finite after epoch " + std::to_string(epoch + 1) +
                               ": " + std::to_string(last_loss));
    }
  }

  model.ptr()->eval();
  torch::NoGradGuard no_grad;
  int64_t correct = 0;
  const int64_t total = test.images.size(0);
  for (int64_t start = 0; start < total; start += kEvalBatch) {
    const int64_t stop = std::min(start + kEvalBatch, total);
    auto logits = model.forward(test.images.slice(0, start, stop));
    correct += logits.argmax(1).eq(test.labels.slice(0, start, stop)).sum().item<int64_t>();
  }
  return static_cast<double>(correct) / static_cast<double>(total);
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

    if (!options.data.empty()) {
      const double accuracy = accuracy_run(options);
      std::printf("accuracy model=%s seed=%lld test_accuracy=%.4f\n", options.model.c_str(),
                  static_cast<long long>(options.seed), accuracy);
      return 0;
    }

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
