// matmul: (M,K) x (K,N) -> (M,N) with optional transposes (attrs trans_a, trans_b). Kernels:
// oneDNN sgemm sliced over the granted threads (ops/gemm.h), then the naive reference.
#pragma once
