"""The Orion PyTorch guide's recipe, shaped as pytorch/examples imagenet/main.py
--multiprocessing-distributed --dist-backend gloo runs it: the parent asks
torch.cuda.device_count() (which initialises CUDA: it takes the vGPUs, ORION_VGPU of them) and
spawns that many ranks with torch.multiprocessing.spawn; rank r uses device r and joins a gloo
process group. Each rank copies a tensor to its device, all_reduces it with gloo (the sum is
computed on the host) and reads it back, so the values are checked with no kernel run (on sim a
kernel from the torch wheel is SASS and is refused). Prints
  PARENT count=<n>
  RANK <r> device=<d> sum=<bool>
Usage: python spawn_ranks_probe.py PORT"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def main_worker(rank, world, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    t = (torch.arange(1000, dtype=torch.float64) * (rank + 1)).cuda()
    dist.all_reduce(t)
    want = torch.arange(1000, dtype=torch.float64) * (world * (world + 1) // 2)
    # One write per line: ranks share the pipe, and print()'s separate newline write let two ranks'
    # lines run together ("sum=TrueRANK 0 ...") when stdout is unbuffered.
    os.write(1, f"RANK {rank} device={t.device.index} sum={bool(torch.equal(t.cpu(), want))}\n".encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    n = torch.cuda.device_count()
    print(f"PARENT count={n}", flush=True)
    mp.spawn(main_worker, nprocs=n, args=(n, int(sys.argv[1])))
