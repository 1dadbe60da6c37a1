"""JAX on a vGPU (jax[cuda13], tests/requirements-jax.txt): the devices JAX sees, a host array's
round trip through the device (checked by value), then XLA-compiled work. On the sim, XLA's
kernels are sm_90a cubins (SASS only): in the default mode their launch is refused and JAX raises
an error naming CUDA_ERROR_NO_BINARY_FOR_GPU; at the API level (--sim-unexecutable skip) they are
accepted and not run, so only the shapes are printed, never values. Prints:
  DEVICES <platform> <count> <kind>
  ROUNDTRIP <bool>
  COMPUTE ok shape=<shape>          (the launch was accepted)
  COMPUTE error <first line>        (it was refused)"""
import numpy as np

import jax
import jax.numpy as jnp

devs = jax.devices()
print(f"DEVICES {devs[0].platform} {len(devs)} {devs[0].device_kind}", flush=True)
h = np.arange(4096, dtype=np.float32) * 3
x = jax.device_put(h, devs[0])
print(f"ROUNDTRIP {bool(np.array_equal(np.asarray(x), h))}", flush=True)
try:
    y = jax.jit(lambda a: (a * 2.0 + 1.0).sum())(x)
    y.block_until_ready()
    z = jnp.dot(jnp.ones((64, 64)), jnp.ones((64, 64)))
    z.block_until_ready()
    print(f"COMPUTE ok shape={tuple(z.shape)}", flush=True)
except Exception as e:  # noqa: BLE001: the probe reports whatever JAX raised
    first = (str(e).strip().splitlines() or [""])[0]
    print(f"COMPUTE error {type(e).__name__}: {first}"[:400], flush=True)
