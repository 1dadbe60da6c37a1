"""The Orion vGPU PyTorch guide's workloads, small: a few training iterations each of torchvision's
resnet18 on FakeData, an LSTM word language model, a VAE and a DCGAN step, on one vGPU. On sim
PyTorch's kernels are SASS (validated and logged, not run), so each step checks that training ran
through (forward, backward, optimizer, no CUDA error), shapes, and that the loss is a CUDA scalar;
never values. Prints STEP <name> ok|FAIL <detail> and DONE failed=<n>."""
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from probe_steps import FAILED, exit_now, require, step

dev = "cuda"
g = torch.Generator().manual_seed(0)


def train(model, batches, loss_fn, opt):
    for xb, yb in batches:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model, xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True))
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return loss


def resnet18():
    import torchvision
    from torchvision import transforms
    data = torchvision.datasets.FakeData(size=8, image_size=(3, 64, 64), num_classes=10,
                                         transform=transforms.ToTensor())
    loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True)
    model = torchvision.models.resnet18(num_classes=10).to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss = train(model, loader, lambda m, x, y: F.cross_entropy(m(x), y), opt)
    require(loss.shape == () and loss.device.type == "cuda", "loss is not a CUDA scalar")


class LanguageModel(nn.Module):  # the word language model example's RNNModel, small
    def __init__(self, ntoken=200, ninp=32, nhid=64):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, 2, dropout=0.2)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, x):
        out, _ = self.rnn(self.encoder(x))
        return self.decoder(out)


def lstm():
    model = LanguageModel().to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    batches = [(torch.randint(0, 200, (20, 4), generator=g), torch.randint(0, 200, (20, 4), generator=g))
               for _ in range(3)]

    def loss_fn(m, x, y):
        out = m(x)
        return F.cross_entropy(out.view(-1, out.size(-1)), y.view(-1))

    loss = train(model, batches, loss_fn, opt)
    nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    require(loss.shape == (), "loss is not a scalar")


class VAE(nn.Module):  # the VAE example, on 28x28 inputs
    def __init__(self):
        super().__init__()
        self.fc1, self.fc21, self.fc22 = nn.Linear(784, 400), nn.Linear(400, 20), nn.Linear(400, 20)
        self.fc3, self.fc4 = nn.Linear(20, 400), nn.Linear(400, 784)

    def forward(self, x):
        h = F.relu(self.fc1(x.view(-1, 784)))
        mu, logvar = self.fc21(h), self.fc22(h)
        z = mu + torch.randn_like(logvar) * torch.exp(0.5 * logvar)
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z)))), mu, logvar


def vae():
    model = VAE().to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = [(torch.rand(16, 1, 28, 28, generator=g), torch.zeros(16)) for _ in range(3)]

    def loss_fn(m, x, _):
        recon, mu, logvar = m(x)
        bce = F.binary_cross_entropy(recon, x.view(-1, 784), reduction="sum")
        return bce - 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())

    require(train(model, batches, loss_fn, opt).shape == (), "loss is not a scalar")


def dcgan():  # one discriminator and one generator step of the DCGAN example, 32x32
    nz, ngf, ndf = 16, 16, 16
    G = nn.Sequential(nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 4), nn.ReLU(True),
                      nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
                      nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), nn.ReLU(True),
                      nn.ConvTranspose2d(ngf, 3, 4, 2, 1, bias=False), nn.Tanh()).to(dev)
    D = nn.Sequential(nn.Conv2d(3, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
                      nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2),
                      nn.LeakyReLU(0.2, inplace=True), nn.Conv2d(ndf * 2, 1, 8, 1, 0, bias=False),
                      nn.Sigmoid()).to(dev)
    optD = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optG = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    real = torch.rand(8, 3, 32, 32, generator=g).to(dev) * 2 - 1
    noise = torch.randn(8, nz, 1, 1, device=dev)
    fake = G(noise)
    D.zero_grad()
    errD = F.binary_cross_entropy(D(real).view(-1), torch.ones(8, device=dev)) + \
        F.binary_cross_entropy(D(fake.detach()).view(-1), torch.zeros(8, device=dev))
    errD.backward()
    optD.step()
    G.zero_grad()
    errG = F.binary_cross_entropy(D(fake).view(-1), torch.ones(8, device=dev))
    errG.backward()
    optG.step()
    torch.cuda.synchronize()
    require(fake.shape == (8, 3, 32, 32), f"generator output {tuple(fake.shape)}")


def timed(fn):
    def run():
        t = time.time()
        fn()
        return f"{time.time() - t:.1f}s"
    return run


for name, fn in (("resnet18_fakedata", resnet18), ("lstm_language_model", lstm), ("vae", vae), ("dcgan", dcgan)):
    step(name, timed(fn))
print(f"DONE failed={len(FAILED)}", flush=True)
exit_now(1 if FAILED else 0)
