// cuTensorMapEncodeTiled (what XLA's autotuner and cuBLAS's sm_90 kernels ask of the driver): a
// 2D float tile map of a device buffer is encoded by oriond, and the driver's requirements are
// enforced, each case refused with CUDA_ERROR_INVALID_VALUE as the driver refuses it: rank 0 and 6,
// a global address not 16-byte aligned, a stride not a multiple of 16, a box dimension of 257, an
// inner box that does not fit its swizzle, NaN fill for an integer type, and a global address that
// is not device memory of the process. cuTensorMapEncodeIm2col (cuDNN's and CUTLASS's sm_90
// convolutions): a 4D NHWC map is encoded, and its own requirements enforced (rank 2, a corner
// offset out of the rank's range, 257 channels, 1025 pixels, channels wider than the swizzle).
// cuTensorMapReplaceAddress moves a map to another buffer and back to the same bytes, and refuses an
// unaligned or host address. Lines: CHECK ... / DONE.
#include <cuda.h>

#include <cstring>
#include <vector>

#include "orion_test.h"

int main() {
  ot::init_output();
  CUDA_OK(cudaSetDevice(0));
  float* d = nullptr;
  const int rows = 64, cols = 128;
  CUDA_OK(cudaMalloc(&d, rows * cols * sizeof(float)));
  CUtensorMap map;  // its type is aligned as the driver needs (64 bytes at least)
  cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  cuuint64_t strides[1] = {cols * sizeof(float)};
  cuuint32_t box[2] = {32, 16};
  cuuint32_t estr[2] = {1, 1};
  auto encode = [&](CUtensorMapDataType t, cuuint32_t rank, void* addr, const cuuint64_t* s, const cuuint32_t* b,
                    CUtensorMapSwizzle sw, CUtensorMapFloatOOBfill fill) {
    std::memset(&map, 0, sizeof map);
    return cuTensorMapEncodeTiled(&map, t, rank, addr, dims, s, b, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
                                  CU_TENSOR_MAP_L2_PROMOTION_L2_128B, fill);
  };
  const auto f32 = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  const auto none = CU_TENSOR_MAP_SWIZZLE_NONE;
  const auto nofill = CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE;
  CUresult r = encode(f32, 2, d, strides, box, CU_TENSOR_MAP_SWIZZLE_128B, nofill);
  bool written = false;
  for (auto w : map.opaque) written |= w != 0;
  ot::check("encode_2d_float_tile", r == CUDA_SUCCESS && written, ot::fmt("%d", static_cast<int>(r)));
  auto refused = [&](const char* name, CUresult got) {
    ot::check(name, got == CUDA_ERROR_INVALID_VALUE, ot::fmt("%d", static_cast<int>(got)));
  };
  refused("rank_0_refused", encode(f32, 0, d, strides, box, none, nofill));
  refused("rank_6_refused", encode(f32, 6, d, strides, box, none, nofill));
  refused("unaligned_address_refused", encode(f32, 2, reinterpret_cast<char*>(d) + 4, strides, box, none, nofill));
  cuuint64_t bad_stride[1] = {cols * sizeof(float) + 4};
  refused("stride_not_multiple_of_16_refused", encode(f32, 2, d, bad_stride, box, none, nofill));
  cuuint32_t big_box[2] = {32, 257};
  refused("box_257_refused", encode(f32, 2, d, strides, big_box, none, nofill));
  cuuint32_t wide_box[2] = {64, 16};  // 256 bytes: more than the 128B swizzle span
  refused("inner_box_wider_than_swizzle_refused",
          encode(f32, 2, d, strides, wide_box, CU_TENSOR_MAP_SWIZZLE_128B, nofill));
  refused("nan_fill_for_integers_refused", encode(CU_TENSOR_MAP_DATA_TYPE_INT32, 2, d, strides, box, none,
                                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA));
  std::vector<float> host(rows * cols + 16);
  void* host_aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(host.data()) + 15) & ~uintptr_t{15});
  refused("host_address_refused", encode(f32, 2, host_aligned, strides, box, none, nofill));

  // im2col: NHWC floats, C = 16, W = H = 8, N = 2 (fits in d's 32 KiB).
  const cuuint64_t nhwc[4] = {16, 8, 8, 2};
  const cuuint64_t nhwc_strides[3] = {16 * 4, 8 * 16 * 4, 8 * 8 * 16 * 4};
  const cuuint32_t estr4[4] = {1, 1, 1, 1};
  auto im2col = [&](cuuint32_t rank, const int* lo, const int* hi, cuuint32_t channels, cuuint32_t pixels,
                    CUtensorMapSwizzle sw) {
    std::memset(&map, 0, sizeof map);
    return cuTensorMapEncodeIm2col(&map, f32, rank, d, nhwc, nhwc_strides, lo, hi, channels, pixels, estr4,
                                   CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, nofill);
  };
  const int lo[2] = {-1, -1}, hi[2] = {-1, -1};
  r = im2col(4, lo, hi, 16, 64, CU_TENSOR_MAP_SWIZZLE_128B);
  written = false;
  for (auto w : map.opaque) written |= w != 0;
  ot::check("im2col_encode_4d_nhwc", r == CUDA_SUCCESS && written, ot::fmt("%d", static_cast<int>(r)));
  refused("im2col_rank_2_refused", im2col(2, lo, hi, 16, 64, none));
  const int far[2] = {-129, 0};
  refused("im2col_corner_out_of_range_refused", im2col(4, far, hi, 16, 64, none));
  refused("im2col_257_channels_refused", im2col(4, lo, hi, 257, 64, none));
  refused("im2col_1025_pixels_refused", im2col(4, lo, hi, 16, 1025, none));
  refused("im2col_channels_wider_than_swizzle_refused", im2col(4, lo, hi, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B));

  // cuTensorMapReplaceAddress.
  float* d2 = nullptr;
  CUDA_OK(cudaMalloc(&d2, rows * cols * sizeof(float)));
  r = encode(f32, 2, d, strides, box, none, nofill);
  const CUtensorMap original = map;
  const CUresult moved = cuTensorMapReplaceAddress(&map, d2);
  const bool differs = std::memcmp(&map, &original, sizeof map) != 0;
  const CUresult back = cuTensorMapReplaceAddress(&map, d);
  ot::check("replace_address_round_trips",
            r == CUDA_SUCCESS && moved == CUDA_SUCCESS && differs && back == CUDA_SUCCESS &&
                std::memcmp(&map, &original, sizeof map) == 0,
            ot::fmt("encode %d, to d2 %d (changed %d), back %d", static_cast<int>(r), static_cast<int>(moved),
                    static_cast<int>(differs), static_cast<int>(back)));
  refused("replace_address_unaligned_refused", cuTensorMapReplaceAddress(&map, reinterpret_cast<char*>(d2) + 4));
  refused("replace_address_host_refused", cuTensorMapReplaceAddress(&map, host_aligned));
  CUDA_OK(cudaFree(d2));
  CUDA_OK(cudaFree(d));
  return ot::finish();
}
