"""How far CuPy gets through Orion. Prints `STEP <name> ok <detail>` or `STEP <name> FAIL <exception>`
per step, like torch_probe.py; the first steps (import, a device array) gate the rest.

CuPy compiles its elementwise, reduction and raw kernels at run time with NVRTC. By default it asks
NVRTC for a cubin of the device's arch (SASS, which the sim backend cannot execute); with
CUPY_COMPILE_WITH_PTX=1 (a documented CuPy setting) it loads PTX, which the sim backend's PTX
executor runs. tests/integration/test_frameworks.py runs this probe both ways: in PTX mode the steps
marked COMPUTED compare the device's results with numpy's, in cubin mode (pass --sass) against an
oriond that refuses SASS kernels the steps that launch one fail, and at the API level (pass
--api-level too: oriond --sim-unexecutable skip) they check status, shapes and data movement only.
cuBLAS's GEMM (matmul) is SASS in both modes: refused by default (the step passes when cupy.matmul
raises), status and shape only at the API level."""
import sys

from probe_steps import FAILED, exit_now, require, step  # noqa: E402 - next to this script

SASS = "--sass" in sys.argv
API_LEVEL = "--api-level" in sys.argv  # oriond accepts SASS-only kernels and does not run them


def main():
    if not step("import", lambda: __import__("cupy").__version__):
        return 1
    import numpy as np
    import cupy as cp

    def device():
        n = cp.cuda.runtime.getDeviceCount()
        props = cp.cuda.runtime.getDeviceProperties(0)
        free, total = cp.cuda.runtime.memGetInfo()
        return f"count={n} name={props['name'].decode()} cc={props['major']}.{props['minor']} total={total} free={free}"

    if not step("device", device):
        return 1
    if not step("array", lambda: str(cp.zeros(4, dtype=cp.float32).device)):
        return 1

    host = np.arange(1 << 16, dtype=np.float32) * np.float32(0.5) - np.float32(7.25)

    def round_trip():
        back = cp.asnumpy(cp.asarray(host))
        require(back.tobytes() == host.tobytes(), "bytes differ")
        return "intact"

    step("round_trip", round_trip)

    def computed(name, got, want, exact=True, rtol=1e-6, atol=0.0):
        """Compare a device result with numpy's (PTX mode); in SASS mode check shape and dtype."""
        got_h = cp.asnumpy(got) if isinstance(got, cp.ndarray) else np.asarray(got)
        want = np.asarray(want)
        require(got_h.shape == want.shape, f"{name}: shape {got_h.shape} != {want.shape}")
        if SASS:
            return f"shape={got_h.shape} dtype={got_h.dtype} (not computed: SASS)"
        if exact:
            bad = np.flatnonzero(got_h.ravel() != want.ravel())
            require(bad.size == 0, f"{name}: {bad.size} of {want.size} differ, first at {bad[:1]}: "
                                   f"{got_h.ravel()[bad[:1]]} != {want.ravel()[bad[:1]]}")
        else:
            require(np.allclose(got_h, want, rtol=rtol, atol=atol), f"{name}: max abs err "
                    f"{np.max(np.abs(got_h.astype(np.float64) - want.astype(np.float64)))}")
        return f"COMPUTED {name} n={want.size} equal to numpy{'' if exact else f' (rtol={rtol})'}"

    x = cp.asarray(host)
    step("elementwise_axpb", lambda: computed("x*2+1", x * np.float32(2) + np.float32(1),
                                              host * np.float32(2) + np.float32(1)))
    ia = np.arange(-5000, 5000, dtype=np.int32)
    ib = (np.arange(10000, dtype=np.int32) * 7919) % 1013 + 1
    step("elementwise_int", lambda: computed("a//b, a%b", cp.stack([cp.asarray(ia) // cp.asarray(ib),
                                                                    cp.asarray(ia) % cp.asarray(ib)]),
                                             np.stack([ia // ib, ia % ib])))
    step("elementwise_sqrt_exp", lambda: computed(
        "sqrt(|x|)+exp(-x*x/1e8)", cp.sqrt(cp.abs(x)) + cp.exp(-x * x / np.float32(1e8)),
        np.sqrt(np.abs(host)) + np.exp(-host * host / np.float32(1e8)), exact=False, rtol=1e-5))
    step("elementwise_f64", lambda: computed("sin(d)*cos(d)", cp.sin(cp.asarray(host, dtype=cp.float64)) *
                                             cp.cos(cp.asarray(host, dtype=cp.float64)),
                                             np.sin(host.astype(np.float64)) * np.cos(host.astype(np.float64)),
                                             exact=False, rtol=1e-12, atol=1e-14))
    step("where_compare", lambda: computed("where(x>0,x,-2x)", cp.where(x > 0, x, -2 * x),
                                           np.where(host > 0, host, -2 * host)))
    step("astype_half", lambda: computed("float16", x.astype(cp.float16), host.astype(np.float16)))

    iv = np.arange(1, 100001, dtype=np.int64)
    step("reduce_sum_int", lambda: computed("sum(int64)", cp.asarray(iv).sum(), iv.sum()))
    step("reduce_max_min", lambda: computed("max/min", cp.stack([x.max(), x.min()]),
                                            np.stack([host.max(), host.min()])))
    step("reduce_sum_f32", lambda: computed("sum(f32)", x.sum(), host.sum(dtype=np.float64).astype(np.float32),
                                            exact=False, rtol=1e-5))
    m = host[:64 * 1024].reshape(256, 256)
    step("reduce_axis", lambda: computed("sum(axis=1)", cp.asarray(m).sum(axis=1),
                                         m.astype(np.float64).sum(axis=1).astype(np.float32), exact=False, rtol=1e-5))
    step("argmax", lambda: computed("argmax", cp.asarray(m).argmax(axis=0), m.argmax(axis=0)))

    def elementwise_kernel():
        k = cp.ElementwiseKernel("float32 a, float32 b", "float32 c", "c = a > b ? a - b : b * 3.0f", "orion_ew")
        b = host[::-1].copy()
        return computed("ElementwiseKernel", k(x, cp.asarray(b)), np.where(host > b, host - b, b * np.float32(3)))

    step("elementwise_kernel", elementwise_kernel)

    def reduction_kernel():
        k = cp.ReductionKernel("int64 v", "int64 s", "v * v", "a + b", "s = a", "0", "orion_sumsq")
        return computed("ReductionKernel", k(cp.asarray(iv)), (iv * iv).sum())

    step("reduction_kernel", reduction_kernel)

    def fuse():
        def f(a, b):
            return a * b + cp.sin(a) if isinstance(a, cp.ndarray) else a * b + np.sin(a)

        @cp.fuse()
        def fused(a, b):
            return a * b + cp.sin(a)

        return computed("cupy.fuse", fused(x, x), f(host, host), exact=False, rtol=1e-5, atol=1e-3)

    step("fuse", fuse)
    step("cumsum", lambda: computed("cumsum(int64)", cp.cumsum(cp.asarray(iv % 7 - 3)), np.cumsum(iv % 7 - 3)))

    raw_src = r"""
    extern "C" __global__ void orion_block_scan(const int* in, int* out, int* block_sums, int n) {
      __shared__ int s[256];
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      s[threadIdx.x] = i < n ? in[i] : 0;
      __syncthreads();
      for (int d = 1; d < blockDim.x; d <<= 1) {
        int v = threadIdx.x >= d ? s[threadIdx.x - d] : 0;
        __syncthreads();
        s[threadIdx.x] += v;
        __syncthreads();
      }
      if (i < n) out[i] = s[threadIdx.x];
      if (threadIdx.x == blockDim.x - 1) atomicAdd(block_sums, s[threadIdx.x]);
    }
    """

    def raw_kernel():
        k = cp.RawKernel(raw_src, "orion_block_scan")
        n = 5000
        data = (np.arange(n, dtype=np.int32) * 37) % 101 - 50
        out = cp.zeros(n, dtype=cp.int32)
        total = cp.zeros(1, dtype=cp.int32)
        k(((n + 255) // 256,), (256,), (cp.asarray(data), out, total, np.int32(n)))
        want = np.concatenate([np.cumsum(data[i:i + 256]) for i in range(0, n, 256)]).astype(np.int32)
        return computed("RawKernel scan+atomicAdd", cp.concatenate([out, total]),
                        np.concatenate([want, [data.sum()]]).astype(np.int32))

    step("raw_kernel", raw_kernel)

    def matmul():
        a = cp.asarray(np.ones((64, 32), dtype=np.float32))
        b = cp.asarray(np.ones((32, 16), dtype=np.float32))
        if not API_LEVEL:
            # cuBLAS's GEMM is SASS only: the default oriond refuses it, and CuPy must say so.
            try:
                c = cp.matmul(a, b)
                cp.cuda.Device().synchronize()
            except Exception as e:  # CUBLASError, CUDARuntimeError: whichever CuPy raises
                return f"REFUSED {type(e).__name__}: {str(e).splitlines()[0]}"
            require(False, f"cupy.matmul returned {cp.asnumpy(c)[:1, :4]} although its kernel cannot run here")
        c = cp.matmul(a, b)
        cp.cuda.Device().synchronize()
        require(c.shape == (64, 16) and c.dtype == cp.float32, f"{c.shape} {c.dtype}")
        return f"shape={c.shape} (cuBLAS: SASS, not computed)"

    step("matmul", matmul)

    def fft():
        f = cp.fft.fft(cp.ones(1024, dtype=cp.complex64))
        cp.cuda.Device().synchronize()
        require(f.shape == (1024,) and f.dtype == cp.complex64, f"{f.shape} {f.dtype}")
        return f"shape={f.shape}"

    step("fft", fft)

    def fft_values():
        # cuFFT 12.2's 1024-point C2C kernel carries PTX the sim runs (the launch log says "exec": "ran"),
        # so this one library result is computed; the test checks the launch log says so.
        sig = (np.cos(np.arange(1024) * 0.37) + 1j * np.sin(np.arange(1024) * 0.11)).astype(np.complex64)
        return computed("fft(1024)", cp.fft.fft(cp.asarray(sig)), np.fft.fft(sig).astype(np.complex64),
                        exact=False, rtol=1e-4, atol=2e-3)

    step("fft_values", fft_values)
    step("synchronize", lambda: cp.cuda.Device().synchronize())
    print(f"DONE failed={len(FAILED)} {' '.join(FAILED)}".rstrip(), flush=True)
    return 0 if not FAILED else 1


if __name__ == "__main__":
    exit_now(main())
