// Builder and autodiff behaviour: clear errors on bad graphs, gradient accumulation of values
// read twice, parameter naming, and the memory plan reusing activation buffers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/nn.h"
#include "runtime/param_store.h"
#include "runtime/plan.h"
#include "tests/captured_warnings.h"

namespace quiver {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

// A (2, 2) activation's description, for values added through Graph's own API.
ValueInfo activation_named(const std::string& name) {
  ValueInfo info;
  info.name = name;
  info.shape = Shape{2, 2};
  return info;
}

// A name third, as every other op takes it, names the node; it is not a transpose (a string
// literal converted to trans_a = true before the overload).
TEST(Builder, AMatmulNamedThirdIsNotTransposed) {
  GraphBuilder b;
  Value y = b.matmul(b.input("x", Shape{4, 3}), b.input("w", Shape{3, 2}), "fc");
  const Node& node = b.graph().node(b.graph().value(y.id).producer);
  EXPECT_EQ(node.name, "fc");
  EXPECT_EQ(b.shape(y), (Shape{4, 2}));
  EXPECT_EQ(node.attrs.get_int("trans_a"), 0);
  EXPECT_EQ(node.attrs.get_int("trans_b"), 0);
  const std::string name = "fc_" + std::to_string(2);  // a std::string third, as a layer makes it
  Value z = b.matmul(b.input("u", Shape{4, 3}), b.input("v", Shape{3, 2}), name);
  const Node& named = b.graph().node(b.graph().value(z.id).producer);
  EXPECT_EQ(named.name, "fc_2");
  EXPECT_EQ(named.attrs.get_int("trans_a"), 0);
  EXPECT_EQ(named.attrs.get_int("trans_b"), 0);
}

TEST(Builder, MatmulShapeMismatchNamesOpNodeAndBothShapes) {
  GraphBuilder b;
  Value x = b.input("x", Shape{64, 512});
  Value w = b.parameter("w", Shape{256, 10}, ParamInit::zeros());
  std::string message = error_of([&] { b.matmul(x, w, false, false, "fc2"); });
  EXPECT_NE(message.find("matmul"), std::string::npos) << message;
  EXPECT_NE(message.find("'fc2'"), std::string::npos) << message;
  EXPECT_NE(message.find("[64,512]"), std::string::npos) << message;
  EXPECT_NE(message.find("[256,10]"), std::string::npos) << message;
}

TEST(Builder, ConvChannelMismatchNamesTheNode) {
  GraphBuilder b;
  Value x = b.input("x", Shape{2, 3, 8, 8});
  Value w = b.parameter("w", Shape{4, 2, 3, 3}, ParamInit::zeros());
  std::string message = error_of([&] { b.conv2d(x, w, {}, "conv1"); });
  EXPECT_NE(message.find("conv2d 'conv1'"), std::string::npos) << message;
  EXPECT_NE(message.find("[2,3,8,8]"), std::string::npos) << message;
  EXPECT_NE(message.find("[4,2,3,3]"), std::string::npos) << message;
}

// Every op family's shape error names the op, the node and the shapes it was given.
TEST(Builder, ShapeErrorsNameTheOpTheNodeAndTheShapes) {
  struct Case {
    std::string op, node;
    std::vector<std::string> shapes;
    std::function<void(GraphBuilder&)> build;
  };
  const std::vector<Case> cases = {
      {"add", "sum", {"[4,6]", "[4,5]"},
       [](GraphBuilder& b) { b.add(b.input("x", Shape{4, 6}), b.input("y", Shape{4, 5}), "sum"); }},
      {"mul", "product", {"[4,6]", "[6,4]"},
       [](GraphBuilder& b) { b.mul(b.input("x", Shape{4, 6}), b.input("y", Shape{6, 4}), "product"); }},
      {"matmul", "fc2", {"[64,512]", "[256,10]"},
       [](GraphBuilder& b) {
         b.matmul(b.input("x", Shape{64, 512}), b.parameter("w", Shape{256, 10}, ParamInit::zeros()), false, false,
                  "fc2");
       }},
      {"bias_add", "fc1_bias", {"[8,16]", "[10]"},
       [](GraphBuilder& b) {
         b.bias_add(b.input("x", Shape{8, 16}), b.parameter("b", Shape{10}, ParamInit::zeros()), "fc1_bias");
       }},
      {"max_pool2d", "pool1", {"[2,3,4,4]"},
       [](GraphBuilder& b) { b.max_pool2d(b.input("x", Shape{2, 3, 4, 4}), 5, 5, "pool1"); }},
      {"lstm", "lstm1", {"[4,28,28]", "[20,512]"},
       [](GraphBuilder& b) {
         b.lstm(b.input("x", Shape{4, 28, 28}), b.parameter("wx", Shape{20, 512}, ParamInit::zeros()),
                b.parameter("wh", Shape{128, 512}, ParamInit::zeros()),
                b.parameter("b", Shape{512}, ParamInit::zeros()), "lstm1");
       }},
      {"softmax_cross_entropy", "loss", {"[4,10]", "[5]"},
       [](GraphBuilder& b) {
         b.softmax_cross_entropy(b.input("x", Shape{4, 10}), b.input("labels", Shape{5}, DType::I32), "loss");
       }},
  };
  for (const Case& c : cases) {
    GraphBuilder b;
    const std::string message = error_of([&] { c.build(b); });
    EXPECT_NE(message.find(cat(c.op, " '", c.node, "'")), std::string::npos) << message;
    for (const std::string& shape : c.shapes) EXPECT_NE(message.find(shape), std::string::npos) << message;
  }
}

TEST(Builder, OtherMalformedGraphsAreRejected) {
  GraphBuilder b;
  Value x = b.input("x", Shape{4, 6});
  EXPECT_THROW(b.add(x, b.input("y", Shape{4, 5})), Error);
  EXPECT_THROW(b.reshape(x, Shape{5, 5}), Error);
  EXPECT_THROW(b.input("x", Shape{1}), Error);                  // defined twice
  EXPECT_THROW(b.apply1("no_such_op", {x}), Error);
  EXPECT_THROW(b.relu(Value{999}), Error);
  Value labels = b.input("labels", Shape{4}, DType::F32);        // must be int32
  EXPECT_THROW(b.softmax_cross_entropy(x, labels), Error);
  Value loss_like = b.relu(x);
  EXPECT_THROW(build_backward(b, loss_like), Error);             // not a scalar
  Value count = b.input("count", Shape{}, DType::I32);
  EXPECT_NE(error_of([&] { build_backward(b, count); }).find("must be a float32 scalar"), std::string::npos);
}

// One optimizer, once: a second would update every parameter twice a step (and two SGD updates
// would share one velocity).
TEST(Autodiff, ASecondOptimizerIsRefused) {
  GraphBuilder b;
  Value w = b.parameter("w", Shape{3}, ParamInit::uniform(0.5));
  Value loss = b.reshape(b.matmul(b.reshape(w, Shape{1, 3}), b.reshape(w, Shape{3, 1})), Shape{});
  build_backward(b, loss);
  Value lr = b.input("learning_rate", Shape{1});
  add_sgd_update(b, lr, SgdOptions{});
  std::string message = error_of([&] { add_sgd_update(b, lr, SgdOptions{}); });
  EXPECT_NE(message.find("the graph has updates already ('w/update')"), std::string::npos) << message;
  EXPECT_THROW(add_adam_update(b, lr, b.input("step", Shape{1}), AdamOptions{}), Error);
}

// An op's gradient rule must give a gradient for every input a parameter reaches the loss
// through: one it leaves out would train that parameter on part of its gradient, silently.
const bool registered_forgetful_op = [] {
  OpDef def;
  def.kind = "test_scale_forgets_its_second_gradient";  // y = x * s (elementwise); backward sets dx only
  def.infer = [](const InferContext& ctx) { return std::vector<TensorType>{ctx.inputs[0]}; };
  def.backward = [](GradContext& ctx) {
    ctx.set_input_grad(0, ctx.builder().mul(ctx.output_grad(0), ctx.input(1)));
  };
  return register_op(std::move(def));
}();

TEST(Autodiff, AGradientRuleThatLeavesOutANeededInputIsAnError) {
  GraphBuilder b;
  Value x = b.input("x", Shape{3});
  Value s = b.parameter("s", Shape{3}, ParamInit::uniform(0.5));
  Value y = b.apply1("test_scale_forgets_its_second_gradient", {x, s}, {}, "scaled");
  Value loss = b.reshape(b.matmul(b.reshape(y, Shape{1, 3}), b.reshape(y, Shape{3, 1})), Shape{});
  const std::string message = error_of([&] { build_backward(b, loss); });
  EXPECT_NE(message.find("test_scale_forgets_its_second_gradient 'scaled': its gradient rule gave no gradient for "
                         "input 1 ('s')"),
            std::string::npos)
      << message;
  // Where that input needs none (the parameter is the first input: x is data), the rule is enough.
  GraphBuilder c;
  Value w = c.parameter("w", Shape{3}, ParamInit::uniform(0.5));
  Value z = c.apply1("test_scale_forgets_its_second_gradient", {w, c.input("x", Shape{3})});
  EXPECT_NO_THROW(build_backward(c, c.reshape(c.matmul(c.reshape(z, Shape{1, 3}), c.reshape(z, Shape{3, 1})), Shape{})));
}

// Handles that name no value of the builder's graph are quiver::Errors, never a
// std::out_of_range or a value that happens to have the same id: an empty Value, an id past the
// end, and a value of another builder (whose id exists here too).
TEST(Builder, HandlesOfNoValueOrOfAnotherGraphAreRefused) {
  GraphBuilder a, b;
  a.input("a", Shape{3, 3});
  Value from_a = a.input("aw", Shape{3, 3});
  Value x = b.input("x", Shape{3, 3});
  b.input("bw", Shape{3, 3});  // the id from_a has
  std::string message = error_of([&] { b.matmul(x, from_a, false, false, "mm"); });
  EXPECT_NE(message.find("matmul 'mm': input 1: the value belongs to another graph"), std::string::npos) << message;
  EXPECT_NE(error_of([&] { b.shape(Value{}); }).find("empty"), std::string::npos);
  EXPECT_NE(error_of([&] { b.relu(Value{999}); }).find("no value 999"), std::string::npos);
  EXPECT_NE(error_of([&] { build_backward(b, from_a); }).find("backward: loss: the value belongs to another graph"),
            std::string::npos);
  EXPECT_NE(error_of([&] { b.graph().value(-1); }).find("no value -1"), std::string::npos);
  EXPECT_NE(error_of([&] { b.graph().node(0); }).find("no node 0"), std::string::npos);
  // An update op has no output value for apply1 to return: refused before the graph changes.
  const size_t values = b.graph().values().size();
  EXPECT_NE(error_of([&] { b.apply1("sgd_update", {x, x, x, x}); }).find("build it with apply()"), std::string::npos);
  EXPECT_EQ(b.graph().values().size(), values);
  // A Value(id) carries no graph and is taken at its word, as the tests' gradient fetches are.
  EXPECT_NO_THROW(b.relu(Value(x.id)));
}

// A copy of a graph (a GraphBuilder passed by value, GraphBuilder(a.graph()), a Plan's copy)
// takes its original's handles to the values it was copied with, and nothing added to either
// afterwards: once both had grown, a handle of one named whichever value had its id in the other.
Value relu_in_a_copy(GraphBuilder copy, Value x) { return copy.relu(x, "copy_relu"); }  // by value: a slip

TEST(Builder, ACopyTakesOnlyTheValuesItWasMadeWith) {
  GraphBuilder a;
  Value x = a.input("x", Shape{2, 2});
  Value y = relu_in_a_copy(a, x);  // exists in the copy only
  a.parameter("w", Shape{2, 2}, ParamInit::zeros());  // the id y has
  std::string message = error_of([&] { a.add(y, x, "z"); });
  EXPECT_NE(message.find("add 'z': input 0: the value belongs to another graph"), std::string::npos) << message;

  GraphBuilder b(a.graph());
  EXPECT_EQ(b.shape(x), (Shape{2, 2}));  // made before the copy
  Value later_in_a = a.relu(x, "later_in_a");
  Value new_in_b = b.relu(x, "new_in_b");
  EXPECT_EQ(later_in_a.id, new_in_b.id);
  message = error_of([&] { b.add(later_in_a, x, "mix"); });
  EXPECT_NE(message.find("add 'mix': input 0: the value was added to the graph this one is a copy of after the copy"),
            std::string::npos)
      << message;
  EXPECT_NE(error_of([&] { a.relu(new_in_b); }).find("belongs to another graph"), std::string::npos);
  // A copy of the copy still takes the first graph's handles to the values copied with it.
  GraphBuilder c(b.graph());
  EXPECT_EQ(c.shape(x), (Shape{2, 2}));
  EXPECT_EQ(c.shape(new_in_b), (Shape{2, 2}));
  EXPECT_NE(error_of([&] { c.relu(later_in_a); }).find("after the copy was made"), std::string::npos);
  // Moving a graph keeps it the same graph; the moved-from one, built on again, is another.
  const uint64_t serial = c.graph().serial();
  GraphBuilder moved(std::move(c.graph()));
  EXPECT_EQ(moved.graph().serial(), serial);
  Value from_emptied = c.input("q", Shape{3, 3});
  EXPECT_NE(c.graph().serial(), serial);
  EXPECT_NE(error_of([&] { moved.shape(from_emptied); }).find("belongs to another graph"), std::string::npos);
}

// Names looked up by name (inputs, parameters, optimizer state) stay unique: an input named like
// a parameter's momentum would shadow it. A builder going on with a graph numbers its unnamed
// nodes past the graph's ("relu_0" came twice).
TEST(Builder, NamesStayUnique) {
  GraphBuilder b;
  Value w = b.parameter("w", Shape{2}, ParamInit::zeros());
  b.input("w/velocity", Shape{2});
  Value loss = b.reshape(b.matmul(b.reshape(w, Shape{1, 2}), b.reshape(w, Shape{2, 1})), Shape{});
  build_backward(b, loss);
  EXPECT_NE(error_of([&] { add_sgd_update(b, b.input("learning_rate", Shape{1}), SgdOptions{}); })
                .find("state 'w/velocity': the name is taken already"),
            std::string::npos);
  GraphBuilder states;
  states.parameter("u", Shape{2}, ParamInit::zeros());
  EXPECT_EQ(states.state(0, "velocity").id, states.state(0, "velocity").id);  // one value, asked twice
  GraphBuilder first;
  Value x = first.input("x", Shape{2, 2});
  first.relu(x);
  GraphBuilder next(first.graph());
  next.relu(x);
  std::vector<std::string> names;
  for (const Node& node : next.graph().nodes()) names.push_back(node.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end()) << names.front();
}

// shape() hands out a copy: a reference into the graph dangled once the graph grew (ASan:
// heap-use-after-free on the next use).
static_assert(std::is_same_v<decltype(std::declval<const GraphBuilder&>().shape(Value{})), Shape>);

// A module checks its input before adding anything, so a corrected retry under the same name works
// (the refused layer's weight once stayed behind, "defined twice"), and the message names the
// module, the shape and the option.
TEST(Modules, ALayerRefusedForItsInputAddsNothing) {
  GraphBuilder b;
  Value x = b.input("x", Shape{2, 3});
  const size_t values = b.graph().values().size();
  std::string message = error_of([&] { Linear("fc", LinearOptions(4, 5)).forward(b, x); });
  EXPECT_NE(message.find("module 'fc': input of shape [2,3]; expected (batch, features) with features = in_features = 4"),
            std::string::npos)
      << message;
  EXPECT_EQ(b.graph().values().size(), values);
  EXPECT_TRUE(b.graph().params().empty());
  EXPECT_EQ(b.shape(Linear("fc", LinearOptions(3, 5)).forward(b, x)), (Shape{2, 5}));
  Value image = b.input("image", Shape{1, 2, 6, 6});
  message = error_of([&] { Conv2d("conv", Conv2dOptions(3, 4, 3)).forward(b, image); });
  EXPECT_NE(message.find("module 'conv': input of shape [1,2,6,6]; expected (batch, channels, height, width) with "
                         "channels = in_channels = 3"),
            std::string::npos)
      << message;
  message = error_of([&] { LSTM("lstm", LSTMOptions(5, 4)).forward(b, image); });
  EXPECT_NE(message.find("module 'lstm': input of shape [1,2,6,6]; expected (batch, steps, features)"),
            std::string::npos)
      << message;
  // What the layer's own node refuses counts too: a 5x5 kernel on a 4x4 plane, a stride of 0.
  Value small = b.input("small", Shape{1, 1, 4, 4});
  message = error_of([&] { Conv2d("conv", Conv2dOptions(1, 4, 5)).forward(b, small); });
  EXPECT_NE(message.find("conv2d 'conv/conv'"), std::string::npos) << message;
  message = error_of([&] { Conv2d("conv", Conv2dOptions(1, 4, 3).stride(0)).forward(b, small); });
  EXPECT_NE(message.find("conv2d 'conv/conv'"), std::string::npos) << message;
  // A layer's own extents are named as such, not blamed on its input.
  message = error_of([&] { Linear("empty", LinearOptions(0, 5)).forward(b, x); });
  EXPECT_NE(message.find("module 'empty': the weight in_features x out_features needs extents >= 1"), std::string::npos)
      << message;
  EXPECT_EQ(b.graph().params().size(), 2u);  // fc's weight and bias only
  EXPECT_EQ(b.shape(Conv2d("conv", Conv2dOptions(1, 4, 5).padding(2)).forward(b, small)), (Shape{1, 4, 4, 4}));
  GraphBuilder other;
  message = error_of([&] { Linear("fc2", LinearOptions(3, 5)).forward(other, x); });
  EXPECT_NE(message.find("module 'fc2': input: the value belongs to another graph"), std::string::npos) << message;
}

// An attribute of the wrong type is named as such, not as missing; an unnamed flatten says
// "flatten", not "flatten ''".
TEST(Builder, AnAttributeOfTheWrongTypeIsNamedSo) {
  Attrs attrs;
  attrs.set("kernel", 2.0).set("shape", std::vector<int64_t>{1});
  EXPECT_NE(error_of([&] { attrs.get_int("kernel"); }).find("attribute 'kernel' is a float, not an integer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { attrs.get_int("stride"); }).find("missing integer attribute 'stride'"), std::string::npos);
  EXPECT_NE(error_of([&] { attrs.get_float("shape"); }).find("attribute 'shape' is a list of integers, not a number"),
            std::string::npos);
  EXPECT_NE(error_of([&] { attrs.get_ints("kernel"); }).find("attribute 'kernel' is a float, not a list of integers"),
            std::string::npos);
  GraphBuilder b;
  EXPECT_NE(error_of([&] { b.flatten(b.input("s", Shape{})); }).find("flatten: input is a scalar"), std::string::npos);
}

// Typed element access checks the tensor's type: an int32 input written through f32() once fed
// the float bits in silence.
TEST(Tensor, TheWrongTypedAccessIsRefused) {
  Tensor labels = Tensor::zeros(Shape{3}, DType::I32);
  EXPECT_NE(error_of([&] { labels.f32(); }).find("a tensor of i32 values (shape [3]) read as f32 through f32()"), std::string::npos);
  Tensor images = Tensor::zeros(Shape{2, 2});
  EXPECT_NE(error_of([&] { images.i32(); }).find("a tensor of f32 values (shape [2,2]) read as i32"), std::string::npos);
  EXPECT_NE(labels.i32(), nullptr);
  EXPECT_EQ(labels.raw(), static_cast<void*>(labels.i32()));
}

// A ParamStore is not copyable (a copy aliased the buffers: a "snapshot" that moved with
// training), and an index past its parameters is a quiver::Error, not std::out_of_range.
static_assert(!std::is_copy_constructible_v<ParamStore> && !std::is_copy_assignable_v<ParamStore>);
static_assert(std::is_move_constructible_v<ParamStore>);

TEST(ParamStore, AnIndexPastTheParametersIsNamed) {
  GraphBuilder b;
  b.parameter("w", Shape{2}, ParamInit::zeros());
  ParamStore store(b.graph());
  EXPECT_NE(error_of([&] { store.param(7); }).find("no parameter 7 in this store (it has 1)"), std::string::npos);
  EXPECT_NE(error_of([&] { store.state("velocity", -1); }).find("no parameter -1"), std::string::npos);
  EXPECT_EQ(store.grad(0).numel(), 2);
}

// PlanOptions::prefer_kernel names a kernel; a misspelt one was ignored in silence (and a test
// meant for the reference kernels ran the others).
TEST(Plan, AMisspeltPreferredKernelIsRefused) {
  GraphBuilder b;
  Value x = b.input("x", Shape{2, 2});
  Value y = b.relu(x, "y");
  ParamStore store(b.graph());
  PlanOptions options;
  options.prefer_kernel = "refernce";
  const std::string message = error_of([&] { Plan(b.graph(), store, {y}, options); });
  EXPECT_NE(message.find("prefer_kernel 'refernce' names no CPU kernel (those are: "), std::string::npos) << message;
  EXPECT_NE(message.find("reference"), std::string::npos) << message;
  options.prefer_kernel = "reference";
  EXPECT_NO_THROW(Plan(b.graph(), store, {y}, options));
}

// A node refused for its control inputs leaves nothing behind (its outputs were once added first).
TEST(Builder, ARefusedNodeLeavesTheGraphAsItWas) {
  GraphBuilder b;
  Value x = b.input("x", Shape{2, 2});
  const size_t values = b.graph().values().size(), nodes = b.graph().nodes().size();
  EXPECT_NE(error_of([&] { b.apply("relu", {x}, {}, "r", {5}); }).find("control input 5 does not exist"),
            std::string::npos);
  EXPECT_EQ(b.graph().values().size(), values);
  EXPECT_EQ(b.graph().nodes().size(), nodes);
}

TEST(Builder, ScopesAndPoolStridesAreChecked) {
  GraphBuilder b;
  EXPECT_NE(error_of([&] { b.pop_scope(); }).find("no scope is open"), std::string::npos);
  b.push_scope("a");
  b.pop_scope();
  EXPECT_THROW(b.pop_scope(), Error);
  Value x = b.input("x", Shape{1, 1, 6, 6});
  EXPECT_NE(error_of([&] { b.max_pool2d(x, 2, -3, "pool"); }).find("max_pool2d 'pool': stride must be >= 1"),
            std::string::npos);
  EXPECT_EQ(b.shape(b.max_pool2d(x, 2)), (Shape{1, 1, 3, 3}));  // 0: the kernel's size
  EXPECT_EQ(b.shape(b.max_pool2d(x, 2, 1)), (Shape{1, 1, 5, 5}));
}

TEST(Builder, UniformInitsNeedAFiniteBound) {
  GraphBuilder b;
  for (double bound : {std::nan(""), double{INFINITY}, -1.0})
    EXPECT_NE(error_of([&] { b.parameter(cat("w", bound), Shape{2}, ParamInit::uniform(bound)); }).find("finite bound"),
              std::string::npos)
        << bound;
  EXPECT_THROW(b.parameter("w0", Shape{2}, ParamInit::uniform(0.1, 0)), Error);
  EXPECT_NO_THROW(b.parameter("w1", Shape{2}, ParamInit::uniform(0.0)));
  // A sum of draws past float32's range would convert undefined (most weights came out +-inf), and
  // a billion terms an element would never finish initialising.
  EXPECT_NE(error_of([&] { b.parameter("huge", Shape{4}, ParamInit::uniform(1e39)); }).find("within float32's range"),
            std::string::npos);
  EXPECT_THROW(b.parameter("summed", Shape{4}, ParamInit::uniform(1e38, 4)), Error);
  EXPECT_NE(error_of([&] { b.parameter("slow", Shape{4}, ParamInit::uniform(0.1, 1 << 30)); }).find("terms <= 64"),
            std::string::npos);
  EXPECT_NO_THROW(b.parameter("w2", Shape{2}, ParamInit::uniform(1e37, 2)));
  // So would a fill's value; an infinity converts as it is.
  EXPECT_NE(error_of([&] { b.fill(Shape{2}, 1e39, "too_big"); }).find("fill 'too_big': value 1e+39 does not fit in a float32"),
            std::string::npos);
  EXPECT_NO_THROW(b.fill(Shape{2}, -INFINITY, "minus_infinity"));
}

// Once the gradients are built a new parameter would have none, and every later call refused the
// graph with another reason ("call build_backward before adding updates", "gradients were already
// built"): the parameter is refused instead, saying so.
TEST(Builder, AParameterAfterTheBackwardIsRefused) {
  GraphBuilder b;
  Value w = b.parameter("w", Shape{2}, ParamInit::zeros());
  build_backward(b, b.reshape(b.matmul(b.reshape(w, Shape{1, 2}), b.input("r", Shape{2, 1})), Shape{}));
  EXPECT_NE(error_of([&] { b.parameter("late", Shape{2}, ParamInit::zeros()); })
                .find("parameter 'late': the graph's gradients are built already (build_backward)"),
            std::string::npos);
  EXPECT_NO_THROW(add_sgd_update(b, b.input("lr", Shape{1}), SgdOptions{}));
}

// A module's extents are checked before the module multiplies them: an LSTM's 4 x hidden once
// wrapped to 0 (and the error showed a [1,0] weight), a conv's fan-in overflowed.
TEST(Modules, ExtentsAreCheckedBeforeTheirProducts) {
  GraphBuilder b;
  Value sequence = b.input("s", Shape{2, 3, 1});
  EXPECT_NE(error_of([&] { LSTM("lstm", LSTMOptions(1, int64_t{1} << 62)).forward(b, sequence); })
                .find("module 'lstm': the gates' width 4 x hidden_size needs extents >= 1"),
            std::string::npos);
  EXPECT_THROW(LSTM("none", LSTMOptions(1, 0)).forward(b, sequence), Error);
  Value image = b.input("x", Shape{1, 1, 4, 4});
  EXPECT_NE(error_of([&] { Conv2d("conv", Conv2dOptions(int64_t{1} << 32, 1, int64_t{1} << 32)).forward(b, image); })
                .find("module 'conv': the fan-in in_channels x kernel x kernel needs extents >= 1"),
            std::string::npos);
  const double glorot = ParamInit::glorot_uniform(std::numeric_limits<int64_t>::max(), 1).bound;  // the sum wrapped
  EXPECT_TRUE(std::isfinite(glorot) && glorot > 0.0) << glorot;
}

// Extents below 1 never reach a plan (whose allocation would be handed a negative size), and an
// op's output is checked the same way, naming the op and the node.
TEST(Builder, ShapesNeedExtentsOfAtLeastOne) {
  GraphBuilder b;
  std::string message = error_of([&] { b.input("x", Shape{-1, 784}); });
  EXPECT_NE(message.find("input 'x'"), std::string::npos) << message;
  EXPECT_NE(message.find("[-1,784]"), std::string::npos) << message;
  EXPECT_THROW(b.input("empty", Shape{0, 3}), Error);
  EXPECT_THROW(b.input("huge", Shape{int64_t{1} << 32, int64_t{1} << 32}), Error);  // 2^64 elements
  // 2^62 elements fit in int64, their 2^64 bytes do not: once a 64-byte buffer and a crash.
  message = error_of([&] { b.input("wide", Shape{int64_t{1} << 30, int64_t{1} << 32}); });
  EXPECT_NE(message.find("more elements than a tensor can hold"), std::string::npos) << message;
  EXPECT_THROW(b.parameter("wide_w", Shape{int64_t{1} << 62}, ParamInit::zeros()), Error);
  EXPECT_THROW(Tensor::empty(Shape{int64_t{1} << 62}), Error);  // 2^64 bytes
  EXPECT_THROW(b.parameter("w", Shape{-3, -5}, ParamInit::zeros()), Error);
  Value x = b.input("y", Shape{2, 3});
  message = error_of([&] { b.reshape(x, Shape{-2, -3}, "flip"); });  // same element count
  EXPECT_NE(message.find("reshape 'flip'"), std::string::npos) << message;
}

// A kernel larger than the padded input is refused before C++ division could round the output
// size up to 1 ((2 - 3) / 2 + 1 == 1), a huge padding before x + 2*padding could overflow, and an
// im2col matrix whose size would.
TEST(Builder, ConvGeometryIsCheckedBeforeItsArithmetic) {
  GraphBuilder b;
  Value x = b.input("x", Shape{1, 1, 2, 2});
  Value w = b.parameter("w", Shape{1, 1, 3, 3}, ParamInit::zeros());
  Conv2dAttrs attrs;
  attrs.stride = 2;
  std::string message = error_of([&] { b.conv2d(x, w, attrs, "tiny"); });
  EXPECT_NE(message.find("does not fit"), std::string::npos) << message;
  attrs.padding = 1;
  EXPECT_NO_THROW(b.conv2d(x, w, attrs, "padded"));  // 4x4 padded input: fits
  attrs.padding = int64_t{1} << 62;
  message = error_of([&] { b.conv2d(x, w, attrs, "far"); });
  EXPECT_NE(message.find("conv2d 'far'"), std::string::npos) << message;
  EXPECT_NE(message.find("invalid"), std::string::npos) << message;
  // One image's im2col matrix (C*KH*KW x OH*OW values, a kernel's scratch) must not overflow:
  // here 2^40 x 1025^2, from tensors of 2^40 values each (shapes only: nothing is allocated).
  Value big_x = b.input("big_x", Shape{1, int64_t{1} << 20, 1024, 1024});
  Value big_w = b.parameter("big_w", Shape{1, int64_t{1} << 20, 1024, 1024}, ParamInit::zeros());
  attrs.stride = 1;
  attrs.padding = 512;
  message = error_of([&] { b.conv2d(big_x, big_w, attrs, "huge"); });
  EXPECT_NE(message.find("im2col matrix"), std::string::npos) << message;
}

// Ops take float32 where their kernels read floats, and gradient ops check the shapes they are
// given against their attributes (they are reachable through apply()).
TEST(Builder, DtypesAndGradientOpShapesAreChecked) {
  GraphBuilder b;
  Value labels = b.input("labels", Shape{4, 1}, DType::I32);
  Value w = b.parameter("w", Shape{1, 10}, ParamInit::zeros());
  std::string message = error_of([&] { b.matmul(labels, w, false, false, "int_matmul"); });
  EXPECT_NE(message.find("int_matmul"), std::string::npos) << message;
  EXPECT_NE(message.find("i32"), std::string::npos) << message;

  Value dy = b.input("dy", Shape{2, 4});
  Attrs step;
  step.set("step", int64_t{10});
  step.set("shape", std::vector<int64_t>{2, 3, 4});
  message = error_of([&] { b.apply1("select_step_grad", {dy}, step, "far"); });
  EXPECT_NE(message.find("step 10"), std::string::npos) << message;

  Value pooled_dy = b.input("pooled_dy", Shape{1, 1, 3, 3});
  Value argmax = b.input("argmax", Shape{1, 1, 3, 3}, DType::I32);
  Attrs pool;
  pool.set("kernel", int64_t{2});
  pool.set("shape", std::vector<int64_t>{1, 1, 4, 4});  // pools to 2x2, not 3x3
  message = error_of([&] { b.apply1("max_pool2d_grad", {pooled_dy, argmax}, pool, "pool_grad"); });
  EXPECT_NE(message.find("[1,1,2,2]"), std::string::npos) << message;

  Value conv_dy = b.input("conv_dy", Shape{1, 4, 5, 5});
  Value kernel = b.parameter("k", Shape{4, 1, 3, 3}, ParamInit::zeros());
  Attrs conv;
  conv.set("shape", std::vector<int64_t>{1, 1, 8, 8});  // a 3x3 kernel makes 6x6, not 5x5
  message = error_of([&] { b.apply1("conv2d_grad_input", {conv_dy, kernel}, conv, "conv_grad"); });
  EXPECT_NE(message.find("[1,4,6,6]"), std::string::npos) << message;
  // A gradient's "shape" is an attribute, not one of its inputs: the messages say so.
  conv.set("shape", std::vector<int64_t>{1, 8, 8});
  message = error_of([&] { b.apply1("conv2d_grad_input", {conv_dy, kernel}, conv, "conv_grad"); });
  EXPECT_NE(message.find("attribute shape [1,8,8] and weight [4,1,3,3] must have rank 4"), std::string::npos) << message;
  conv.set("shape", std::vector<int64_t>{1, 2, 7, 7});
  message = error_of([&] { b.apply1("conv2d_grad_input", {conv_dy, kernel}, conv, "conv_grad"); });
  EXPECT_NE(message.find("attribute shape [1,2,7,7] has 2 channels but weight [4,1,3,3] expects 1"), std::string::npos)
      << message;
  Value conv_x = b.input("conv_x", Shape{1, 1, 7, 7});
  conv.set("shape", std::vector<int64_t>{4, 2, 3, 3});
  message = error_of([&] { b.apply1("conv2d_grad_weight", {conv_dy, conv_x}, conv, "conv_wgrad"); });
  EXPECT_NE(message.find("input [1,1,7,7] has 1 channels but attribute shape [4,2,3,3] expects 2"), std::string::npos)
      << message;

  Value probs = b.input("probs", Shape{4, 10});
  Value few = b.input("few_labels", Shape{3}, DType::I32);
  Value dloss = b.input("dloss", Shape{});
  EXPECT_THROW(b.apply1("softmax_cross_entropy_grad", {dloss, probs, few}), Error);

  // select_step copies floats: an int32 sequence was read as floats (1..6 came out as denormals).
  Value tokens = b.input("tokens", Shape{2, 3, 1}, DType::I32);
  Attrs last;
  last.set("step", int64_t{-1});
  message = error_of([&] { b.apply1("select_step", {tokens}, last, "int_step"); });
  EXPECT_NE(message.find("int_step"), std::string::npos) << message;
  EXPECT_NE(message.find("i32"), std::string::npos) << message;
  // Pooling windows are unpadded: a padding was ignored, giving PyTorch's padded shape's smaller twin.
  Value image = b.input("image", Shape{1, 1, 5, 5});
  Attrs padded;
  padded.set("kernel", int64_t{3}).set("stride", int64_t{2}).set("padding", int64_t{1});
  message = error_of([&] { b.apply("max_pool2d", {image}, padded, "padded_pool"); });
  EXPECT_NE(message.find("padding 1 is not supported"), std::string::npos) << message;
}

// Graph::add_node takes outputs that are new activations only: an input or parameter as output, a
// value another node produces, or one an earlier node reads (a cycle) are refused with the node's
// name, and so is an output that does not exist (it threw std::out_of_range).
TEST(Graph, ANodesOutputsAreNewActivations) {
  GraphBuilder b;
  Value x = b.input("x", Shape{2, 2});
  Value w = b.parameter("w", Shape{2, 2}, ParamInit::zeros());
  Value y = b.relu(x, "first");
  Graph& g = b.graph();
  auto node_writing = [&](ValueId output, ValueId input) {
    Node node;
    node.op = "relu";
    node.name = "bad";
    node.inputs = {input};
    node.outputs = {output};
    return node;
  };
  EXPECT_NE(error_of([&] { g.add_node(node_writing(x.id, y.id)); }).find("'bad': output 'x' is not an activation"),
            std::string::npos);
  EXPECT_NE(error_of([&] { g.add_node(node_writing(w.id, y.id)); }).find("output 'w' is not an activation"),
            std::string::npos);
  EXPECT_NE(error_of([&] { g.add_node(node_writing(y.id, x.id)); }).find("output 'first' is already the output of node"),
            std::string::npos);
  EXPECT_NE(error_of([&] { g.add_node(node_writing(12345, x.id)); }).find("output value 12345 does not exist"),
            std::string::npos);
  ValueInfo fresh = activation_named("fresh");
  const ValueId later = g.add_value(fresh);
  Value read_early = b.relu(g.handle(later), "reads_fresh");  // reads a value nothing has produced yet
  (void)read_early;
  EXPECT_NE(error_of([&] { g.add_node(node_writing(later, x.id)); }).find("output 'fresh' is read by an earlier node"),
            std::string::npos);
  Node twice = node_writing(g.add_value(ValueInfo{}), x.id);
  twice.outputs.push_back(twice.outputs[0]);
  EXPECT_NE(error_of([&] { g.add_node(twice); }).find("is given twice"), std::string::npos);
  const size_t nodes = g.nodes().size();
  EXPECT_EQ(g.add_node(node_writing(g.add_value(ValueInfo{}), x.id)), static_cast<NodeId>(nodes));  // a new one is fine
  // A node that reads its own output: the reader is registered after the check above, so it was
  // accepted and its kernel ran on the value's unwritten buffer.
  const ValueId loop = g.add_value(ValueInfo{});
  EXPECT_NE(error_of([&] { g.add_node(node_writing(loop, loop)); }).find("output '' is also its input (a cycle)"),
            std::string::npos);
}

// Only add_node makes a value a node's output: add_value drops a producer its caller claims, and
// add_param takes only the Parameter value of its own slot (build_backward indexed by it unchecked).
TEST(Graph, ProducersAndParameterSlotsAreTheGraphsToSet) {
  GraphBuilder b;
  Graph& g = b.graph();
  b.relu(b.input("x", Shape{2, 2}), "first");
  ValueInfo claimed = activation_named("claimed");
  claimed.producer = 0;
  EXPECT_EQ(g.value(g.add_value(claimed)).producer, -1);
  EXPECT_NE(error_of([&] { g.add_param(ParamInfo{"ghost", -1, -1, ParamInit::zeros()}); }).find("no value -1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { g.add_param(ParamInfo{"x_as_w", 0, -1, ParamInit::zeros()}); })
                .find("parameter 'x_as_w': value 0 ('x') is not the parameter value of slot 0"),
            std::string::npos);
  EXPECT_TRUE(g.params().empty());
}

// A default Tensor has no storage, yet counts one element (shape []): filling it, copying to or
// from it, or viewing it followed a null pointer.
TEST(Tensor, ADefaultTensorIsRefusedWhereItsElementsWouldBeUsed) {
  const Tensor none;
  const Tensor one = Tensor::zeros(Shape{1});
  EXPECT_NE(error_of([&] { none.fill(0.0f); }).find("fill: the tensor is empty (a default Tensor"), std::string::npos);
  EXPECT_NE(error_of([&] { one.copy_from(none); }).find("copy (from): the tensor is empty"), std::string::npos);
  EXPECT_NE(error_of([&] { none.copy_from(one); }).find("copy (into): the tensor is empty"), std::string::npos);
  EXPECT_THROW((void)none.view(Shape{1}), Error);
  EXPECT_THROW((void)none.slice(0, Shape{1}), Error);
  EXPECT_THROW((void)none.to_cpu(), Error);
}

// The readers of a value are indexed as nodes are added (not found by scanning every node, which
// made building a graph quadratic): each reader once, in id order, also in a copy of the graph.
TEST(Graph, ReadersOfAValueAreEachNodeReadingItOnceInIdOrder) {
  GraphBuilder b;
  Value x = b.input("x", Shape{2, 2});
  Value y = b.relu(x, "first");
  Value sum = b.add(x, x, "x_twice");
  Value z = b.add(y, x, "y_and_x");
  const Graph& g = b.graph();
  const std::vector<NodeId> readers_of_x = g.consumers(x.id);
  EXPECT_EQ(readers_of_x, (std::vector<NodeId>{g.value(y.id).producer, g.value(sum.id).producer,
                                               g.value(z.id).producer}));
  EXPECT_EQ(g.consumers(y.id), std::vector<NodeId>{g.value(z.id).producer});
  EXPECT_TRUE(g.consumers(z.id).empty());
  const Graph copy = g;
  Value later = b.relu(x, "later");
  EXPECT_EQ(copy.consumers(x.id), readers_of_x);
  EXPECT_EQ(g.consumers(x.id).back(), g.value(later.id).producer);
  EXPECT_NE(error_of([&] { (void)g.consumers(12345); }).find("no value 12345"), std::string::npos);
}

// Errors that are not about shapes (a missing or mistyped attribute) still name the op, the node
// and the input shapes; so does a parameter index that does not exist.
TEST(Builder, AttributeErrorsNameTheOpAndTheNode) {
  GraphBuilder b;
  Value x = b.input("x", Shape{2, 3, 8, 8});
  std::string message = error_of([&] { b.apply1("max_pool2d", {x}, {}, "pool_without_kernel"); });
  EXPECT_NE(message.find("max_pool2d 'pool_without_kernel'"), std::string::npos) << message;
  EXPECT_NE(message.find("'kernel'"), std::string::npos) << message;
  EXPECT_NE(message.find("[2,3,8,8]"), std::string::npos) << message;
  Attrs attrs;
  attrs.set("trans_a", 0.5);
  message = error_of([&] { b.apply1("matmul", {b.input("a", Shape{2, 3}), b.input("c", Shape{3, 4})}, attrs, "mm"); });
  EXPECT_NE(message.find("matmul 'mm'"), std::string::npos) << message;
  message = error_of([&] { b.state(7, "velocity"); });
  EXPECT_NE(message.find("no parameter 7"), std::string::npos) << message;
}

// An attribute the op does not take is refused, not ignored: conv2d once built a plain convolution
// for a node asking for dilation 2, and a misspelt "strides" pooled with the default stride.
TEST(Builder, AnAttributeTheOpDoesNotTakeIsRefused) {
  GraphBuilder b;
  Value x = b.input("x", Shape{2, 3, 8, 8});
  Value w = b.input("w", Shape{4, 3, 3, 3});
  Attrs dilated = conv2d_attrs({});
  dilated.set("dilation", int64_t{2});
  const size_t nodes = b.graph().nodes().size(), values = b.graph().values().size();
  std::string message = error_of([&] { b.apply1("conv2d", {x, w}, dilated, "dilated"); });
  EXPECT_NE(message.find("conv2d 'dilated': unknown attribute 'dilation'; conv2d takes stride, padding"),
            std::string::npos) << message;
  EXPECT_EQ(b.graph().nodes().size(), nodes);
  EXPECT_EQ(b.graph().values().size(), values);
  message = error_of([&] { b.infer("conv2d", {{Shape{2, 3, 8, 8}}, {Shape{4, 3, 3, 3}}}, dilated, "probe"); });
  EXPECT_NE(message.find("conv2d 'probe': unknown attribute 'dilation'"), std::string::npos) << message;
  Attrs misspelt;
  misspelt.set("kernel", int64_t{2}).set("strides", int64_t{1});
  message = error_of([&] { b.apply("max_pool2d", {x}, misspelt, "pool"); });
  EXPECT_NE(message.find("max_pool2d 'pool': unknown attribute 'strides'; max_pool2d takes kernel, stride, padding"),
            std::string::npos) << message;
  Attrs slope;
  slope.set("alpha", 0.1);
  message = error_of([&] { b.apply1("relu", {x}, slope, "leaky"); });
  EXPECT_NE(message.find("relu 'leaky': unknown attribute 'alpha'; relu takes no attributes"), std::string::npos)
      << message;
  // What the op does take is still accepted, the gradients' attributes included.
  Value p = b.parameter("p", Shape{4, 3, 3, 3}, ParamInit::uniform(0.1));
  Value y = b.max_pool2d(b.relu(b.conv2d(x, p, {.stride = 1, .padding = 1}, "conv")), 2, 2, "pool");
  Value loss = b.softmax_cross_entropy(b.matmul(b.flatten(y), b.parameter("fc", Shape{64, 10}, ParamInit::uniform(0.1))),
                                       b.input("labels", Shape{2}, DType::I32));
  EXPECT_NO_THROW(build_backward(b, loss));
}

// A node added through Graph's own API is checked by the plan the same way.
TEST(Plan, AnAttributeTheOpDoesNotTakeIsRefused) {
  GraphBuilder b;
  Value x = b.input("x", Shape{2, 2});
  Graph& g = b.graph();
  Node node;
  node.op = "relu";
  node.name = "leaky";
  node.inputs = {x.id};
  node.outputs = {g.add_value(activation_named("leaky"))};
  node.attrs.set("alpha", 0.1);
  g.add_node(node);
  ParamStore store(g);
  const std::string message = error_of([&] { Plan plan(g, store, {g.handle(node.outputs[0])}); });
  EXPECT_NE(message.find("plan: relu 'leaky': unknown attribute 'alpha'; relu takes no attributes"), std::string::npos)
      << message;
}

// softmax_cross_entropy differentiates its loss, not its probabilities: a gradient reaching the
// probabilities is an error naming the op and the node, not silently dropped.
TEST(Autodiff, AGradientThroughAnOutputWithoutOneIsAnError) {
  GraphBuilder b;
  Value logits = b.matmul(b.input("x", Shape{4, 3}), b.parameter("w", Shape{3, 5}, ParamInit::zeros()));
  std::vector<Value> outputs =
      b.apply("softmax_cross_entropy", {logits, b.input("labels", Shape{4}, DType::I32)}, {}, "ce");
  Value probs_sum = b.reshape(b.matmul(b.reshape(outputs[1], Shape{1, 20}), b.input("ones", Shape{20, 1})), Shape{});
  Value loss = b.add(outputs[0], probs_sum);
  std::string message = error_of([&] { build_backward(b, loss); });
  EXPECT_NE(message.find("softmax_cross_entropy 'ce'"), std::string::npos) << message;
  EXPECT_NE(message.find("probabilities"), std::string::npos) << message;
}

// A loss that no parameter reaches trains nothing (a loss built from the wrong value): refused
// before any backward node is added. A parameter the loss does not reach (an unused layer) gets a
// zero gradient, said once.
TEST(Autodiff, ALossNoParameterReachesIsRefusedAndAnUnusedOneIsSaid) {
  GraphBuilder b;
  Value x = b.input("x", Shape{4, 3});
  Value w = b.parameter("w", Shape{3, 2}, ParamInit::zeros());
  b.matmul(x, w, "unused_branch");
  Value loss = b.reshape(b.matmul(b.reshape(x, Shape{1, 12}), b.input("ones", Shape{12, 1})), Shape{}, "input_sum");
  const size_t nodes = b.graph().nodes().size(), values = b.graph().values().size();
  std::string message = error_of([&] { build_backward(b, loss); });
  EXPECT_NE(message.find("loss 'input_sum' depends on none of the 1 parameters (w)"), std::string::npos) << message;
  EXPECT_EQ(b.graph().nodes().size(), nodes);
  EXPECT_EQ(b.graph().values().size(), values);
  EXPECT_EQ(b.graph().params()[0].grad, -1);

  GraphBuilder empty;
  Value only_input = empty.reshape(empty.input("s", Shape{1}), Shape{});
  message = error_of([&] { build_backward(empty, only_input); });
  EXPECT_NE(message.find("the graph has no parameters"), std::string::npos) << message;

  GraphBuilder partly;
  Value used = partly.parameter("used", Shape{1, 3}, ParamInit::zeros());
  partly.parameter("frozen", Shape{3}, ParamInit::zeros());
  Value partly_loss = partly.reshape(partly.matmul(used, partly.input("R", Shape{3, 1})), Shape{});
  test::CapturedWarnings warnings;
  build_backward(partly, partly_loss);
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_NE(warnings.messages[0].find("parameter 'frozen' does not reach loss"), std::string::npos) << warnings.messages[0];
  ParamStore store(partly.graph());
  Plan plan(partly.graph(), store, {Value{partly.graph().params()[1].grad}});
  store.grad(1).f32()[0] = 7.0f;  // the plan writes the zero gradient
  plan.run();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(store.grad(1).f32()[i], 0.0f) << i;
}

TEST(Autodiff, GradientsOfValuesReadTwiceAreSummed) {
  // loss = sum((w * w) * R): d/dw = 2 w R, built from two contributions of w.
  GraphBuilder b;
  Value w = b.parameter("w", Shape{1, 3}, ParamInit::zeros());
  Value r = b.input("R", Shape{3, 1});
  Value loss = b.reshape(b.matmul(b.mul(w, w), r), Shape{});
  build_backward(b, loss);
  ParamStore store(b.graph());
  const float values[3] = {1.0f, -2.0f, 0.5f}, weights[3] = {3.0f, 1.0f, -4.0f};
  std::copy_n(values, 3, store.param(0).f32());
  Plan plan(b.graph(), store, {loss, Value{b.graph().params()[0].grad}});
  std::copy_n(weights, 3, plan.input("R").f32());
  plan.run();
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(store.grad(0).f32()[i], 2 * values[i] * weights[i]);
}

// A value read by many nodes: its gradient is a chain of adds, each of which grows the graph (a
// name borrowed from the graph while it grew was read after it moved: AddressSanitizer found it).
TEST(Autodiff, GradientsOfValuesReadManyTimesAreSummed) {
  // loss = sum((64 h + tanh(h) + h * h) * R) with h = w * 1, an activation read by 66 nodes: the
  // 67 contributions to its gradient need more new values than the graph had, so it reallocates.
  GraphBuilder b;
  Value w = b.parameter("w", Shape{1, 3}, ParamInit::zeros());
  Value h = b.mul(w, b.fill(Shape{1, 3}, 1.0, "one"), "h");
  Value y = b.add(b.tanh(h), b.mul(h, h));
  for (int i = 0; i < 64; ++i) y = b.add(y, h);
  Value r = b.input("R", Shape{3, 1});
  build_backward(b, b.reshape(b.matmul(y, r), Shape{}));
  ParamStore store(b.graph());
  const float values[3] = {0.5f, -1.0f, 2.0f}, weights[3] = {1.0f, -2.0f, 0.25f};
  std::copy_n(values, 3, store.param(0).f32());
  Plan plan(b.graph(), store, {Value{b.graph().params()[0].grad}});
  std::copy_n(weights, 3, plan.input("R").f32());
  plan.run();
  const float* grad = plan.tensor(Value{b.graph().params()[0].grad}).f32();
  for (int i = 0; i < 3; ++i) {  // d/dh = (64 + (1 - tanh(h)^2) + 2h) R
    const double t = std::tanh(values[i]);
    EXPECT_NEAR(grad[i], (64.0 + (1.0 - t * t) + 2.0 * values[i]) * weights[i], 1e-4) << i;
  }
}

TEST(Modules, ParametersAreNamedByModule) {
  GraphBuilder b;
  Sequential net;
  net.add<Linear>("fc1", LinearOptions(4, 3)).add<ReLU>("relu").add<Linear>("fc2", LinearOptions(3, 2).bias(false));
  Value y = net.forward(b, b.input("x", Shape{5, 4}));
  EXPECT_EQ(b.shape(y), (Shape{5, 2}));
  std::vector<std::string> names;
  for (const ParamInfo& p : b.graph().params()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"fc1/weight", "fc1/bias", "fc2/weight"}));
}

// The layers' initial draws: He uniform weights and zero biases by default, PyTorch's
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for both on request. A uniform draw of bound c has variance
// c^2/3, so with a few thousand values the sample variance tells the two bounds apart.
TEST(Modules, LayersDrawHeUniformByDefaultAndTorchDefaultsOnRequest) {
  struct Drawn {
    double max_abs = 0.0, variance = 0.0;
  };
  auto drawn = [](const Tensor& values) {
    Drawn d;
    const int64_t n = values.numel();
    for (int64_t i = 0; i < n; ++i) {
      const double v = values.f32()[i];
      d.max_abs = std::max(d.max_abs, std::abs(v));
      d.variance += v * v / static_cast<double>(n);
    }
    return d;
  };
  GraphBuilder b;
  Value x = b.input("x", Shape{2, 1, 8, 8});
  Value y = Conv2d("conv", Conv2dOptions(1, 64, 5).padding(2)).forward(b, x);      // fan_in 25
  y = Linear("he", LinearOptions(64 * 8 * 8, 96)).forward(b, b.flatten(y));          // fan_in 4096
  Linear("torch", LinearOptions(96, 400).init(LayerInit::torch_default)).forward(b, y);  // fan_in 96
  ParamStore store(b.graph());
  store.initialize(5);
  std::vector<std::string> names;
  for (const ParamInfo& p : b.graph().params()) names.push_back(p.name);
  ASSERT_EQ(names, (std::vector<std::string>{"conv/weight", "conv/bias", "he/weight", "he/bias",
                                             "torch/weight", "torch/bias"}));
  const double fan_ins[] = {25.0, 4096.0, 96.0};
  for (int layer = 0; layer < 2; ++layer) {  // He: bound sqrt(6/fan_in), variance 2/fan_in
    const double bound = std::sqrt(6.0 / fan_ins[layer]);
    const Drawn weight = drawn(store.param(2 * layer));
    EXPECT_LE(weight.max_abs, bound * (1 + 1e-6)) << names[2 * layer];
    EXPECT_GE(weight.max_abs, 0.95 * bound) << names[2 * layer];
    EXPECT_NEAR(weight.variance, 2.0 / fan_ins[layer], 0.1 * 2.0 / fan_ins[layer]) << names[2 * layer];
    EXPECT_EQ(drawn(store.param(2 * layer + 1)).max_abs, 0.0) << names[2 * layer + 1];
  }
  const double torch_bound = 1.0 / std::sqrt(fan_ins[2]);  // variance 1/(3 fan_in)
  for (int index : {4, 5}) {
    const Drawn d = drawn(store.param(index));
    EXPECT_LE(d.max_abs, torch_bound * (1 + 1e-6)) << names[index];
    EXPECT_GE(d.max_abs, 0.9 * torch_bound) << names[index];
  }
  EXPECT_NEAR(drawn(store.param(4)).variance, 1.0 / (3 * fan_ins[2]), 0.1 / (3 * fan_ins[2]));
}

// A plan keeps its own copy of the graph: the builder may go, or grow, once the plan is made, and
// the builder's handles still name the plan's tensors.
TEST(Plan, OutlivesItsBuilderAndIgnoresWhatIsAddedLater) {
  std::unique_ptr<Plan> plan;
  std::unique_ptr<ParamStore> store;
  Value y;
  {
    GraphBuilder b;
    Value x = b.input("x", Shape{2, 2});
    y = b.relu(x);
    store = std::make_unique<ParamStore>(b.graph());
    plan = std::make_unique<Plan>(b.graph(), *store, std::vector<Value>{y});
    b.input("late", Shape{2});  // after the plan: not the plan's
    EXPECT_NE(error_of([&] { plan->input("late"); }).find("no input or parameter named 'late'"), std::string::npos);
  }
  plan->input("x").fill(-1.0f);
  plan->input("x").f32()[3] = 4.0f;
  plan->run();
  EXPECT_FLOAT_EQ(plan->tensor(y).f32()[3], 4.0f);
  EXPECT_FLOAT_EQ(plan->tensor(y).f32()[0], 0.0f);
  GraphBuilder other;
  Value foreign = other.input("x", Shape{2, 2});
  EXPECT_NE(error_of([&] { plan->tensor(foreign); }).find("belongs to another graph"), std::string::npos);
  EXPECT_NE(error_of([&] { plan->tensor(Value{}); }).find("empty"), std::string::npos);
}

// An unknown op is named; a registry with no op at all (a program that linked libquiver.a without
// --whole-archive, so no op file's registration ran) says how to link instead.
TEST(OpRegistry, AnUnknownOpIsNamedAndAnEmptyRegistrySaysWhy) {
  EXPECT_EQ(error_of([] { OpRegistry::global().get("no_such_op"); }), "unknown op 'no_such_op'");
  const OpRegistry empty;
  EXPECT_NE(error_of([&] { empty.get("matmul"); }).find("unknown op 'matmul': no op is registered (link the library whole"),
            std::string::npos);
}

// tensor() hands out only what holds its value after run(): an activation that is not fetched
// shares its buffer with later values (here h's buffer is taken by y's), and a gradient no step
// computes (only the loss fetched, no optimizer) would read as the store's zeros.
TEST(Plan, ReadsOnlyWhatItKeeps) {
  GraphBuilder b;
  Value x = b.input("x", Shape{1, 4});
  Value labels = b.input("labels", Shape{1}, DType::I32);
  Value w = b.parameter("w", Shape{4, 4}, ParamInit::zeros());
  Value h = b.relu(b.matmul(x, w), "h");
  Value y = b.tanh(b.relu(h), "y");
  Value loss = b.softmax_cross_entropy(y, labels, "loss");
  build_backward(b, loss);
  const Value grad{b.graph().params()[0].grad};
  ParamStore store(b.graph());
  Plan plan(b.graph(), store, {loss});
  plan.run();
  EXPECT_NE(error_of([&] { plan.tensor(h); }).find("value 'h' is not kept by this plan"), std::string::npos)
      << error_of([&] { plan.tensor(h); });
  EXPECT_NE(error_of([&] { plan.tensor(grad); }).find("is not computed by this plan (fetch it"), std::string::npos)
      << error_of([&] { plan.tensor(grad); });
  // What it keeps: inputs, parameters and fetched values; a gradient it computes, once fetched.
  EXPECT_EQ(plan.tensor(x).numel(), 4);
  EXPECT_EQ(plan.tensor(labels).numel(), 1);
  EXPECT_EQ(plan.tensor(w).numel(), 16);
  EXPECT_TRUE(std::isfinite(plan.tensor(loss).f32()[0]));
  Plan fetching(b.graph(), store, {loss, h, grad});
  fetching.input("x").fill(1.0f);
  fetching.run();
  EXPECT_EQ(fetching.tensor(h).numel(), 4);
  EXPECT_EQ(fetching.tensor(grad).numel(), 16);
}

// A graph made through Graph's own API is checked when it is planned: a node that reads an
// activation nothing computes, or whose output is not what its op makes of its inputs (a shape
// changed after inference), is refused naming the node, and so is a parameter's value declared
// with another shape than its slot. Each once ran: a null read, or a write past the end of a
// buffer.
TEST(Plan, NodesMadeOrChangedOutsideTheBuilderAreCheckedBeforeTheyRun) {
  {
    GraphBuilder b;
    Graph& g = b.graph();
    ValueInfo orphan = activation_named("orphan");
    Value y = b.relu(g.handle(g.add_value(orphan)), "reads_orphan");
    ParamStore store(g);
    const std::string message = error_of([&] { Plan plan(g, store, {y}); });
    EXPECT_NE(message.find("plan: relu 'reads_orphan': input 0 'orphan' is an activation that no node computes"),
              std::string::npos) << message;
  }
  {
    GraphBuilder b;
    Value y = b.relu(b.input("x", Shape{2, 2}), "grown");
    b.graph().value(y.id).shape = Shape{64, 64};
    ParamStore store(b.graph());
    const std::string message = error_of([&] { Plan plan(b.graph(), store, {y}); });
    EXPECT_NE(message.find("plan: relu 'grown': output 0 'grown' is [64,64] f32; its op makes [2,2] f32"),
              std::string::npos) << message;
  }
  {
    GraphBuilder b;
    Value x = b.input("x", Shape{2, 3});
    Value y = b.relu(x, "was_fine");
    b.graph().value(x.id).dtype = DType::I32;  // an input retyped after its reader was inferred
    ParamStore store(b.graph());
    const std::string message = error_of([&] { Plan plan(b.graph(), store, {y}); });
    EXPECT_NE(message.find("plan: relu 'was_fine': its inputs no longer fit its op: "), std::string::npos) << message;
    EXPECT_EQ(message.find("'was_fine'", message.find("'was_fine'") + 1), std::string::npos) << "named once: " << message;
  }
  {  // a producer written through the mutable value(): nothing wrote the buffer its reader reads
    GraphBuilder b;
    Graph& g = b.graph();
    b.relu(b.input("x", Shape{2, 2}), "first");
    ValueInfo fake = activation_named("fake");
    const ValueId id = g.add_value(fake);
    Value y = b.relu(g.handle(id), "reads_fake");
    g.value(id).producer = 0;
    ParamStore store(g);
    const std::string message = error_of([&] { Plan plan(g, store, {y}); });
    EXPECT_NE(message.find("plan: relu 'reads_fake': input 0 'fake' claims node 0 computes it; no earlier node does"),
              std::string::npos) << message;
  }
  {  // a parameter's value declared larger than its slot: its reader's kernel would read past it
    GraphBuilder b;
    Value w = b.parameter("w", Shape{2, 2}, ParamInit::zeros());
    ValueInfo wide = b.graph().value(w.id);
    wide.name = "w_wide";
    wide.shape = Shape{64, 64};
    Graph& g = b.graph();
    Value y = b.relu(g.handle(g.add_value(wide)), "reads_wide");
    ParamStore store(g);
    const std::string message = error_of([&] { Plan plan(g, store, {y}); });
    EXPECT_NE(message.find("plan: parameter 'w_wide' is [64,64] f32; its slot 'w' holds [2,2] f32"), std::string::npos)
        << message;
  }
  {  // a producer that names no node at all: the walk of what the fetches need indexed past its end
    GraphBuilder b;
    Value y = b.relu(b.input("x", Shape{2, 2}), "fetched");
    b.graph().value(y.id).producer = 10000;
    ParamStore store(b.graph());
    const std::string message = error_of([&] { Plan plan(b.graph(), store, {y}); });
    EXPECT_NE(message.find("no node 10000"), std::string::npos) << message;
  }
}

// Tensor views and slices stay inside their storage: an offset near 2^63 once overflowed past the
// bounds check, and negative extents passed as a count of elements.
TEST(Tensor, SlicesAndViewsStayInsideTheirStorage) {
  Tensor t = Tensor::zeros(Shape{4}, DType::F32);
  EXPECT_EQ(t.slice(1, Shape{3}).numel(), 3);
  EXPECT_EQ(t.slice(4, Shape{0}).numel(), 0);
  EXPECT_NE(error_of([&] { t.slice(std::numeric_limits<int64_t>::max(), Shape{2}); }).find("does not fit"), std::string::npos);
  EXPECT_NE(error_of([&] { t.slice(2, Shape{3}); }).find("slice: [3] at 2 does not fit in [4]"), std::string::npos);
  EXPECT_NE(error_of([&] { t.slice(0, Shape{-2, -2}); }).find("does not fit"), std::string::npos);
  EXPECT_NE(error_of([&] { t.view(Shape{-2, -2}); }).find("view: cannot view [4] as [-2,-2]"), std::string::npos);
  EXPECT_EQ(t.view(Shape{2, 2}).numel(), 4);
}

// An error while a kernel is prepared (here: fill without its value) names the op and the node,
// as errors while it runs do.
TEST(Plan, AnErrorPreparingAKernelNamesTheNode) {
  GraphBuilder b;
  Attrs attrs;
  attrs.set("shape", std::vector<int64_t>{2});
  Value filled = b.apply1("fill", {}, attrs, "no_value");
  ParamStore store(b.graph());
  std::string message = error_of([&] { Plan plan(b.graph(), store, {filled}); });
  EXPECT_NE(message.find("fill 'no_value': "), std::string::npos) << message;
  EXPECT_NE(message.find("'value'"), std::string::npos) << message;
}

TEST(Plan, ActivationBuffersAreReused) {
  // A chain of 20 relus needs two live buffers at a time, not twenty.
  GraphBuilder b;
  Value x = b.input("x", Shape{256, 256});
  Value y = x;
  for (int i = 0; i < 20; ++i) y = b.relu(y);
  ParamStore store(b.graph());
  Plan plan(b.graph(), store, {y});
  EXPECT_LE(plan.activation_bytes(), 3 * 256 * 256 * 4);
  plan.input("x").fill(-1.0f);
  plan.input("x").f32()[7] = 2.0f;
  plan.run();
  EXPECT_FLOAT_EQ(plan.tensor(y).f32()[7], 2.0f);
  EXPECT_FLOAT_EQ(plan.tensor(y).f32()[8], 0.0f);
}

// A test op whose kernel asks for the workspace its "bytes" attribute names and records the
// context it was prepared with.
const ExecContext* prepared_with = nullptr;
const bool registered_workspace_op = [] {
  OpDef def;
  def.kind = "test_workspace";
  def.infer = [](const InferContext& ctx) { return std::vector<TensorType>{ctx.inputs[0]}; };
  def.attributes = {"bytes"};
  KernelImpl impl;
  impl.name = "reference";
  impl.device = DeviceKind::CPU;
  impl.prepare = [](const KernelSpec& spec) -> KernelFn {
    prepared_with = spec.context;
    spec.workspace_bytes = spec.node.attrs.get_int("bytes");
    return [](const KernelCall& call) { call.outputs[0].copy_from(call.inputs[0]); };
  };
  def.kernels.push_back(std::move(impl));
  return register_op(std::move(def));
}();

// Kernels are prepared with the context the plan will call them with (a device kernel may pick
// its algorithm with the stream's library handle then), and the plan's workspace is the largest
// request: the kernels of a stream share one workspace, so requests do not add up.
TEST(Plan, KernelsArePreparedWithThePlansContextAndItsWorkspaceIsTheLargestRequest) {
  GraphBuilder b;
  Value x = b.input("x", Shape{4});
  Value y = x;
  for (int64_t bytes : {100, 300, 200}) y = b.apply1("test_workspace", {y}, Attrs().set("bytes", bytes));
  ParamStore store(b.graph());
  for (int threads : {1, 2}) {
    PlanOptions options;
    options.threads = threads;
    Plan plan(b.graph(), store, {y}, options);
    EXPECT_EQ(prepared_with, &plan.context()) << threads << " thread(s)";
    EXPECT_EQ(plan.workspace_bytes(), 300);
  }
}

// A test op that adds 1 to its input in place, as an optimizer's update writes a parameter.
const bool registered_in_place_op = [] {
  OpDef def;
  def.kind = "test_add_one_in_place";
  def.infer = [](const InferContext&) { return std::vector<TensorType>{}; };
  def.written_inputs = {0};
  KernelImpl impl;
  impl.name = "reference";
  impl.device = DeviceKind::CPU;
  impl.prepare = [](const KernelSpec&) -> KernelFn {
    return [](const KernelCall& call) {
      Tensor x = call.inputs[0];
      for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] += 1.0f;
    };
  };
  def.kernels.push_back(std::move(impl));
  return register_op(std::move(def));
}();

// A value updated in place has no edge for a reader to follow: the plan orders the update after
// the steps before it that read the value and before those after it, as a serial run does, so a
// concurrent executor never runs them side by side. GraphBuilder adds control inputs for the
// readers before (add_update_order) and refuses readers after; a graph made with
// Graph::add_node had no order at all.
TEST(Plan, AnInPlaceUpdateIsOrderedAgainstTheValuesReaders) {
  GraphBuilder b;
  Graph& g = b.graph();
  Value w = b.parameter("w", Shape{4}, ParamInit::zeros());
  Value before = b.relu(w, "reads_before");
  Node update;
  update.op = "test_add_one_in_place";
  update.name = "update";
  update.inputs = {w.id};
  const NodeId update_id = g.add_node(update);  // no control inputs
  Node late;  // a reader after the update (the builder refuses one; add_node does not)
  late.op = "relu";
  late.name = "reads_after";
  late.inputs = {w.id};
  ValueInfo late_value = g.value(before.id);
  late_value.name = "reads_after";
  late_value.producer = -1;
  late.outputs = {g.add_value(late_value)};
  g.add_node(late);
  const Value after = g.handle(late.outputs[0]);
  ParamStore store(g);
  Plan plan(g, store, {before, after});
  auto position_of = [&](const std::string& name) {
    for (size_t p = 0; p < plan.steps().size(); ++p)
      if (g.node(plan.steps()[p].node).name == name) return static_cast<int>(p);
    return -1;
  };
  ASSERT_EQ(g.node(plan.steps()[static_cast<size_t>(position_of("update"))].node).id, update_id);
  const std::vector<int>& update_waits = plan.steps()[static_cast<size_t>(position_of("update"))].after;
  const std::vector<int>& reader_waits = plan.steps()[static_cast<size_t>(position_of("reads_after"))].after;
  EXPECT_NE(std::find(update_waits.begin(), update_waits.end(), position_of("reads_before")), update_waits.end());
  EXPECT_NE(std::find(reader_waits.begin(), reader_waits.end(), position_of("update")), reader_waits.end());
  plan.run();  // and the serial meaning: 0 before the update, 1 after it
  EXPECT_EQ(plan.tensor(before).f32()[0], 0.0f);
  EXPECT_EQ(plan.tensor(after).f32()[0], 1.0f);
}

// An op's written inputs index a node's inputs: a negative one (or one listed twice) is refused
// when the op registers, not read out of bounds by the builder and the plan.
TEST(OpRegistry, WrittenInputsMustBeDistinctAndNotNegative) {
  for (const std::vector<int>& written : {std::vector<int>{-1}, std::vector<int>{0, 2, 0}}) {
    OpRegistry registry;
    OpDef def;
    def.kind = "bad_update";
    def.written_inputs = written;
    const std::string message = error_of([&] { registry.add(def); });
    EXPECT_NE(message.find("op 'bad_update': written input "), std::string::npos) << message;
    EXPECT_FALSE(registry.has("bad_update"));
  }
  OpRegistry registry;
  OpDef def;
  def.kind = "good_update";
  def.written_inputs = {0, 2};
  EXPECT_NO_THROW(registry.add(def));
}

TEST(ParamStore, InitialisationDependsOnlyOnSeedAndName) {
  GraphBuilder b;
  b.parameter("a", Shape{10}, ParamInit::uniform(0.5));
  b.parameter("b", Shape{10}, ParamInit::uniform(0.5));
  ParamStore one(b.graph()), two(b.graph());
  one.initialize(3);
  two.initialize(3);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(one.param(1).f32()[i], two.param(1).f32()[i]);
    EXPECT_LE(std::abs(one.param(0).f32()[i]), 0.5f);
  }
  two.initialize(4);
  EXPECT_NE(one.param(0).f32()[0], two.param(0).f32()[0]);
  // By name, not by position: "b" declared after another parameter draws the same values, and
  // two names with one seed draw different ones.
  GraphBuilder other;
  other.parameter("z", Shape{3}, ParamInit::uniform(0.5));
  other.parameter("b", Shape{10}, ParamInit::uniform(0.5));
  ParamStore three(other.graph());
  three.initialize(3);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(three.param(1).f32()[i], one.param(1).f32()[i]);
  EXPECT_NE(one.param(0).f32()[0], one.param(1).f32()[0]);
  // Flat buffers: every parameter is a view into one allocation.
  EXPECT_EQ(one.param(0).storage(), one.param(1).storage());
}

}  // namespace
}  // namespace quiver
