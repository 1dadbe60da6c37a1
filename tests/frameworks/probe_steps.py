"""The step harness of the framework probes (torch_probe.py, cupy_probe.py): each step prints
`STEP <name> ok <detail>` or `STEP <name> FAIL <exception>` (with its traceback on stderr) and the
probes go on; FAILED lists the failed steps."""
import os
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


def exit_now(code):
    """Flushes and leaves at once: after a backward pass, PyTorch's autograd device thread can abort
    the interpreter's shutdown (std::terminate from PyThread_exit_thread while it drops a GraphTask,
    seen here about one run in two; no Orion frame on that stack). The steps are the check."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
