// cuBLAS, opened on first use instead of linked. libcublas needs libcublasLt (540 MB), whose
// load-time relocations cost about a second of CPU time at the start of every process that links
// it, whether or not it ever touches a GPU: each test case, each CPU-only quiver-train run
// (docs/design-notes.md, "Running the tests"). So the library is opened (dlopen) when the first
// cuBLAS handle is made, and its functions are called through this table. cuBLAS is not on the
// link line, so a direct call to one of its functions does not link.
#pragma once

#include <cublas_v2.h>

#include <string>
#include <vector>

namespace quiver::cuda {

// The cuBLAS functions Quiver calls (cublas_v2.h's names: create is cublasCreate_v2, and so on).
struct CublasApi {
  decltype(&::cublasCreate) create = nullptr;
  decltype(&::cublasDestroy) destroy = nullptr;
  decltype(&::cublasSetStream) set_stream = nullptr;
  decltype(&::cublasSgemm_64) sgemm_64 = nullptr;
  decltype(&::cublasGetStatusName) status_name = nullptr;
  decltype(&::cublasGetStatusString) status_string = nullptr;
};

// The process's table, loaded by the first call (thread-safe) from the first of cublas_candidates()
// that opens. Throws quiver::Error naming each file tried and why it failed; the next call tries again.
const CublasApi& cublas_api();

// Where cublas_api() looks, in order: the soname of the cuBLAS whose headers Quiver was compiled
// with (found as the dynamic loader finds a linked library: LD_LIBRARY_PATH, the program's
// run path, the system's cache), then that file in the CUDA toolkit found at build time.
std::vector<std::string> cublas_candidates();

// A table loaded from the first of `files` that opens; throws quiver::Error when none opens or the
// one that opens lacks a function. Never closed (a table's functions stay valid for the process).
CublasApi load_cublas(const std::vector<std::string>& files);

}  // namespace quiver::cuda
