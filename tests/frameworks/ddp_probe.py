"""DDP the Orion PyTorch guide's way (--dist-backend gloo), two processes, each with its own vGPU
session: a gloo all_reduce of CUDA tensors (its sum is computed by gloo on the host, so it is
checked by value), and DistributedDataParallel construction (rank 0's weights broadcast to rank 1,
which started from others) and three training steps. Usage: ddp_probe.py <free tcp port>."""
import hashlib
import sys
import torch, torch.distributed as dist, torch.multiprocessing as mp

def worker(rank, world, port, q):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.cuda.set_device(0)
    out = {}
    # all_reduce of CUDA tensors through gloo (staged through host memory): a value gloo computed.
    h = torch.arange(1000, dtype=torch.float64) * (rank + 1)
    t = h.cuda()
    dist.all_reduce(t)
    out["allreduce"] = bool(torch.equal(t.cpu(), torch.arange(1000, dtype=torch.float64) * 3))
    # DDP: rank 1 starts from other weights; DDP broadcasts rank 0's at construction.
    torch.manual_seed(100 + rank)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).cuda()
    out["before"] = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(3):
        x = torch.randn(16, 32, device="cuda")
        loss = ddp(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    out["steps"] = 3
    out["digest"] = digest
    q.put((rank, out))
    dist.destroy_process_group()

if __name__ == "__main__":
    port = int(sys.argv[1])
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, 2, port, q)) for r in range(2)]
    for p in procs: p.start()
    res = dict(q.get(timeout=600) for _ in procs)
    for p in procs: p.join(120)
    print("CODES", [p.exitcode for p in procs])
    for r in sorted(res): print("RANK", r, res[r])
    print("DIFFERENT_BEFORE", res[0]["before"] != res[1]["before"])
    print("SAME_WEIGHTS", res[0]["digest"] == res[1]["digest"])
