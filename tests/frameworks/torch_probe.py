"""How far PyTorch gets through Orion. Runs step by step and prints `STEP <name> ok <detail>` or
`STEP <name> FAIL <exception>`; the first three steps (import, torch.cuda.is_available(), a tensor
on the device) gate the rest, later steps run even if one fails. Run it with Orion's libcuda.so.1 on
LD_LIBRARY_PATH and ORION_SHM set (tests/integration/test_frameworks.py does). Kernels do not run on
the sim backend, so steps check status and data movement only, never computed values."""
import sys
import traceback

FAILED = []


def step(name, fn):
    try:
        detail = fn()
    except Exception as e:  # noqa: BLE001 - every failure is the answer
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"STEP {name} FAIL {type(e).__name__}: {first}", flush=True)
        traceback.print_exc()
        FAILED.append(name)
        return False
    print(f"STEP {name} ok {'' if detail is None else detail}".rstrip(), flush=True)
    return True


def require(cond, what):
    if not cond:
        raise AssertionError(what)


def main():
    if not step("import", lambda: __import__("torch").__version__ + " cuda " + str(__import__("torch").version.cuda)):
        return 1
    import torch

    if not step("is_available", lambda: require(torch.cuda.is_available(), "torch.cuda.is_available() is False")):
        return 1
    if not step("zeros", lambda: str(torch.zeros(4, device="cuda").device)):
        return 1
    step("device", lambda: f"{torch.cuda.get_device_name(0)} count={torch.cuda.device_count()} "
                           f"cc={torch.cuda.get_device_capability(0)}")
    x = torch.arange(1 << 16, dtype=torch.float32)
    step("round_trip", lambda: require(torch.equal(x.cuda().cpu(), x), "bytes differ") or "intact")
    step("elementwise", lambda: str((torch.ones(4, device="cuda") + 1).cpu().shape))
    step("reduction", lambda: str(torch.ones(1000, device="cuda").sum().item() is not None))
    step("randn", lambda: str(torch.randn(1000, device="cuda").shape))
    for n in (1, 7, 64, 256, 1024):
        step(f"matmul_{n}", lambda n=n: str((torch.ones(n, n, device="cuda") @ torch.ones(n, n, device="cuda")).shape))
    step("matmul_half", lambda: str((torch.ones(128, 128, device="cuda", dtype=torch.half) @
                                     torch.ones(128, 128, device="cuda", dtype=torch.half)).dtype))
    step("conv2d_cudnn", lambda: str(torch.nn.functional.conv2d(torch.ones(1, 3, 16, 16, device="cuda"),
                                                                torch.ones(8, 3, 3, 3, device="cuda")).shape))
    step("fft", lambda: str(torch.fft.fft(torch.ones(1024, device="cuda", dtype=torch.complex64)).shape))
    step("linalg_solve", lambda: str(torch.linalg.solve(torch.eye(16, device="cuda") * 2,
                                                        torch.ones(16, 1, device="cuda")).shape))

    def backward():
        w = torch.ones(32, 32, device="cuda", requires_grad=True)
        (w @ w).sum().backward()
        return str(w.grad.shape)

    step("backward", backward)
    step("synchronize", lambda: torch.cuda.synchronize())
    print(f"DONE failed={len(FAILED)} {' '.join(FAILED)}".rstrip(), flush=True)
    return 0 if not FAILED else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: after a backward pass, PyTorch's autograd device thread can abort the interpreter's
    # shutdown (std::terminate from PyThread_exit_thread while it drops a GraphTask, seen here about
    # one run in two; no Orion frame on that stack). The steps above are the check; exit directly.
    import os
    os._exit(code)
