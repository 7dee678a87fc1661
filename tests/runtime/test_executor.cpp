// The concurrent executor against the serial reference: the bundled models under every policy,
// random DAGs, honoured thread grants, a throwing kernel, and many consecutive steps.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "models/models.h"
#include "ops/kernel_util.h"
#include "runtime/executor.h"
#include "runtime/trainer.h"

namespace quiver {
namespace {

struct PolicyCase {
  std::string policy;
  int threads, inter, intra;
};

void PrintTo(const PolicyCase& c, std::ostream* out) { *out << c.policy << c.inter << "x" << c.intra; }

class EveryPolicy : public ::testing::TestWithParam<PolicyCase> {};

// Same data, 20 steps: the loss and every parameter match the serial reference (Plan::run with one
// thread). Tolerance 1e-4 relative + 1e-5: kernels given more threads split GEMMs and conv
// weight-gradient sums differently, which changes float rounding but nothing else.
TEST_P(EveryPolicy, MatchesSerialAfter20Steps) {
  const PolicyCase& c = GetParam();
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  for (const std::string& name : models::names()) {
    std::vector<float> images(16 * 784 * 4);
    for (float& v : images) v = pixel(rng);
    std::vector<int32_t> labels(16 * 4);
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>(rng() % 10);
    std::vector<double> losses[2];
    std::vector<float> params[2];
    for (int variant = 0; variant < 2; ++variant) {
      TrainOptions options;
      options.batch = 16;
      options.eval_batch = 16;
      options.threads = variant == 0 ? 1 : c.threads;
      if (variant == 1) options.policy = c.policy, options.inter = c.inter, options.intra = c.intra;
      Trainer trainer(models::by_name(name), options);
      for (int step = 0; step < 20; ++step)
        losses[variant].push_back(trainer.train_step(images.data() + (step % 4) * 16 * 784, labels.data() + (step % 4) * 16));
      const Tensor& flat = trainer.params().flat_params();
      params[variant].assign(flat.f32(), flat.f32() + flat.numel());
    }
    for (int step = 0; step < 20; ++step)
      ASSERT_NEAR(losses[1][step], losses[0][step], 1e-4 * std::abs(losses[0][step]) + 1e-5) << name << " step " << step;
    for (size_t i = 0; i < params[0].size(); ++i)
      ASSERT_NEAR(params[1][i], params[0][i], 1e-4 * std::abs(params[0][i]) + 1e-5) << name << " parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, EveryPolicy,
                         ::testing::Values(PolicyCase{"serial", 1, 1, 1}, PolicyCase{"intra", 2, 1, 1},
                                           PolicyCase{"fixed", 1, 2, 1}, PolicyCase{"fixed", 1, 1, 2}),
                         [](const auto& info) {
                           return info.param.policy + std::to_string(info.param.inter) + "x" +
                                  std::to_string(info.param.intra);
                         });

// Random DAGs of elementwise ops and matmuls with fan-out and reuse of earlier values: with one
// thread per op, the concurrent executor's results equal the serial reference bit for bit.
TEST(Executor, RandomDagsMatchSerial) {
  for (int trial = 0; trial < 20; ++trial) {
    std::mt19937 rng(100 + trial);
    GraphBuilder b;
    const int64_t n = 4 + rng() % 12;
    std::vector<Value> values{b.input("x", Shape{n, n}), b.input("y", Shape{n, n})};
    const int nodes = 10 + static_cast<int>(rng() % 30);
    for (int i = 0; i < nodes; ++i) {
      Value a = values[rng() % values.size()], c = values[rng() % values.size()];
      switch (rng() % 5) {
        case 0: values.push_back(b.add(a, c)); break;
        case 1: values.push_back(b.mul(a, c)); break;
        case 2: values.push_back(b.tanh(a)); break;
        case 3: values.push_back(b.matmul(a, c, rng() % 2, rng() % 2)); break;
        default: values.push_back(b.sigmoid(a)); break;
      }
    }
    std::vector<Value> fetches(values.end() - 3, values.end());
    ParamStore store(b.graph());
    std::vector<std::vector<float>> results[2];
    for (int variant = 0; variant < 2; ++variant) {
      Plan plan(b.graph(), store, fetches);
      std::mt19937 fill(7);
      std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
      for (const char* name : {"x", "y"})
        for (int64_t k = 0; k < n * n; ++k) plan.input(name).f32()[k] = unit(fill);
      if (variant == 0) {
        plan.run();
      } else {
        Executor executor(plan, ExecutorOptions{Policy::Fixed, 1, 2, 1, false});
        executor.run();
      }
      for (Value fetch : fetches) {
        const Tensor& t = plan.tensor(fetch);
        results[variant].emplace_back(t.f32(), t.f32() + t.numel());
      }
    }
    for (size_t f = 0; f < fetches.size(); ++f) ASSERT_EQ(results[0][f], results[1][f]) << "trial " << trial;
  }
}

TEST(Executor, GrantedThreadsAreHonoured) {
  for (ExecutorOptions options : {ExecutorOptions{Policy::Intra, 2, 1, 1, true}, ExecutorOptions{Policy::Fixed, 1, 2, 1, true},
                                  ExecutorOptions{Policy::Fixed, 1, 1, 2, true}}) {
    TrainOptions train;
    train.batch = 64;
    train.eval_batch = 64;
    Trainer trainer(models::cnn(), train);
    Executor executor(trainer.train_plan(), options);
    executor.run();
    const int grant = executor.threads_per_lane();
    int used_more_than_one = 0;
    for (size_t p = 0; p < executor.threads_used().size(); ++p) {
      EXPECT_LE(executor.threads_used()[p], grant) << trainer.train_graph().node(trainer.train_plan().steps()[p].node).name;
      used_more_than_one += executor.threads_used()[p] > 1;
    }
    if (grant > 1) {
      EXPECT_GT(used_more_than_one, 0) << "a grant of " << grant << " threads was never used";
    }
  }
}

const bool registered_throwing_op = [] {
  OpDef def;
  def.kind = "test_throws";
  def.infer = [](const InferContext& ctx) { return std::vector<TensorType>{ctx.inputs[0]}; };
  def.kernels.push_back(cpu_kernel("reference", [](const KernelCall& call) {
    throw Error(cat("deliberate failure in '", call.node.name, "'"));
  }));
  return register_op(std::move(def));
}();

TEST(Executor, ThrowingKernelCancelsTheStepAndNamesTheNode) {
  GraphBuilder b;
  Value x = b.input("x", Shape{32, 32});
  Value left = x, right = x;
  for (int i = 0; i < 10; ++i) left = b.tanh(left);
  Value bad = b.apply1("test_throws", {x}, {}, "the_bad_node");
  for (int i = 0; i < 10; ++i) right = b.sigmoid(right);
  Value out = b.add(b.add(left, right), bad);
  ParamStore store(b.graph());
  Plan plan(b.graph(), store, {out});
  Executor executor(plan, ExecutorOptions{Policy::Fixed, 1, 2, 1, false});
  for (int attempt = 0; attempt < 3; ++attempt) {  // the executor stays usable after an error
    try {
      executor.run();
      FAIL() << "the step must fail";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("the_bad_node"), std::string::npos) << error.what();
    }
  }
}

TEST(Executor, ThousandConsecutiveSteps) {
  TrainOptions options;
  options.batch = 4;
  options.eval_batch = 4;
  options.policy = "fixed";
  options.inter = 2;
  Trainer trainer(models::mlp(), options);
  std::vector<float> images(4 * 784);
  for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<float>((i * 7919) % 255) / 255.0f;
  std::vector<int32_t> labels = {1, 3, 5, 7};
  double loss = 0.0;
  for (int step = 0; step < 1000; ++step) loss = trainer.train_step(images.data(), labels.data());
  EXPECT_LT(loss, 0.01);  // four fixed samples are memorised
}

TEST(Executor, RejectsBadPolicies) {
  EXPECT_THROW(parse_policy("auto-magic"), Error);
  TrainOptions options;
  options.batch = 4;
  options.eval_batch = 4;
  options.policy = "fixed";
  options.inter = 0;
  EXPECT_THROW(Trainer(models::mlp(), options), Error);
}

}  // namespace
}  // namespace quiver
