// Layered and cubemap CUDA arrays (issue #20): cudaMalloc3DArray with cudaArrayLayered /
// cudaArrayCubemap, filled with cudaMemcpy3D, read by tex1DLayered / tex2DLayered (point and
// linear), texCubemap and texCubemapLayered, and written by surf2DLayeredwrite. Every value a kernel
// returns is computed by the sim's executor and checked against a reference computed here (the
// cubemap's face selection from CUDA C++ Programming Guide, "Cubemap Textures"). Lines: CHECK / DONE.
#include <cmath>
#include <vector>

#include "orion_test.h"

__global__ void read2d_layered(cudaTextureObject_t t, float* out, int w, int h, float dx) {
  int x = threadIdx.x, y = threadIdx.y, layer = blockIdx.x;
  out[(layer * h + y) * w + x] = tex2DLayered<float>(t, x + dx, y + 0.5f, layer);
}
__global__ void read1d_layered(cudaTextureObject_t t, float* out, int w) {
  int x = threadIdx.x, layer = blockIdx.x;
  out[layer * w + x] = tex1DLayered<float>(t, x + 0.5f, layer);
}
__global__ void read_cube(cudaTextureObject_t t, const float3* dirs, float* out, int n, int layer) {
  int i = threadIdx.x;
  if (i < n) {
    float3 d = dirs[i];
    out[i] = layer < 0 ? texCubemap<float>(t, d.x, d.y, d.z) : texCubemapLayered<float>(t, d.x, d.y, d.z, layer);
  }
}
__global__ void write2d_layered(cudaSurfaceObject_t s, int w, int h) {
  int x = threadIdx.x, y = threadIdx.y, layer = blockIdx.x;
  float v = surf2DLayeredread<float>(s, x * (int)sizeof(float), y, layer);
  surf2DLayeredwrite(v * 2.0f + layer, s, x * (int)sizeof(float), y, layer);
}

#define CK(e)                                                                                           \
  do {                                                                                                  \
    cudaError_t err_ = (e);                                                                             \
    if (err_ != cudaSuccess) {                                                                          \
      printf("CUDA_ERROR %s %d %s:%d %s\n", cudaGetErrorName(err_), (int)err_, __FILE__, __LINE__, #e); \
      return 2;                                                                                         \
    }                                                                                                   \
  } while (0)

static cudaTextureObject_t TexOf(cudaArray_t a, cudaTextureFilterMode filter) {
  cudaResourceDesc rd{};
  rd.resType = cudaResourceTypeArray;
  rd.res.array.array = a;
  cudaTextureDesc td{};
  td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = cudaAddressModeClamp;
  td.filterMode = filter;
  td.readMode = cudaReadModeElementType;
  cudaTextureObject_t t = 0;
  if (cudaCreateTextureObject(&t, &rd, &td, nullptr) != cudaSuccess) return 0;
  return t;
}
static cudaError_t Upload(cudaArray_t a, const std::vector<float>& h, int w, int rows, int slices) {
  cudaMemcpy3DParms p{};
  p.srcPtr = make_cudaPitchedPtr(const_cast<float*>(h.data()), w * sizeof(float), w, rows);
  p.dstArray = a;
  p.extent = make_cudaExtent(w, rows, slices);
  p.kind = cudaMemcpyHostToDevice;
  return cudaMemcpy3D(&p);
}
static std::string FirstBad(const std::vector<float>& got, const std::vector<float>& want) {
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) return ot::fmt("element %zu is %g, want %g", i, got[i], want[i]);
  return "";
}

// The texel a cube fetch of direction (x, y, z) reads on a face of `size` x `size` (point sampling):
// the major axis picks the face; (s/m + 1) / 2 and (t/m + 1) / 2 the point on it.
static int CubeTexel(float x, float y, float z, int size, int* face) {
  float ax = std::fabs(x), ay = std::fabs(y), az = std::fabs(z), s, t, m;
  if (ax >= ay && ax >= az) {
    *face = x >= 0 ? 0 : 1, s = x >= 0 ? -z : z, t = -y, m = ax;
  } else if (ay >= az) {
    *face = y >= 0 ? 2 : 3, s = x, t = y >= 0 ? z : -z, m = ay;
  } else {
    *face = z >= 0 ? 4 : 5, s = z >= 0 ? x : -x, t = -y, m = az;
  }
  auto idx = [&](float c) { return std::min(size - 1, std::max(0, (int)std::floor((c / m + 1.0f) * 0.5f * size))); };
  return idx(t) * size + idx(s);
}

