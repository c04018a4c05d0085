"""Device-to-device migration over torch.distributed: the moved session continues exactly.

gloo on CPUs runs here; the NCCL variant runs where two CUDA devices are present.
"""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, device: str, results: "mp.Queue") -> None:
    import torch.distributed as dist

    from workers.model import ReferenceModel
    from workers.transfer import backend_for, recv_state, send_state

    torch.set_num_threads(1)
    dev = f"cuda:{rank}" if device == "cuda" else "cpu"
    dist.init_process_group(backend_for(dev), init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=2)
    try:
        model = ReferenceModel(seed=0, device=dev)
        if rank == 0:
            state = model.init_state("s", "a paper boat", seed=7)
            for _ in range(5):
                model.run_batch([state])
            model.apply_input(state, "turn left", 1)
            model.run_batch([state])  # a chunk boundary, with a fresh input applied
            moved = send_state(model, state, dst=1)
            stayed = [model.run_batch([state])[0].checksum for _ in range(3)]
            results.put(("source", moved, stayed))
        else:
            state = recv_state(model, src=0)
            assert state.kv is not None
            arrived_at = state.chunk_index
            moved = [model.run_batch([state])[0].checksum for _ in range(3)]
            results.put(("target", arrived_at, moved))
    finally:
        dist.destroy_process_group()


def _run(device: str) -> None:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, device, results)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    got = dict((kind, rest) for kind, *rest in (results.get(timeout=5) for _ in range(2)))
    moved_bytes, stayed = got["source"]
    chunk_index, moved = got["target"]
    assert moved_bytes > 100_000          # the KV cache travelled, not only the compact state
    assert chunk_index == 6
    assert moved == stayed                # bitwise the same next chunks as never moving


def test_transfer_over_gloo_continues_exactly() -> None:
    _run("cpu")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices for NCCL")
def test_transfer_over_nccl_continues_exactly() -> None:
    _run("cuda")
