// QUIVER_HD marks per-element math written once for the CPU and CUDA kernels: __host__ __device__
// under nvcc, nothing elsewhere. Its own header so that a file built with special flags (the LSTM
// cell loops, ops/lstm_cell.cpp) can use that math without pulling in the rest of the framework.
#pragma once

#ifdef __CUDACC__
#define QUIVER_HD __host__ __device__
#else
#define QUIVER_HD
#endif
