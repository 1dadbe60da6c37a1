// CUDA arrays, textures and surfaces through the runtime API, as programs use them
// (cudaMallocArray, cudaMalloc3DArray, cudaMemcpy2DToArray / FromArray / ArrayToArray, cudaMemcpy3D,
// cudaCreateTextureObject, cudaCreateSurfaceObject, tex1Dfetch / tex2D / tex3D, surf2Dread /
// surf2Dwrite). Every value a kernel returns is computed (the sim backend runs the PTX) and checked
// against a reference computed here. Also: an array counts against the vGPU's quota, and what Orion
// does not serve (texture-gather arrays) is refused with an error, not ignored.
#include <cmath>

#include "orion_test.h"

__global__ void read2d(cudaTextureObject_t t, float* out, int w, int h, float dx, float dy) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) out[y * w + x] = tex2D<float>(t, x + dx, y + dy);
}
__global__ void read2d_norm(cudaTextureObject_t t, float* out, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  // One whole period further: with wrap addressing the same texel.
  if (x < w && y < h) out[y * w + x] = tex2D<float>(t, (x + 0.5f) / w + 1.0f, (y + 0.5f) / h);
}
__global__ void read_rgba(cudaTextureObject_t t, float4* out, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) out[y * w + x] = tex2D<float4>(t, x + 0.5f, y + 0.5f);
}
__global__ void fetch1d(cudaTextureObject_t t, int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex1Dfetch<int>(t, i);
}
__global__ void read3d(cudaTextureObject_t t, float* out, int w, int h, int d) {
  int x = threadIdx.x, y = threadIdx.y, z = blockIdx.x;
  if (x < w && y < h && z < d) out[(z * h + y) * w + x] = tex3D<float>(t, x + 0.5f, y + 0.5f, z + 0.5f);
}
__global__ void surf_square(cudaSurfaceObject_t s, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) {
    float v = surf2Dread<float>(s, x * (int)sizeof(float), y);
    surf2Dwrite(v * v + 1.0f, s, x * (int)sizeof(float), y);
  }
}

