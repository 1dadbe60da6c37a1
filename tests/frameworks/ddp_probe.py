"""DDP the Orion PyTorch guide's way (--dist-backend gloo), run by torchrun with two processes, each
its own vGPU session: a gloo all_reduce of CUDA tensors (its sum is computed by gloo on the host,
so it is checked by value), a gloo broadcast of a CUDA tensor (rank 1 ends with rank 0's bytes),
and DistributedDataParallel: construction (it flattens, broadcasts and unflattens the weights; the
flattening kernels are SASS, not run on sim, so the weights' values are not checked, only that both
ranks end with the same bytes) and three training steps. Each rank prints one RANK line:
  RANK <r> allreduce=<bool> broadcast=<bool> before=<sha256> after=<sha256> steps=3
Usage: torchrun --nproc_per_node=2 ddp_probe.py"""
import gc
import hashlib
import os

import torch
import torch.distributed as dist


def digest(model):
    return hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()


rank = int(os.environ["RANK"])
dist.init_process_group("gloo")  # env:// from torchrun
torch.cuda.set_device(0)  # each process has its own vGPU (ORION_VGPU=1)
h = torch.arange(1000, dtype=torch.float64) * (rank + 1)
t = h.cuda()
dist.all_reduce(t)
allreduce = bool(torch.equal(t.cpu(), torch.arange(1000, dtype=torch.float64) * 3))
mine = torch.randint(0, 1 << 30, (4096,), dtype=torch.int32, generator=torch.Generator().manual_seed(7 + rank))
b = mine.cuda()
dist.broadcast(b, src=0)
rank0 = torch.randint(0, 1 << 30, (4096,), dtype=torch.int32, generator=torch.Generator().manual_seed(7))
broadcast = bool(torch.equal(b.cpu(), rank0)) and (rank == 0 or not torch.equal(mine, rank0))
torch.manual_seed(100 + rank)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).cuda()
before = digest(model)
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
after = digest(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
# The backward passes run in this thread, not on autograd's CUDA device thread: that thread can drop
# its last reference to a finished graph task (a decref that takes the GIL) while the interpreter
# finalizes, and then aborts the process at exit with "terminate called without an active
# exception" (PyTorch's own race, pytorch/pytorch#190489 and #38228; seen here about one run in
# three under load). DDP's hooks and all-reduces are the same either way.
with torch.autograd.set_multithreading_enabled(False):
    for _ in range(3):
        loss = ddp(torch.randn(16, 32, device="cuda")).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
torch.cuda.synchronize()
# One write(2) of the whole line, newline included: both ranks share torchrun's stdout, and print()
# writes the text and its newline separately when stdout is unbuffered (PYTHONUNBUFFERED, python -u),
# so the two ranks' lines could interleave as "RANK 0 ...RANK 1 ...\n\n" (a CI run saw neither).
os.write(1, f"RANK {rank} allreduce={allreduce} broadcast={broadcast} before={before} after={after} steps=3\n".encode())
# The process group goes before the interpreter does: DistributedDataParallel holds it, and gloo's
# worker threads dispose of finished work (again a decref that takes the GIL) until it is destroyed;
# left to interpreter finalization, that aborts the process as above.
del ddp, opt, loss
gc.collect()
dist.destroy_process_group()
