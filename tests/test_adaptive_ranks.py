"""An adaptive batch measured on real torch ranks: DDP's all-reduce through the loader's hook (two gloo ranks)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.local

RANK = textwrap.dedent("""
    import json, sys, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from pilotfill.elastic import Adaptive, ElasticLoader
    rank, port = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 16, generator=g)
    y = (x @ torch.randn(16, 1, generator=g)).squeeze(1) + 0.5 * torch.randn(2048, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = ElasticLoader((x, y), Adaptive(32, rule="adascale"), seed=0, report=False)
    ddp = DDP(model)
    loader.adapt(opt, ddp)
    factors = []
    while loader.epoch < 2:
        for batch in loader:
            opt.zero_grad()
            batch.backward(lambda a, b: torch.nn.functional.mse_loss(ddp(a).squeeze(1), b), ddp)
            opt.step()
            factors.append(batch.lr_factor)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    both = [torch.zeros_like(flat) for _ in range(2)]
    dist.all_gather(both, flat)
    print(json.dumps({"noise_scale": loader.noise.noise_scale, "factors": factors, "lr": opt.param_groups[0]["lr"],
                      "differ": float((both[0] - both[1]).abs().max()), "sizes": batch.size}), flush=True)
    dist.destroy_process_group()  # gloo's threads end before the interpreter's exit (otherwise std::terminate at exit)
""")


def test_two_ranks_measure_the_noise_and_scale_the_rate_by_adascales_gain(torch_runtime):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(r), port], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=300) for p in ranks]
    assert all(p.returncode == 0 for p in ranks), [err[-2000:] for _, err in outs]
    got = json.loads(outs[0][0].strip().splitlines()[-1])
    assert got["differ"] == 0.0, "the hook's all-reduce keeps the ranks' models the same"
    assert got["noise_scale"] is not None and got["noise_scale"] > 0
    assert got["factors"][0] == 1.0 and 1.0 < got["factors"][-1] <= 2.0  # 64 samples a step: a gain up to twice the rate
    assert got["lr"] == pytest.approx(0.01 * got["factors"][-1])
