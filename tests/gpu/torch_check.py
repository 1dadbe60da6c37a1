"""PyTorch smoke check for scripts/gpu-e2e.sh: a matmul and a sum on the GPU, compared with the CPU.

Prints the e2e lines (LIBCUDA, DEVICE, TIME, INFO, RESULT torch ok|FAIL|SKIP ...). Exit status:
0 ok, 1 wrong result or error, 3 PyTorch is not importable (SKIP).
"""
import sys
import time
import traceback

from e2e_common import loaded_libcuda  # beside this script




def main():
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means "not available here"
        print(f"RESULT torch SKIP import failed: {type(e).__name__}: {e}")
        return 3
    print(f"INFO torch {torch.__version__} built for CUDA {torch.version.cuda}")
    try:
        available = torch.cuda.is_available()
        print(f"LIBCUDA {loaded_libcuda()}")
        if not available:
            print("RESULT torch FAIL torch.cuda.is_available() is False")
            return 1
        print(f"DEVICE {torch.cuda.get_device_name(0)} devices {torch.cuda.device_count()}")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        g = torch.Generator().manual_seed(0)
        n = 1024
        a = torch.rand(n, n, generator=g)
        b = torch.rand(n, n, generator=g)
        ref = a.double() @ b.double()

        def work():
            da, db = a.cuda(), b.cuda()
            c = da @ db
            s = c.sum()
            out = c.cpu(), s.item()
            torch.cuda.synchronize()
            return out

        work()  # warm-up (cuBLAS handle, kernels)
        t0 = time.perf_counter()
        c, s = work()
        print(f"TIME torch {(time.perf_counter() - t0) * 1000:.3f}")
        rel = ((c.double() - ref).abs() / ref.abs().clamp_min(1e-30)).max().item()
        ref_sum = ref.sum().item()
        sum_rel = abs(s - ref_sum) / abs(ref_sum)
        print(f"LIBCUDA {loaded_libcuda()}")
        print(f"INFO matmul worst relative error {rel:.2e}; sum {s:.6e} vs {ref_sum:.6e} (relative {sum_rel:.2e})")
        if not (rel <= 1e-3 and sum_rel <= 1e-4):
            print(f"RESULT torch FAIL matmul relative error {rel:.2e}, sum relative error {sum_rel:.2e}")
            return 1
        print("RESULT torch ok")
        return 0
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        print(f"LIBCUDA {loaded_libcuda()}")
        print(f"RESULT torch FAIL {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return 1


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)
    sys.exit(main())
