// Fashion-MNIST loader: turns the four IDX files into float images in [0, 1] and int labels,
// checking that they agree with each other. It does not download anything, normalise beyond
// dividing by 255, or batch: see batcher.h for iteration.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace quiver {

struct Dataset {
  int64_t count = 0;
  int64_t rows = 0, cols = 0;
  std::vector<float> images;    // (count, rows * cols), in [0, 1]
  std::vector<int32_t> labels;  // (count), in 0..9
};

// Throws quiver::Error (prefixed by `who`) unless the arrays hold exactly `count` samples of
// rows x cols values and `count` labels.
void check_consistent(const Dataset& data, const std::string& who);

// $QUIVER_DATA_DIR if set and non-empty, else /usr/share/datasets/fashion-mnist.
std::string default_fashion_mnist_dir();

enum class Split { Train, Test };

// Reads `<dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte`, preferring the `.gz` name and
// falling back to the plain one. Throws quiver::Error naming the directory or files on a
// missing directory or file, images that are not 3-D, labels that are not 1-D, an
// image/label count mismatch, a label outside 0..9, or a file whose header claims more data than
// available memory holds (checked before its data is read).
Dataset load_fashion_mnist(const std::string& dir, Split split);

}  // namespace quiver
