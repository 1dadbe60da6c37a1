"""CuPy smoke check for scripts/gpu-e2e.sh: an elementwise kernel (compiled by NVRTC at run time and
loaded with cuModuleLoadData), a reduction and a matmul, compared with NumPy.

Prints the e2e lines (LIBCUDA, DEVICE, TIME, INFO, RESULT cupy ok|FAIL|SKIP ...). Exit status:
0 ok, 1 wrong result or error, 3 CuPy is not importable (SKIP).
"""
import sys
import time
import traceback

from e2e_common import loaded_libcuda  # beside this script




def main():
    try:
        import cupy as cp
        import numpy as np
    except Exception as e:  # noqa: BLE001
        print(f"RESULT cupy SKIP import failed: {type(e).__name__}: {e}")
        return 3
    print(f"INFO cupy {cp.__version__}")
    try:
        n = cp.cuda.runtime.getDeviceCount()
        print(f"LIBCUDA {loaded_libcuda()}")
        props = cp.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        print(f"DEVICE {name} devices {n}")
        rng = np.random.default_rng(0)
        a = rng.random((1024, 1024), dtype=np.float32)
        b = rng.random((1024, 1024), dtype=np.float32)
        x = np.arange(1 << 22, dtype=np.float32)
        saxpy = cp.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = 2.0f * x + y", "e2e_saxpy")

        def work():
            dx = cp.asarray(x)
            z = saxpy(dx, dx)
            zs = z.sum(dtype=cp.float64)
            c = cp.asarray(a) @ cp.asarray(b)
            out = cp.asnumpy(z), float(zs), cp.asnumpy(c)
            cp.cuda.Device().synchronize()
            return out

        work()  # warm-up: NVRTC compiles, cuBLAS handle
        t0 = time.perf_counter()
        z, zs, c = work()
        print(f"TIME cupy {(time.perf_counter() - t0) * 1000:.3f}")
        ref = a.astype(np.float64) @ b.astype(np.float64)
        rel = float(np.max(np.abs(c - ref) / np.maximum(np.abs(ref), 1e-30)))
        ok_z = bool(np.array_equal(z, 3.0 * x))
        ref_zs = float(np.sum(3.0 * x.astype(np.float64)))
        zs_rel = abs(zs - ref_zs) / ref_zs
        print(f"LIBCUDA {loaded_libcuda()}")
        print(f"INFO elementwise exact {ok_z}; sum relative {zs_rel:.2e}; matmul worst relative {rel:.2e}")
        if not (ok_z and zs_rel <= 1e-6 and rel <= 1e-3):
            print(f"RESULT cupy FAIL elementwise exact {ok_z}, sum rel {zs_rel:.2e}, matmul rel {rel:.2e}")
            return 1
        print("RESULT cupy ok")
        return 0
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        print(f"LIBCUDA {loaded_libcuda()}")
        print(f"RESULT cupy FAIL {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return 1


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)
    sys.exit(main())
