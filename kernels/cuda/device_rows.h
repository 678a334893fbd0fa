// The memory of a resident span on one GPU (kernels/row_space.h's device space, made by the
// CUDA backend): plain C++ over the device's Context, so that kernels/cuda/cuda_backend.cc needs
// no CUDA headers. Every call is queued on the device's stream in order with the blocks' calls
// and counted by its Context (copies, allocations, the one sync of Finish); Download's values
// are on the host after Finish. Thread-safe (the Context's mutex).
#ifndef ADJSH_KERNELS_CUDA_DEVICE_ROWS_H_
#define ADJSH_KERNELS_CUDA_DEVICE_ROWS_H_

#include <cstddef>
#include <cstdint>

namespace adjsh::cuda {

float* RowsAlloc(int device, size_t n);
void RowsFree(int device, float* p, size_t n);  // nothing queued may use p (RowsFinish first)
// n floats of pinned host memory mapped into the device's address space (the same address on
// both sides): the device's kernels and copies read and write it in place, over PCIe. For rows
// past the device budget (device_row_space.h DeviceRowSpace).
float* RowsAllocMapped(int device, size_t n);
void RowsFreeMapped(int device, float* p);  // as RowsFree
// The device memory free now (cudaMemGetInfo).
size_t RowsFreeBytes(int device);
void RowsUpload(int device, float* dst, const float* host_src, size_t n);
void RowsDownload(int device, float* host_dst, const float* src, size_t n);
void RowsCopy(int device, float* dst, const float* src, size_t n);
void RowsAdd(int device, float* dst, const float* src, size_t n);  // dst += src
void RowsZero(int device, float* dst, size_t n);
void RowsMarkNonFinite(int device, float* flag, const float* src, size_t n);  // ops.h's
void RowsWidenIds(int device, float* ids, const float* packed, size_t n);      // ops.h WidenIds
void RowsFinish(int device);  // the host waits for the device's stream (and copies ahead)
// n floats of mapped rows (src) to device memory (dst) on the device's second stream, after
// everything queued so far (Context::CopyAhead): a ticket for RowsAwait (the stream's later
// work waits for the copy) or RowsDrop (nothing will read it).
uint64_t RowsCopyAhead(int device, float* dst, const float* src, size_t n);
void RowsAwait(int device, uint64_t ticket);
void RowsDrop(int device, uint64_t ticket);

}  // namespace adjsh::cuda

#endif  // ADJSH_KERNELS_CUDA_DEVICE_ROWS_H_
