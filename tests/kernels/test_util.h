// Helpers shared by the kernel and engine tests: small configs, random tokens, and the
// per-tensor relative error ||a - b|| / ||b|| between two gradients.
#ifndef ADJSH_TESTS_KERNELS_TEST_UTIL_H_
#define ADJSH_TESTS_KERNELS_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/model.h"
#include "gtest/gtest.h"

namespace adjsh::testing {

inline MambaConfig SmallConfig(int64_t layers, int64_t D = 8, int64_t N = 4, int64_t W = 4,
                               int64_t R = 2, int64_t V = 13) {
  MambaConfig c;
  c.hidden_size = D;
  c.num_hidden_layers = layers;
  c.state_size = N;
  c.conv_kernel = W;
  c.expand = 2;
  c.time_step_rank = R;
  c.vocab_size = V;
  return c;
}

inline std::vector<uint32_t> RandomTokens(int64_t T, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> out(T);
  for (auto& t : out) t = static_cast<uint32_t>(rng() % static_cast<uint64_t>(V));
  return out;
}

// A loss mask of n tokens that counts every target but those of tokens 0, 3, 6, ...
inline std::vector<uint8_t> EveryThirdLeftOut(size_t n) {
  std::vector<uint8_t> mask(n, 1);
  for (size_t t = 0; t < n; t += 3) mask[t] = 0;
  return mask;
}

// Calls fn(name, a_values, b_values) for every parameter tensor of two same-config models.
template <typename T, typename U, typename Fn>
void ForEachTensor(const ModelParams<T>& a, const ModelParams<U>& b, Fn fn) {
  fn(std::string(kEmbedName), a.embed, b.embed);
  fn(std::string(kNormFName), a.norm_f, b.norm_f);
  if (!a.config.tie_word_embeddings) fn(std::string(kLmHeadName), a.lm_head, b.lm_head);
  const auto& slots_a = LayerParamSlots<T>();
  const auto& slots_b = LayerParamSlots<U>();
  for (size_t k = 0; k < a.layers.size(); ++k)
    for (size_t s = 0; s < slots_a.size(); ++s)
      fn(LayerParamName(k, slots_a[s].suffix), a.layers[k].*slots_a[s].member,
         b.layers[k].*slots_b[s].member);
}

template <typename T, typename U>
double RelErr(const std::vector<T>& a, const std::vector<U>& b) {
  double num = 0, den = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    num += (double(a[k]) - double(b[k])) * (double(a[k]) - double(b[k]));
    den += double(b[k]) * double(b[k]);
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

// The largest per-tensor relative error of a against b; *worst names that tensor.
template <typename T, typename U>
double MaxRelErr(const ModelParams<T>& a, const ModelParams<U>& b, std::string* worst = nullptr) {
  double max = 0;
  ForEachTensor(a, b, [&](const std::string& name, const std::vector<T>& x,
                          const std::vector<U>& y) {
    const double e = RelErr(x, y);
    if (!(e <= max)) {  // also catches NaN
      max = e;
      if (worst) *worst = name;
    }
  });
  return max;
}

// Bitwise equality of two models' tensors (parameters or gradients), naming the first that
// differs.
template <typename T>
::testing::AssertionResult BitwiseEqual(const ModelParams<T>& a, const ModelParams<T>& b) {
  const DType dtype = sizeof(T) == 4 ? DType::kF32 : DType::kF64;
  const TensorMap ta = ParamsToTensors(a, dtype), tb = ParamsToTensors(b, dtype);
  if (ta.size() != tb.size()) return ::testing::AssertionFailure() << "tensor counts differ";
  for (const auto& [name, t] : ta) {
    auto it = tb.find(name);
    if (it == tb.end()) return ::testing::AssertionFailure() << "missing " << name;
    if (t.shape != it->second.shape || t.data != it->second.data) {
      return ::testing::AssertionFailure() << name << " differs";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace adjsh::testing

#endif  // ADJSH_TESTS_KERNELS_TEST_UTIL_H_
