// The block (chunked matrix) form of the Mamba-2 scan (kernels/cpu/mamba2_scan.h), the entries that
// Mamba2Scan* call for Mamba2ScanForm::kBlocks; same arguments.
#ifndef ADJSH_KERNELS_CPU_MAMBA2_SCAN_BLOCKS_H_
#define ADJSH_KERNELS_CPU_MAMBA2_SCAN_BLOCKS_H_

#include "kernels/cpu/mamba2_scan.h"

namespace adjsh::mamba2_blocks {

template <typename T>
void Forward(const Mamba2ScanRows<T>& r, T* S, T* y);

template <typename T>
void Backward(const Mamba2ScanRows<T>& r, const T* S0, const T* dy, T* carry, T* dxbc, T* ddt,
              T* dA, T* dD);

template <typename T>
void Adjoint(const Mamba2ScanRows<T>& r, const T* dy, T* carry);

}  // namespace adjsh::mamba2_blocks

#endif  // ADJSH_KERNELS_CPU_MAMBA2_SCAN_BLOCKS_H_
