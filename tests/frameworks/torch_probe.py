"""How far PyTorch gets through Orion. Runs step by step and prints `STEP <name> ok <detail>` or
`STEP <name> FAIL <exception>`; the first three steps (import, torch.cuda.is_available(), a tensor
on the device) gate the rest, later steps run even if one fails. Run it with Orion's libcuda.so.1 on
LD_LIBRARY_PATH and ORION_SHM set (tests/integration/test_frameworks.py does). PyTorch's kernels are
SASS for sm_90 (their PTX is for a newer arch), which the sim backend validates and logs but does
not execute, so steps check status and data movement only, never computed values."""
import sys

from probe_steps import FAILED, exit_now, require, step  # noqa: E402 - next to this script


def depth(torch):
    """Memory accounting, the quota, pinned copies, streams/events and a training loop. The
    quota is ORION_GMEM (MiB), which the test sets; kernels are SASS (not run on sim): no values."""
    import os
    quota = int(os.environ["ORION_GMEM"]) << 20
    mib = 1 << 20

    def mem_info():
        free, total = torch.cuda.mem_get_info()
        props = torch.cuda.get_device_properties(0)
        require(total == quota, f"mem_get_info total {total} != quota {quota}")
        require(props.total_memory == quota, f"total_memory {props.total_memory} != quota {quota}")
        require(0 < free <= total, f"free {free}")
        return f"free={free} total={total} props.total_memory={props.total_memory}"

    step("mem_get_info", mem_info)

    def capability():
        cc = torch.cuda.get_device_capability()
        require(cc == (9, 0), f"capability {cc}")
        return str(cc)

    step("capability", capability)

    def accounting():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t = torch.empty(24 * mib, dtype=torch.uint8, device="cuda")
        grown = torch.cuda.memory_allocated() - base
        require(grown == 24 * mib, f"memory_allocated grew by {grown}")
        reserved = torch.cuda.memory_reserved()
        require(reserved >= base + 24 * mib, f"memory_reserved {reserved}")
        free_now = torch.cuda.mem_get_info()[0]
        require(free_now <= quota - reserved, f"free {free_now} with {reserved} reserved of {quota}")
        del t
        require(torch.cuda.memory_allocated() == base, "memory_allocated not back to its base after del")
        peak = torch.cuda.max_memory_allocated()
        require(peak >= base + 24 * mib, f"max_memory_allocated {peak}")
        return f"base={base} +24MiB peak={peak} reserved={reserved}"

    step("memory_allocated", accounting)

    def oom():
        torch.cuda.empty_cache()
        try:
            torch.empty(quota + 64 * mib, dtype=torch.uint8, device="cuda")
            raise AssertionError("an allocation larger than the quota succeeded")
        except torch.OutOfMemoryError:
            pass
        chunks = []
        try:
            while len(chunks) * 256 * mib <= 2 * quota:
                chunks.append(torch.empty(256 * mib, dtype=torch.uint8, device="cuda"))
            raise AssertionError(f"{len(chunks)} x 256 MiB allocated under a {quota >> 20} MiB quota")
        except torch.OutOfMemoryError as e:
            held = len(chunks) * 256 * mib
            require(quota - 512 * mib < held <= quota, f"OOM after {len(chunks)} x 256 MiB")
            msg = str(e).splitlines()[0][:100]
        del chunks
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info()
        require(free >= quota - 256 * mib, f"free {free} after empty_cache")
        x = torch.arange(1 << 20, dtype=torch.int32)
        y = torch.empty(512 * mib, dtype=torch.uint8, device="cuda")
        require(torch.equal(x.cuda().cpu(), x), "round trip after OOM")
        del y
        return f"OutOfMemoryError at {held >> 20} MiB held; after empty_cache free={free}: {msg}"

    step("oom_then_recover", oom)

    def pinned():
        g = torch.Generator().manual_seed(9)
        out = []
        for n in (4096 + 3, 4 * mib + 17, 24 * mib):
            src = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).pin_memory()
            require(src.is_pinned(), "pin_memory() did not pin")
            d = src.to("cuda", non_blocking=True)
            back = torch.empty(n, dtype=torch.uint8).pin_memory()
            back.copy_(d, non_blocking=True)
            torch.cuda.synchronize()
            require(torch.equal(back, src), f"{n} bytes differ")
            out.append(n)
        return f"byte-exact pinned non_blocking round trips {out}"

    step("pinned_non_blocking", pinned)

    def streams_events():
        n = 8 * mib
        src = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3)).pin_memory()
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        require(s1 != s2 and s1.cuda_stream != 0, "streams")
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        done = torch.cuda.Event()
        with torch.cuda.stream(s1):
            e0.record()
            d1 = src.to("cuda", non_blocking=True)
            (torch.ones(256, device="cuda") * 2).sum()  # kernels on s1
            e1.record()
            done.record()
        s2.wait_event(done)
        with torch.cuda.stream(s2):
            d2 = torch.empty_like(d1)
            d2.copy_(d1, non_blocking=True)  # device-to-device on s2 after s1's copy
            d1.record_stream(s2)
        back = torch.empty(n, dtype=torch.uint8).pin_memory()
        torch.cuda.current_stream().wait_stream(s2)
        back.copy_(d2, non_blocking=True)
        e1.synchronize()
        ms = e0.elapsed_time(e1)
        torch.cuda.synchronize()
        require(e1.query() and done.query() and s1.query() and s2.query(), "work still pending after synchronize")
        require(ms >= 0.0, f"elapsed_time {ms}")
        require(torch.equal(back, src), "bytes differ after H2D(s1) -> D2D(s2) -> D2H")
        return f"elapsed_time={ms:.3f} ms, H2D s1 -> D2D s2 -> D2H byte-exact"

    step("streams_events", streams_events)

    def train_cnn():
        torch.manual_seed(0)
        nn = torch.nn
        net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                            nn.Linear(16, 10)).cuda()
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        x = torch.randn(8, 3, 16, 16, device="cuda")
        y = torch.randint(0, 10, (8,), device="cuda")
        before = torch.cuda.memory_allocated()
        iters = 5
        for _ in range(iters):
            opt.zero_grad(set_to_none=True)
            out = net(x)
            loss = torch.nn.functional.cross_entropy(out, y)
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        require(out.shape == (8, 10) and loss.shape == (), f"{out.shape} {loss.shape}")
        for name, p in net.named_parameters():
            require(p.grad is not None and p.grad.shape == p.shape, f"grad of {name}")
            require(len(opt.state[p]) > 0, f"no momentum buffer for {name}")
        nparams = sum(p.numel() for p in net.parameters())
        grown = torch.cuda.memory_allocated() - before
        # Momentum buffers and grads: at least 2 x the parameters (fp32), which stay allocated.
        require(grown >= 2 * 4 * nparams, f"memory_allocated grew by {grown} for {nparams} parameters")
        return f"{iters} SGD iterations, {nparams} parameters, +{grown} bytes held"

    step("train_cnn", train_cnn)
    step("synchronize_end", lambda: torch.cuda.synchronize())


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
    depth(torch)
    print(f"DONE failed={len(FAILED)} {' '.join(FAILED)}".rstrip(), flush=True)
    return 0 if not FAILED else 1


if __name__ == "__main__":
    exit_now(main())
