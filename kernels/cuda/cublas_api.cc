#include "kernels/cuda/cublas_api.h"

#include "kernels/cuda/device_block.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <type_traits>

namespace adjsh::cuda {
namespace {

struct Loaded {
  CublasApi api{};
  std::string error;  // empty: api is complete
};

Loaded Load() {
  Loaded out;
  const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string why = lib == nullptr ? dlerror() : "";
#ifdef ADJSH_CUDA_LIBRARY_DIR
  if (lib == nullptr) {
    const std::string path = std::string(ADJSH_CUDA_LIBRARY_DIR) + "/" + name;
    lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) why += std::string("; ") + dlerror();
  }
#endif
  if (lib == nullptr) {
    out.error = "cannot load cuBLAS (" + why + ")";
    return out;
  }
  // Never closed: the API stays valid for the process's life.
  auto find = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
    if (fn == nullptr && out.error.empty()) {
      out.error = "cannot find " + std::string(symbol) + " in " + name;
    }
  };
  find(out.api.create, "cublasCreate_v2");
  find(out.api.set_stream, "cublasSetStream_v2");
  find(out.api.set_math_mode, "cublasSetMathMode");
  find(out.api.set_workspace, "cublasSetWorkspace_v2");
  find(out.api.gemm_ex_64, "cublasGemmEx_64");
  find(out.api.status_string, "cublasGetStatusString");
  return out;
}

const Loaded& Once() {
  static const Loaded loaded = Load();  // thread-safe initialisation
  return loaded;
}

}  // namespace

const CublasApi* LoadCublas(std::string* error) {
  const Loaded& l = Once();
  if (!l.error.empty()) {
    if (error != nullptr) *error = l.error;
    return nullptr;
  }
  return &l.api;
}

const CublasApi& Cublas() {
  const Loaded& l = Once();
  if (!l.error.empty()) {  // MakeCudaBackend refuses the device first: a bug, not a user error
    std::fprintf(stderr, "adjsh: cuBLAS used but not usable: %s\n", l.error.c_str());
    std::abort();
  }
  return l.api;
}

bool CublasUsable(std::string* error) { return LoadCublas(error) != nullptr; }

}  // namespace adjsh::cuda
