// cuBLAS, loaded with dlopen when the first CUDA context is made instead of linked: libcublas
// pulls in libcublasLt, whose load alone (static data and initialisers) costs a process more
// resident memory than a CPU adjsh process holds without it (docs/BENCHMARKS.md), and every
// adjsh process (coordinators, CPU workers, `adjsh --help`) would pay it whether it uses a GPU
// or not. Only the functions adjsh calls are looked up. The library is found as the dynamic
// loader finds it (LD_LIBRARY_PATH, ld.so.cache), else in the CUDA toolkit this adjsh was built
// against.
#ifndef ADJSH_KERNELS_CUDA_CUBLAS_API_H_
#define ADJSH_KERNELS_CUDA_CUBLAS_API_H_

#include <cublas_v2.h>

#include <string>

namespace adjsh::cuda {

struct CublasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSetWorkspace_v2) set_workspace;
  decltype(&cublasGemmEx_64) gemm_ex_64;
  decltype(&cublasGetStatusString) status_string;
};

// The API (loaded once per process, then kept), or nullptr with *error saying which library or
// function could not be loaded and why.
const CublasApi* LoadCublas(std::string* error);

// The loaded API; aborts if it cannot be loaded (MakeCudaBackend refuses the device first,
// through CublasUsable in device_block.h).
const CublasApi& Cublas();

}  // namespace adjsh::cuda

#endif  // ADJSH_KERNELS_CUDA_CUBLAS_API_H_
