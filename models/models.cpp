#include "models/models.h"

#include "core/error.h"

namespace quiver::models {

ModelSpec mlp() {
  auto net = std::make_shared<Sequential>();
  net->add<Linear>("fc1", LinearOptions(784, 512))
      .add<ReLU>("relu1")
      .add<Linear>("fc2", LinearOptions(512, 256))
      .add<ReLU>("relu2")
      .add<Linear>("fc3", LinearOptions(256, 10));
  return {"mlp", Shape{784}, [net](GraphBuilder& b, Value x) { return net->forward(b, x); }};
}

ModelSpec cnn() {
  auto net = std::make_shared<Sequential>();
  net->add<Conv2d>("conv1", Conv2dOptions(1, 16, 5).padding(2))
      .add<ReLU>("relu1")
      .add<MaxPool2d>("pool1", 2)
      .add<Conv2d>("conv2", Conv2dOptions(16, 32, 5).padding(2))
      .add<ReLU>("relu2")
      .add<MaxPool2d>("pool2", 2)
      .add<Flatten>("flatten")
      .add<Linear>("fc1", LinearOptions(32 * 7 * 7, 128))
      .add<ReLU>("relu3")
      .add<Linear>("fc2", LinearOptions(128, 10));
  return {"cnn", Shape{1, 28, 28}, [net](GraphBuilder& b, Value x) { return net->forward(b, x); }};
}

ModelSpec lstm() {
  auto net = std::make_shared<Sequential>();
  net->add<LSTM>("lstm", LSTMOptions(28, 128))
      .add<LastStep>("last")
      .add<Linear>("fc", LinearOptions(128, 10));
  return {"lstm", Shape{28, 28}, [net](GraphBuilder& b, Value x) { return net->forward(b, x); }};
}

std::vector<std::string> names() { return {"mlp", "cnn", "lstm"}; }

ModelSpec by_name(const std::string& name) {
  if (name == "mlp") return mlp();
  if (name == "cnn") return cnn();
  if (name == "lstm") return lstm();
  throw Error(cat("unknown model '", name, "' (choose mlp, cnn or lstm)"));
}

}  // namespace quiver::models
