"""torch.multiprocessing sharing a CUDA tensor with a spawned child (CUDA IPC through Orion): the
child writes it in place from the host, the parent checks the bytes (tests/integration/test_ipc.py)."""
import sys, torch, torch.multiprocessing as mp

def child(q, done):
    t = q.get()                      # a CUDA tensor of the parent, opened through CUDA IPC
    t.copy_(torch.arange(4096, dtype=torch.int32) * 5)   # written in place, from the host
    torch.cuda.synchronize()
    done.put(int(t.device.index))
    q.get()                          # keep the tensor until the parent has looked

if __name__ == "__main__":
    mp.set_start_method("spawn")
    q, done = mp.Queue(), mp.Queue()
    shared = torch.zeros(4096, dtype=torch.int32, device="cuda")
    p = mp.Process(target=child, args=(q, done))
    p.start()
    q.put(shared)
    done.get(timeout=120)
    print("SHARED_EQUAL", torch.equal(shared.cpu(), torch.arange(4096, dtype=torch.int32) * 5), flush=True)
    q.put(None)
    p.join(120)
    print("CHILD_EXIT", p.exitcode, flush=True)
