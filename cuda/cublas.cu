#include "cuda/cublas.h"

#include <dlfcn.h>

#include <type_traits>

#include "core/error.h"

// The exported name of a cuBLAS function, after cublas_v2.h's macros (cublasCreate -> "cublasCreate_v2").
#define QUIVER_CUBLAS_STRINGIFY(name) #name
#define QUIVER_CUBLAS_SYMBOL(name) QUIVER_CUBLAS_STRINGIFY(name)

namespace quiver::cuda {

std::vector<std::string> cublas_candidates() {
  std::vector<std::string> files{cat("libcublas.so.", CUBLAS_VER_MAJOR)};
#ifdef QUIVER_CUDA_LIBRARY_DIR
  files.push_back(cat(QUIVER_CUDA_LIBRARY_DIR, "/libcublas.so.", CUBLAS_VER_MAJOR));
#endif
  return files;
}

CublasApi load_cublas(const std::vector<std::string>& files) {
  std::string tried;
  void* library = nullptr;
  std::string opened;
  for (const std::string& file : files) {
    if ((library = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL))) {
      opened = file;
      break;
    }
    const char* reason = dlerror();
    tried += cat(tried.empty() ? "" : "; ", file, ": ", reason ? reason : "not found");
  }
  if (!library)
    throw Error(cat("CUDA: cannot open cuBLAS, which the CUDA backend needs (",
                    tried.empty() ? "no file to try" : tried, "); is the CUDA toolkit's lib directory on LD_LIBRARY_PATH?"));
  CublasApi api;
  auto resolve = [&](auto& function, const char* name) {
    dlerror();
    void* address = dlsym(library, name);
    if (!address) {
      const char* reason = dlerror();
      dlclose(library);
      throw Error(cat("CUDA: '", opened, "' is not a usable cuBLAS: it lacks ", name, " (",
                      reason ? reason : "no reason given", ")"));
    }
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(address);
  };
  resolve(api.create, QUIVER_CUBLAS_SYMBOL(cublasCreate));
  resolve(api.destroy, QUIVER_CUBLAS_SYMBOL(cublasDestroy));
  resolve(api.set_stream, QUIVER_CUBLAS_SYMBOL(cublasSetStream));
  resolve(api.sgemm_64, QUIVER_CUBLAS_SYMBOL(cublasSgemm_64));
  resolve(api.status_name, QUIVER_CUBLAS_SYMBOL(cublasGetStatusName));
  resolve(api.status_string, QUIVER_CUBLAS_SYMBOL(cublasGetStatusString));
  return api;
}

const CublasApi& cublas_api() {
  static const CublasApi api = load_cublas(cublas_candidates());  // a throw leaves it for the next call
  return api;
}

}  // namespace quiver::cuda

#undef QUIVER_CUBLAS_SYMBOL
#undef QUIVER_CUBLAS_STRINGIFY
