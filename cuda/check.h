// Every CUDA runtime, cuBLAS, cuDNN and NCCL call goes through one of these macros: a failure
// throws quiver::Error with the call, the error's name and its description, never aborts.
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

#include "cuda/cublas.h"

namespace quiver::cuda {

[[noreturn]] void fail(const char* call, const char* file, int line, const std::string& name,
                       const std::string& description);

}  // namespace quiver::cuda

#define QUIVER_CUDA_CHECK(call)                                                              \
  do {                                                                                       \
    cudaError_t quiver_status_ = (call);                                                     \
    if (quiver_status_ != cudaSuccess)                                                       \
      ::quiver::cuda::fail(#call, __FILE__, __LINE__, cudaGetErrorName(quiver_status_),      \
                           cudaGetErrorString(quiver_status_));                              \
  } while (0)

#define QUIVER_CUBLAS_CHECK(call)                                                            \
  do {                                                                                       \
    cublasStatus_t quiver_status_ = (call);                                                  \
    if (quiver_status_ != CUBLAS_STATUS_SUCCESS)                                             \
      ::quiver::cuda::fail(#call, __FILE__, __LINE__,                                        \
                           ::quiver::cuda::cublas_api().status_name(quiver_status_),         \
                           ::quiver::cuda::cublas_api().status_string(quiver_status_));      \
  } while (0)

#define QUIVER_CUDNN_CHECK(call)                                                             \
  do {                                                                                       \
    cudnnStatus_t quiver_status_ = (call);                                                   \
    if (quiver_status_ != CUDNN_STATUS_SUCCESS) {                                            \
      char quiver_detail_[512] = {0};                                                        \
      cudnnGetLastErrorString(quiver_detail_, sizeof quiver_detail_);                        \
      ::quiver::cuda::fail(#call, __FILE__, __LINE__, cudnnGetErrorString(quiver_status_),   \
                           quiver_detail_);                                                  \
    }                                                                                        \
  } while (0)

// Kernel launches report configuration errors through cudaGetLastError.
#define QUIVER_CUDA_CHECK_LAUNCH() QUIVER_CUDA_CHECK(cudaGetLastError())
