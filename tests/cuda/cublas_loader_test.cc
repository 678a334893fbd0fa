// cuBLAS is loaded on first use (kernels/cuda/cublas_api.h), not linked: every machine that
// builds the CUDA backend has the toolkit's libcublas, so loading it must work here, GPU or not.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "kernels/cuda/cublas_api.h"
#include "kernels/cuda/device_block.h"

namespace adjsh::cuda {
namespace {

TEST(CublasLoader, LoadsEveryFunctionAdjshCalls) {
  std::string error;
  const CublasApi* api = LoadCublas(&error);
  ASSERT_NE(api, nullptr) << error;
  EXPECT_NE(api->create, nullptr);
  EXPECT_NE(api->set_stream, nullptr);
  EXPECT_NE(api->set_math_mode, nullptr);
  EXPECT_NE(api->set_workspace, nullptr);
  EXPECT_NE(api->gemm_ex_64, nullptr);
  ASSERT_NE(api->status_string, nullptr);
  // A call into the loaded library that needs no GPU.
  const char* text = api->status_string(CUBLAS_STATUS_NOT_INITIALIZED);
  ASSERT_NE(text, nullptr);
  EXPECT_NE(std::strstr(text, "not initialized"), nullptr) << text;
  // Loaded once: the same table every time, and CublasUsable agrees.
  EXPECT_EQ(LoadCublas(nullptr), api);
  EXPECT_EQ(&Cublas(), api);
  EXPECT_TRUE(CublasUsable(&error)) << error;
}

}  // namespace
}  // namespace adjsh::cuda