#define CK(e)                                                                                       \
  do {                                                                                              \
    cudaError_t _e = (e);                                                                           \
    if (_e != cudaSuccess) {                                                                        \
      printf("CUDA_ERROR %s %d %s:%d %s\n", cudaGetErrorName(_e), (int)_e, __FILE__, __LINE__, #e); \
      exit(2);                                                                                      \
    }                                                                                               \
  } while (0)

static cudaTextureObject_t MakeTex(cudaArray_t a, cudaTextureFilterMode filter, cudaTextureAddressMode mode,
                                   bool normalized, cudaTextureReadMode read = cudaReadModeElementType) {
  cudaResourceDesc rd{};
  rd.resType = cudaResourceTypeArray;
  rd.res.array.array = a;
  cudaTextureDesc td{};
  td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = mode;
  td.filterMode = filter;
  td.readMode = read;
  td.normalizedCoords = normalized;
  cudaTextureObject_t t = 0;
  CK(cudaCreateTextureObject(&t, &rd, &td, nullptr));
  return t;
}

int main() {
  ot::init_output();
  const int W = 37, H = 23;
  std::vector<float> img(W * H);
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) img[y * W + x] = (float)(x * 3 + y * 100) + 0.25f;

  // ---- Copies: host -> array -> host, a sub-box, array -> array, device <-> array.
  cudaChannelFormatDesc fdesc = cudaCreateChannelDesc<float>();
  cudaArray_t a = nullptr, b = nullptr;
  CK(cudaMallocArray(&a, &fdesc, W, H, cudaArraySurfaceLoadStore));
  CK(cudaMallocArray(&b, &fdesc, W, H));
  CK(cudaMemcpy2DToArray(a, 0, 0, img.data(), W * sizeof(float), W * sizeof(float), H, cudaMemcpyHostToDevice));
  std::vector<float> back(W * H, -1.0f);
  CK(cudaMemcpy2DFromArray(back.data(), W * sizeof(float), a, 0, 0, W * sizeof(float), H, cudaMemcpyDeviceToHost));
  ot::check("array_host_round_trip", back == img, ot::diff_details(back.data(), img.data(), back.size() * 4));
  // A 5x4 box at (x=6, y=3) of a, into b at (x=1, y=2).
  CK(cudaMemcpy2DArrayToArray(b, 1 * sizeof(float), 2, a, 6 * sizeof(float), 3, 5 * sizeof(float), 4));
  std::vector<float> box(5 * 4, -1.0f), want_box(5 * 4);
  CK(cudaMemcpy2DFromArray(box.data(), 5 * sizeof(float), b, 1 * sizeof(float), 2, 5 * sizeof(float), 4,
                           cudaMemcpyDeviceToHost));
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 5; ++x) want_box[y * 5 + x] = img[(y + 3) * W + (x + 6)];
  ot::check("array_to_array_box", box == want_box, ot::diff_details(box.data(), want_box.data(), box.size() * 4));
  float* dev = nullptr;
  size_t pitch = 0;
  CK(cudaMallocPitch(&dev, &pitch, W * sizeof(float), H));
  CK(cudaMemcpy2DFromArray(dev, pitch, a, 0, 0, W * sizeof(float), H, cudaMemcpyDeviceToDevice));
  std::vector<float> via_dev(W * H, -1.0f);
  CK(cudaMemcpy2D(via_dev.data(), W * sizeof(float), dev, pitch, W * sizeof(float), H, cudaMemcpyDeviceToHost));
  ot::check("array_to_device", via_dev == img, ot::diff_details(via_dev.data(), img.data(), img.size() * 4));
  CK(cudaMemset2D(dev, pitch, 0, W * sizeof(float), H));
  CK(cudaMemcpy2DToArray(b, 0, 0, dev, pitch, W * sizeof(float), H, cudaMemcpyDeviceToDevice));
  CK(cudaMemcpy2DFromArray(back.data(), W * sizeof(float), b, 0, 0, W * sizeof(float), H, cudaMemcpyDeviceToHost));
  bool zeros = true;
  for (float v : back) zeros &= v == 0.0f;
  ot::check("device_to_array", zeros);
  // Out of the array's bounds: an error, nothing copied.
  cudaError_t oob = cudaMemcpy2DToArray(a, 30 * sizeof(float), 0, img.data(), W * sizeof(float), 8 * sizeof(float), 1,
                                        cudaMemcpyHostToDevice);
  ot::check("array_copy_out_of_bounds_refused", oob != cudaSuccess, cudaGetErrorName(oob));
  (void)cudaGetLastError();

  // ---- 3D: cudaMemcpy3D of a sub-box both ways.
  const int X = 9, Y = 7, Z = 5;
  cudaArray_t v = nullptr;
  CK(cudaMalloc3DArray(&v, &fdesc, make_cudaExtent(X, Y, Z)));
  std::vector<float> vol(X * Y * Z);
  for (int i = 0; i < X * Y * Z; ++i) vol[i] = (float)i * 0.5f;
  cudaMemcpy3DParms up{};
  up.srcPtr = make_cudaPitchedPtr(vol.data(), X * sizeof(float), X, Y);
  up.dstArray = v;
  up.extent = make_cudaExtent(X, Y, Z);
  up.kind = cudaMemcpyHostToDevice;
  CK(cudaMemcpy3D(&up));
  std::vector<float> sub(3 * 2 * 2, -1.0f), want_sub(3 * 2 * 2);
  cudaMemcpy3DParms down{};
  down.srcArray = v;
  down.srcPos = make_cudaPos(4, 3, 2);
  down.dstPtr = make_cudaPitchedPtr(sub.data(), 3 * sizeof(float), 3, 2);
  down.extent = make_cudaExtent(3, 2, 2);
  down.kind = cudaMemcpyDeviceToHost;
  CK(cudaMemcpy3D(&down));
  for (int z = 0; z < 2; ++z)
    for (int y = 0; y < 2; ++y)
      for (int x = 0; x < 3; ++x) want_sub[(z * 2 + y) * 3 + x] = vol[((z + 2) * Y + (y + 3)) * X + (x + 4)];
  ot::check("array3d_sub_box", sub == want_sub, ot::diff_details(sub.data(), want_sub.data(), sub.size() * 4));

  // ---- Textures: point sampling, linear filtering, normalized + wrap, 8-bit normalized reads,
  // linear memory, 3D.
  float* out = nullptr;
  CK(cudaMalloc(&out, W * H * sizeof(float)));
  dim3 blk(8, 8), grd((W + 7) / 8, (H + 7) / 8);
  cudaTextureObject_t tp = MakeTex(a, cudaFilterModePoint, cudaAddressModeClamp, false);
  read2d<<<grd, blk>>>(tp, out, W, H, 0.5f, 0.5f);
  CK(cudaGetLastError());
  std::vector<float> got(W * H);
  CK(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
  ot::check_kernel("tex2d_point", got == img, ot::diff_details(got.data(), img.data(), img.size() * 4));
  // Clamp: one texel left of the image reads its first column.
  read2d<<<grd, blk>>>(tp, out, W, H, -0.5f, 0.5f);
  CK(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
  bool clamp_ok = true;
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) clamp_ok &= got[y * W + x] == img[y * W + (x == 0 ? 0 : x - 1)];
  ot::check_kernel("tex2d_clamp", clamp_ok);
  cudaTextureObject_t tl = MakeTex(a, cudaFilterModeLinear, cudaAddressModeClamp, false);
  read2d<<<grd, blk>>>(tl, out, W, H, 1.0f, 0.5f);  // halfway between texels x and x+1
  CK(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      const float want = 0.5f * (img[y * W + x] + img[y * W + std::min(x + 1, W - 1)]);
      worst = std::max(worst, (double)std::fabs(got[y * W + x] - want) / std::max(1.0f, std::fabs(want)));
    }
  ot::check_kernel("tex2d_linear", worst < 1e-2, ot::fmt("worst relative error %g", worst));
  cudaTextureObject_t tw = MakeTex(a, cudaFilterModePoint, cudaAddressModeWrap, true);
  read2d_norm<<<grd, blk>>>(tw, out, W, H);
  CK(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
  ot::check_kernel("tex2d_normalized_wrap", got == img, ot::diff_details(got.data(), img.data(), img.size() * 4));

  cudaChannelFormatDesc u4 = cudaCreateChannelDesc<uchar4>();
  cudaArray_t rgba = nullptr;
  CK(cudaMallocArray(&rgba, &u4, W, H));
  std::vector<uchar4> px(W * H);
  for (int i = 0; i < W * H; ++i) px[i] = make_uchar4(i % 256, (i * 7) % 256, 255, 0);
  CK(cudaMemcpy2DToArray(rgba, 0, 0, px.data(), W * 4, W * 4, H, cudaMemcpyHostToDevice));
  cudaTextureObject_t tn = MakeTex(rgba, cudaFilterModePoint, cudaAddressModeClamp, false, cudaReadModeNormalizedFloat);
  float4* out4 = nullptr;
  CK(cudaMalloc(&out4, W * H * sizeof(float4)));
  read_rgba<<<grd, blk>>>(tn, out4, W, H);
  std::vector<float4> got4(W * H);
  CK(cudaMemcpy(got4.data(), out4, got4.size() * sizeof(float4), cudaMemcpyDeviceToHost));
  bool norm_ok = true;
  for (int i = 0; i < W * H; ++i) {
    norm_ok &= std::fabs(got4[i].x - px[i].x / 255.0f) < 1e-6f && std::fabs(got4[i].y - px[i].y / 255.0f) < 1e-6f &&
               got4[i].z == 1.0f && got4[i].w == 0.0f;
  }
  ot::check_kernel("tex2d_uchar4_normalized_float", norm_ok,
                   ot::fmt("texel 1: %g %g %g %g", got4[1].x, got4[1].y, got4[1].z, got4[1].w));

  const int N = 1000;
  std::vector<int> ints(N);
  for (int i = 0; i < N; ++i) ints[i] = i * i - 7;
  int *lin = nullptr, *lout = nullptr;
  CK(cudaMalloc(&lin, N * sizeof(int)));
  CK(cudaMalloc(&lout, N * sizeof(int)));
  CK(cudaMemcpy(lin, ints.data(), N * sizeof(int), cudaMemcpyHostToDevice));
  cudaResourceDesc lr{};
  lr.resType = cudaResourceTypeLinear;
  lr.res.linear.devPtr = lin;
  lr.res.linear.desc = cudaCreateChannelDesc<int>();
  lr.res.linear.sizeInBytes = N * sizeof(int);
  cudaTextureDesc ltd{};
  ltd.readMode = cudaReadModeElementType;
  cudaTextureObject_t t1 = 0;
  CK(cudaCreateTextureObject(&t1, &lr, &ltd, nullptr));
  fetch1d<<<(N + 255) / 256, 256>>>(t1, lout, N);
  std::vector<int> gi(N);
  CK(cudaMemcpy(gi.data(), lout, N * sizeof(int), cudaMemcpyDeviceToHost));
  ot::check_kernel("tex1dfetch_linear", gi == ints, ot::diff_details(gi.data(), ints.data(), N * 4));

  cudaTextureObject_t t3 = MakeTex(v, cudaFilterModePoint, cudaAddressModeClamp, false);
  float* o3 = nullptr;
  CK(cudaMalloc(&o3, X * Y * Z * sizeof(float)));
  read3d<<<Z, dim3(X, Y)>>>(t3, o3, X, Y, Z);
  std::vector<float> g3(X * Y * Z);
  CK(cudaMemcpy(g3.data(), o3, g3.size() * 4, cudaMemcpyDeviceToHost));
  ot::check_kernel("tex3d_point", g3 == vol, ot::diff_details(g3.data(), vol.data(), vol.size() * 4));

  // ---- Surfaces: read, compute, write in place; the host reads the array back.
  cudaResourceDesc sr{};
  sr.resType = cudaResourceTypeArray;
  sr.res.array.array = a;
  cudaSurfaceObject_t s = 0;
  CK(cudaCreateSurfaceObject(&s, &sr));
  surf_square<<<grd, blk>>>(s, W, H);
  CK(cudaGetLastError());
  CK(cudaMemcpy2DFromArray(back.data(), W * sizeof(float), a, 0, 0, W * sizeof(float), H, cudaMemcpyDeviceToHost));
  std::vector<float> sq(W * H);
  for (int i = 0; i < W * H; ++i) sq[i] = img[i] * img[i] + 1.0f;
  ot::check_kernel("surf2d_read_write", back == sq, ot::diff_details(back.data(), sq.data(), sq.size() * 4));
  // A surface needs an array made for load/store.
  cudaResourceDesc sb{};
  sb.resType = cudaResourceTypeArray;
  sb.res.array.array = b;
  cudaSurfaceObject_t bad_s = 0;
  cudaError_t se = cudaCreateSurfaceObject(&bad_s, &sb);
  ot::check("surface_needs_ldst_array", se != cudaSuccess, cudaGetErrorName(se));
  (void)cudaGetLastError();

  // ---- Quota: an array is charged like an allocation; one larger than what is left is refused.
  size_t free0 = 0, total = 0, free1 = 0;
  CK(cudaMemGetInfo(&free0, &total));
  cudaArray_t big = nullptr;
  cudaChannelFormatDesc f4 = cudaCreateChannelDesc<float4>();
  CK(cudaMallocArray(&big, &f4, 4096, 256));  // 16 MiB
  CK(cudaMemGetInfo(&free1, &total));
  ot::check("array_counts_in_quota", free0 - free1 >= (size_t)4096 * 256 * 16,
            ot::fmt("free %zu -> %zu", free0, free1));
  CK(cudaFreeArray(big));
  size_t free2 = 0;
  CK(cudaMemGetInfo(&free2, &total));
  ot::check("array_free_returns_quota", free2 == free0, ot::fmt("free %zu -> %zu", free0, free2));
  cudaArray_t huge = nullptr;
  cudaError_t he = cudaMalloc3DArray(&huge, &f4, make_cudaExtent(16384, 16384, 16));  // 64 GiB
  ot::check("array_over_quota_refused", he == cudaErrorMemoryAllocation, cudaGetErrorName(he));
  (void)cudaGetLastError();
  cudaArray_t gather = nullptr;  // layered and cubemap arrays: arrays_layered.cu
  cudaError_t le = cudaMalloc3DArray(&gather, &fdesc, make_cudaExtent(16, 16, 0), cudaArrayTextureGather);
  ot::check("texture_gather_array_refused", le != cudaSuccess, cudaGetErrorName(le));
  (void)cudaGetLastError();

  // ---- Mipmapped arrays: each level an array (copies, textures); the whole counts in the quota.
  const int MW = 16, MH = 8, LEVELS = 4;
  cudaMipmappedArray_t mm = nullptr;
  CK(cudaMemGetInfo(&free0, &total));
  CK(cudaMallocMipmappedArray(&mm, &fdesc, make_cudaExtent(MW, MH, 0), LEVELS));
  CK(cudaMemGetInfo(&free1, &total));
  bool levels_ok = true;
  size_t level_bytes = 0;
  for (int l = 0; l < LEVELS; ++l) {
    cudaArray_t lv = nullptr;
    CK(cudaGetMipmappedArrayLevel(&lv, mm, l));
    cudaChannelFormatDesc ld{};
    cudaExtent ext{};
    CK(cudaArrayGetInfo(&ld, &ext, nullptr, lv));
    const int w = std::max(MW >> l, 1), h = std::max(MH >> l, 1);
    levels_ok &= (int)ext.width == w && (int)ext.height == h;
    level_bytes += (size_t)w * h * sizeof(float);
    std::vector<float> src(w * h), dst(w * h, -1.0f);
    for (int i = 0; i < w * h; ++i) src[i] = (float)(l * 1000 + i);
    CK(cudaMemcpy2DToArray(lv, 0, 0, src.data(), w * sizeof(float), w * sizeof(float), h, cudaMemcpyHostToDevice));
    CK(cudaMemcpy2DFromArray(dst.data(), w * sizeof(float), lv, 0, 0, w * sizeof(float), h, cudaMemcpyDeviceToHost));
    levels_ok &= dst == src;
  }
  ot::check("mipmap_levels_copy", levels_ok);
  ot::check("mipmap_counts_in_quota", free0 - free1 >= level_bytes, ot::fmt("free %zu -> %zu", free0, free1));
  // A texture on one level samples that level.
  cudaArray_t lv1 = nullptr;
  CK(cudaGetMipmappedArrayLevel(&lv1, mm, 1));
  cudaTextureObject_t tl1 = MakeTex(lv1, cudaFilterModePoint, cudaAddressModeClamp, false);
  read2d<<<1, dim3(MW / 2, MH / 2)>>>(tl1, out, MW / 2, MH / 2, 0.5f, 0.5f);
  CK(cudaMemcpy(got.data(), out, (MW / 2) * (MH / 2) * sizeof(float), cudaMemcpyDeviceToHost));
  bool lvl_ok = true;
  for (int i = 0; i < (MW / 2) * (MH / 2); ++i) lvl_ok &= got[i] == (float)(1000 + i);
  ot::check_kernel("tex_on_mipmap_level", lvl_ok, ot::fmt("got[3]=%g", got[3]));
  // A texture object on the mipmapped array itself.
  cudaResourceDesc mr{};
  mr.resType = cudaResourceTypeMipmappedArray;
  mr.res.mipmap.mipmap = mm;
  cudaTextureDesc mtd{};
  mtd.addressMode[0] = mtd.addressMode[1] = cudaAddressModeClamp;
  mtd.filterMode = cudaFilterModePoint;
  mtd.mipmapFilterMode = cudaFilterModePoint;
  mtd.normalizedCoords = 1;
  mtd.maxMipmapLevelClamp = LEVELS - 1;
  cudaTextureObject_t tm = 0;
  CK(cudaCreateTextureObject(&tm, &mr, &mtd, nullptr));
  ot::check("mipmap_level_not_freeable", cudaFreeArray(lv1) != cudaSuccess);
  (void)cudaGetLastError();
  CK(cudaDestroyTextureObject(tl1));
  CK(cudaDestroyTextureObject(tm));
  CK(cudaFreeMipmappedArray(mm));
  CK(cudaMemGetInfo(&free2, &total));
  ot::check("mipmap_free_returns_quota", free2 == free0, ot::fmt("free %zu -> %zu", free0, free2));

  CK(cudaDestroySurfaceObject(s));
  for (cudaTextureObject_t t : {tp, tl, tw, tn, t1, t3}) CK(cudaDestroyTextureObject(t));
  for (cudaArray_t x : {a, b, v, rgba}) CK(cudaFreeArray(x));
  cudaError_t twice = cudaFreeArray(a);
  ot::check("array_freed_twice_refused", twice != cudaSuccess, cudaGetErrorName(twice));
  (void)cudaGetLastError();
  return ot::finish();
}
