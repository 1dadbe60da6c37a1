// CUDA IPC between two processes (two sessions of one oriond): `ipc producer` fills an allocation
// with a kernel, records an interprocess event, prints both handles as hex on a HANDLES line and
// waits for a line on stdin; `ipc consumer <mem hex> <event hex>` opens them, waits on the event,
// checks the producer's values, adds 7 with its own kernel and closes the memory; the producer
// then checks it sees the consumer's values. Forged handles are refused. Lines: CHECK ... / DONE.
//
// `ipc producer-late` / `ipc consumer-late <mem hex> <event hex>` (cuda-samples simpleIPC's order):
// the handles are exchanged before any work; the consumer says READY, the producer then launches a
// slow kernel, records the event and says RECORDED at once (no synchronizing call), and the
// consumer, on RECORDED, synchronizes with the imported event and must read the kernel's values.
#include <cstdlib>
#include <string>

#include "orion_test.h"

__global__ void fill(int* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = 3 * i;
}
__global__ void add(int* p, int n, int v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += v;
}

static const int N = 1 << 16;

// Spins about 100 ms (device clock; the sim's follows host time) before filling 5 * i.
__global__ void slow_fill(int* p, int n) {
  if (threadIdx.x == 0) {
    const long long t0 = clock64();
    while (clock64() - t0 < 200000000LL) {
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) p[i] = 5 * i;
}

static bool ReadLine(const char* want) {
  char line[64];
  return fgets(line, sizeof line, stdin) != nullptr && strncmp(line, want, strlen(want)) == 0;
}

static std::string Hex(const void* p, size_t n) { return ot::hex(p, n); }
static bool Unhex(const char* s, void* out, size_t n) {
  if (strlen(s) != 2 * n) return false;
  auto* b = static_cast<uint8_t*>(out);
  for (size_t i = 0; i < n; ++i) {
    unsigned v = 0;
    if (sscanf(s + 2 * i, "%2x", &v) != 1) return false;
    b[i] = static_cast<uint8_t>(v);
  }
  return true;
}
static bool AllEqual(const std::vector<int>& h, int plus) {
  for (int i = 0; i < N; ++i)
    if (h[i] != 3 * i + plus) return false;
  return true;
}

int main(int argc, char** argv) {
  ot::init_output();
  const std::string mode = argc > 1 ? argv[1] : "";
  CUDA_OK(cudaSetDevice(0));
  std::vector<int> h(N);
  if (mode == "producer") {
    int* d = nullptr;
    CUDA_OK(cudaMalloc(&d, N * sizeof(int)));
    fill<<<N / 256, 256>>>(d, N);
    cudaEvent_t ev;
    CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess));
    CUDA_OK(cudaEventRecord(ev, 0));
    cudaIpcMemHandle_t mh;
    cudaIpcEventHandle_t eh;
    CUDA_OK(cudaIpcGetMemHandle(&mh, d + 100));  // any pointer inside: the allocation is exported
    CUDA_OK(cudaIpcGetEventHandle(&eh, ev));
    cudaEvent_t plain;
    CUDA_OK(cudaEventCreate(&plain));
    ot::check("plain_event_not_exportable", cudaIpcGetEventHandle(&eh, plain) != cudaSuccess);
    cudaGetLastError();
    CUDA_OK(cudaIpcGetEventHandle(&eh, ev));
    printf("HANDLES %s %s\n", Hex(&mh, sizeof mh).c_str(), Hex(&eh, sizeof eh).c_str());
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 2;
    CUDA_OK(cudaMemcpy(h.data(), d, N * sizeof(int), cudaMemcpyDeviceToHost));
    ot::check_kernel("producer_sees_consumer_kernel", AllEqual(h, 7), ot::fmt("h[5]=%d", h[5]));
    CUDA_OK(cudaFree(d));
    return ot::finish();
  }
  if (mode == "producer-late") {
    int* d = nullptr;
    CUDA_OK(cudaMalloc(&d, N * sizeof(int)));
    CUDA_OK(cudaMemset(d, 0, N * sizeof(int)));
    cudaEvent_t ev;
    CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess));
    cudaIpcMemHandle_t mh;
    cudaIpcEventHandle_t eh;
    CUDA_OK(cudaIpcGetMemHandle(&mh, d));
    CUDA_OK(cudaIpcGetEventHandle(&eh, ev));
    printf("HANDLES %s %s\n", Hex(&mh, sizeof mh).c_str(), Hex(&eh, sizeof eh).c_str());
    if (!ReadLine("READY")) return 2;
    slow_fill<<<1, 256>>>(d, N);
    CUDA_OK(cudaEventRecord(ev, 0));
    printf("RECORDED\n");  // no synchronizing call in between: the event orders the consumer
    if (!ReadLine("CONSUMED")) return 2;
    CUDA_OK(cudaFree(d));
    return ot::finish();
  }
  if (mode == "consumer-late" && argc > 3) {
    cudaIpcMemHandle_t mh;
    cudaIpcEventHandle_t eh;
    if (!Unhex(argv[2], &mh, sizeof mh) || !Unhex(argv[3], &eh, sizeof eh)) return 2;
    int* d = nullptr;
    CUDA_OK(cudaIpcOpenMemHandle((void**)&d, mh, cudaIpcMemLazyEnablePeerAccess));
    cudaEvent_t ev;
    CUDA_OK(cudaIpcOpenEventHandle(&ev, eh));
    printf("READY\n");
    if (!ReadLine("RECORDED")) return 2;
    CUDA_OK(cudaEventSynchronize(ev));
    CUDA_OK(cudaMemcpy(h.data(), d, N * sizeof(int), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < N; ++i) bad += h[i] != 5 * i;
    ot::check_kernel("imported_event_waits_for_the_producers_kernel", bad == 0,
                     ot::fmt("%d of %d values not yet written (h[%d]=%d)", bad, N, N - 1, h[N - 1]));
    CUDA_OK(cudaIpcCloseMemHandle(d));
    CUDA_OK(cudaEventDestroy(ev));
    return ot::finish();
  }
  if (mode == "consumer" && argc > 3) {
    cudaIpcMemHandle_t mh;
    cudaIpcEventHandle_t eh;
    if (!Unhex(argv[2], &mh, sizeof mh) || !Unhex(argv[3], &eh, sizeof eh)) return 2;
    // A forged handle (one secret byte changed) is refused, as is a handle of nothing.
    cudaIpcMemHandle_t forged = mh;
    forged.reserved[32] ^= 1;
    int* bad = nullptr;
    ot::check("forged_handle_refused",
              cudaIpcOpenMemHandle((void**)&bad, forged, cudaIpcMemLazyEnablePeerAccess) == cudaErrorInvalidValue);
    cudaGetLastError();
    cudaIpcMemHandle_t zero{};
    ot::check("zero_handle_refused",
              cudaIpcOpenMemHandle((void**)&bad, zero, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess);
    cudaGetLastError();
    int* d = nullptr;
    CUDA_OK(cudaIpcOpenMemHandle((void**)&d, mh, cudaIpcMemLazyEnablePeerAccess));
    cudaEvent_t ev;
    CUDA_OK(cudaIpcOpenEventHandle(&ev, eh));
    cudaStream_t s;
    CUDA_OK(cudaStreamCreate(&s));
    CUDA_OK(cudaStreamWaitEvent(s, ev, 0));
    CUDA_OK(cudaMemcpyAsync(h.data(), d, N * sizeof(int), cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    ot::check_kernel("consumer_sees_producer_kernel", AllEqual(h, 0), ot::fmt("h[5]=%d", h[5]));
    ot::check("ipc_memory_not_freeable", cudaFree(d) != cudaSuccess);
    cudaGetLastError();
    add<<<N / 256, 256, 0, s>>>(d, N, 7);
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaIpcCloseMemHandle(d));
    ot::check("closed_ipc_memory_refused", cudaMemcpy(h.data(), d, 16, cudaMemcpyDeviceToHost) != cudaSuccess);
    cudaGetLastError();
    CUDA_OK(cudaEventDestroy(ev));
    CUDA_OK(cudaStreamDestroy(s));
    return ot::finish();
  }
  fprintf(stderr, "usage: ipc producer | ipc consumer <mem handle hex> <event handle hex>\n");
  return 2;
}