int main() {
  ot::init_output();
  CK(cudaSetDevice(0));
  cudaChannelFormatDesc fdesc = cudaCreateChannelDesc<float>();

  // ---- 2D layered: 8 x 4 texels x 3 layers, texel = layer * 100 + y * 10 + x.
  const int W = 8, H = 4, L = 3;
  std::vector<float> h2(W * H * L);
  for (int l = 0; l < L; ++l)
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x) h2[(l * H + y) * W + x] = l * 100 + y * 10 + x;
  cudaArray_t a2 = nullptr;
  CK(cudaMalloc3DArray(&a2, &fdesc, make_cudaExtent(W, H, L), cudaArrayLayered | cudaArraySurfaceLoadStore));
  cudaExtent ext{};
  cudaChannelFormatDesc got_desc{};
  unsigned flags = 0;
  CK(cudaArrayGetInfo(&got_desc, &ext, &flags, a2));
  ot::check("layered_array_info", ext.width == W && ext.height == H && ext.depth == L && (flags & cudaArrayLayered),
            ot::fmt("%zux%zux%zu flags %#x", ext.width, ext.height, ext.depth, flags));
  CK(Upload(a2, h2, W, H, L));
  float* out = nullptr;
  CK(cudaMalloc(&out, W * H * L * sizeof(float) * 4));
  std::vector<float> got(W * H * L);
  cudaTextureObject_t tp = TexOf(a2, cudaFilterModePoint), tl = TexOf(a2, cudaFilterModeLinear);
  read2d_layered<<<L, dim3(W, H)>>>(tp, out, W, H, 0.5f);
  CK(cudaMemcpy(got.data(), out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
  std::string why = FirstBad(got, h2);
  ot::check_kernel("tex2d_layered_point", why.empty(), why);
  // Linear, halfway between texels x and x+1 (clamped at the last): the mean, exact in float.
  std::vector<float> want(h2.size());
  for (int l = 0; l < L; ++l)
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x)
        want[(l * H + y) * W + x] = (h2[(l * H + y) * W + x] + h2[(l * H + y) * W + std::min(x + 1, W - 1)]) / 2;
  read2d_layered<<<L, dim3(W, H)>>>(tl, out, W, H, 1.0f);
  CK(cudaMemcpy(got.data(), out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
  why = FirstBad(got, want);
  ot::check_kernel("tex2d_layered_linear", why.empty(), why);

  // ---- Surface: each texel of each layer becomes v * 2 + layer, read back with a copy.
  cudaResourceDesc sd{};
  sd.resType = cudaResourceTypeArray;
  sd.res.array.array = a2;
  cudaSurfaceObject_t surf = 0;
  CK(cudaCreateSurfaceObject(&surf, &sd));
  write2d_layered<<<L, dim3(W, H)>>>(surf, W, H);
  CK(cudaDeviceSynchronize());
  std::vector<float> back(h2.size());
  cudaMemcpy3DParms p{};
  p.srcArray = a2;
  p.dstPtr = make_cudaPitchedPtr(back.data(), W * sizeof(float), W, H);
  p.extent = make_cudaExtent(W, H, L);
  p.kind = cudaMemcpyDeviceToHost;
  CK(cudaMemcpy3D(&p));
  for (int i = 0; i < W * H * L; ++i) want[i] = h2[i] * 2 + i / (W * H);
  why = FirstBad(back, want);
  ot::check_kernel("surf2d_layered_read_write", why.empty(), why);

  // ---- 1D layered: 16 texels x 4 layers (Height 0).
  const int W1 = 16, L1 = 4;
  std::vector<float> h1(W1 * L1);
  for (int i = 0; i < W1 * L1; ++i) h1[i] = 1000 + i;
  cudaArray_t a1 = nullptr;
  CK(cudaMalloc3DArray(&a1, &fdesc, make_cudaExtent(W1, 0, L1), cudaArrayLayered));
  CK(Upload(a1, h1, W1, 1, L1));
  cudaTextureObject_t t1 = TexOf(a1, cudaFilterModePoint);
  read1d_layered<<<L1, W1>>>(t1, out, W1);
  std::vector<float> got1(h1.size());
  CK(cudaMemcpy(got1.data(), out, got1.size() * sizeof(float), cudaMemcpyDeviceToHost));
  why = FirstBad(got1, h1);
  ot::check_kernel("tex1d_layered_point", why.empty(), why);

  // ---- Cubemap: 4 x 4 faces, texel = (layer * 6 + face) * 100 + y * 10 + x; 2 layers for the
  // layered one. Directions: the six axes, and points off the centres of faces.
  const int S = 4;
  std::vector<float3> dirs = {{1, 0, 0},        {-1, 0, 0},        {0, 1, 0},         {0, -1, 0},
                              {0, 0, 1},        {0, 0, -1},        {1, 0.5f, -0.25f}, {-2, -1.5f, 1},
                              {0.3f, 1, -0.9f}, {0.2f, -0.7f, -1}, {-0.6f, 0.1f, 1},  {0.99f, -0.2f, 0.98f}};
  const int n = static_cast<int>(dirs.size());
  float3* ddirs = nullptr;
  CK(cudaMalloc(&ddirs, n * sizeof(float3)));
  CK(cudaMemcpy(ddirs, dirs.data(), n * sizeof(float3), cudaMemcpyHostToDevice));
  for (int layers : {0, 2}) {
    const int faces = 6 * (layers == 0 ? 1 : layers);
    std::vector<float> hc(S * S * faces);
    for (int f = 0; f < faces; ++f)
      for (int i = 0; i < S * S; ++i) hc[f * S * S + i] = f * 100 + (i / S) * 10 + i % S;
    cudaArray_t ac = nullptr;
    CK(cudaMalloc3DArray(&ac, &fdesc, make_cudaExtent(S, S, faces),
                         layers == 0 ? cudaArrayCubemap : cudaArrayCubemap | cudaArrayLayered));
    CK(Upload(ac, hc, S, S, faces));
    cudaTextureObject_t tc = TexOf(ac, cudaFilterModePoint);
    const int layer = layers == 0 ? -1 : 1;
    read_cube<<<1, 32>>>(tc, ddirs, out, n, layer);
    std::vector<float> gc(n), wc(n);
    CK(cudaMemcpy(gc.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) {
      int face = 0;
      const int t = CubeTexel(dirs[i].x, dirs[i].y, dirs[i].z, S, &face);
      wc[i] = hc[((layer < 0 ? 0 : layer) * 6 + face) * S * S + t];
    }
    why = FirstBad(gc, wc);
    ot::check_kernel(layers == 0 ? "tex_cubemap_faces" : "tex_cubemap_layered", why.empty(), why);
    CK(cudaDestroyTextureObject(tc));
    CK(cudaFreeArray(ac));
  }

  // ---- What does not fit is refused: a cubemap of non-square faces, a layered array of no layers.
  cudaArray_t bad = nullptr;
  cudaError_t e1 = cudaMalloc3DArray(&bad, &fdesc, make_cudaExtent(4, 8, 6), cudaArrayCubemap);
  cudaError_t e2 = cudaMalloc3DArray(&bad, &fdesc, make_cudaExtent(4, 8, 0), cudaArrayLayered);
  ot::check("bad_layered_and_cubemap_arrays_refused", e1 != cudaSuccess && e2 != cudaSuccess,
            ot::fmt("%s, %s", cudaGetErrorName(e1), cudaGetErrorName(e2)));
  (void)cudaGetLastError();
  CK(cudaDestroySurfaceObject(surf));
  CK(cudaDestroyTextureObject(tp));
  CK(cudaDestroyTextureObject(tl));
  CK(cudaDestroyTextureObject(t1));
  CK(cudaFreeArray(a2));
  CK(cudaFreeArray(a1));
  CK(cudaFree(out));
  CK(cudaFree(ddirs));
  return ot::finish();
}
