"""Run by test_ms_msrun.py under ``msrun`` (2 workers + its scheduler process): the mesh
joins msrun's world through ``init_device_mesh`` alone, and one sharded matmul-sum is
checked against numpy. Each worker prints one ``MSRUN_RESULT`` line."""

import mindspore as ms
import numpy as np
from mindspore import Tensor, mint

import hyper_shard as hs
from hyper_shard import Replicate, Shard

ms.runtime.launch_blocking()
mesh = hs.init_device_mesh("CPU", (2,))
x_np = np.arange(20, dtype=np.float32).reshape(5, 4)
w_np = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
x = hs.distribute_tensor(Tensor(x_np), mesh, [Shard(0)])
w = hs.distribute_tensor(Tensor(w_np), mesh, [Replicate()])
y = mint.matmul(x, w)
full = y.full_tensor().asnumpy()
ok = bool(np.allclose(full, x_np @ w_np, rtol=1e-5))
print(
    f"MSRUN_RESULT rank={mesh.get_rank()} world={mesh.platform.get_world_size()} "
    f"group={mesh.get_group(0).name} placements={y.placements} ok={ok}",
    flush=True,
)
