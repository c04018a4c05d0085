"""The reference streaming model: shapes, determinism, batch invariance, KV-recache
continuity across export/import (and msgpack, and a fresh model from a checkpoint)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Iterator

import msgpack
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.errors import ConfigError, SnapshotCorruptError
from workers._layers import patchify, unpatchify
from workers.model import (
    ChunkOutput,
    ModelConfig,
    ReferenceModel,
    SessionState,
    StreamingModel,
    profile_latency,
)

CFG = ModelConfig()


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny ops: a second intra-op thread only spins against other work on a 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model() -> ReferenceModel:
    return ReferenceModel(CFG, seed=7)


def advance(model: ReferenceModel, state: SessionState, chunks: int) -> list[ChunkOutput]:
    return [model.run_batch([state])[0] for _ in range(chunks)]


def sums(outs: list[ChunkOutput]) -> list[str]:
    return [o.checksum for o in outs]


def test_reference_model_is_a_streaming_model(model: ReferenceModel) -> None:
    assert isinstance(model, StreamingModel)


def test_chunk_output_shape_checksum_and_counters(model: ReferenceModel) -> None:
    s = model.init_state("s1", "a red kite over the sea", seed=3)
    model.apply_input(s, "turn left", seq=1)
    outs = advance(model, s, 3)
    size = CFG.frame_size
    for i, out in enumerate(outs):
        assert out.session_id == "s1" and out.chunk_index == i and out.input_seq == 1
        assert out.frames.dtype == torch.uint8 and out.frames.device.type == "cpu"
        assert tuple(out.frames.shape) == (CFG.frames_per_chunk, size, size, 3)
        assert out.checksum == hashlib.sha256(out.frames.numpy().tobytes()).hexdigest()
    assert s.chunk_index == 3 and s.last_checksum == outs[-1].checksum
    assert len(set(sums(outs))) == 3, "consecutive chunks differ"
    assert s.context.shape[0] == min(3 * CFG.frames_per_chunk, CFG.context_frames)


def test_context_window_rolls(model: ReferenceModel) -> None:
    s = model.init_state("roll", "p", seed=1)
    advance(model, s, CFG.context_frames // CFG.frames_per_chunk + 2)
    t = CFG.tokens_per_frame
    assert s.context.shape[0] == CFG.context_frames
    assert s.kv is not None and s.kv.shape[3] == CFG.context_frames * t


def test_same_seed_and_prompt_reproduce_different_ones_do_not(model: ReferenceModel) -> None:
    def run(prompt: str, seed: int) -> list[str]:
        return sums(advance(model, model.init_state("x", prompt, seed), 3))

    base = run("a forest at dawn", 5)
    assert run("a forest at dawn", 5) == base
    assert run("a forest at dawn", 6)[0] != base[0]
    assert run("a city at night", 5)[0] != base[0]


def test_noise_ignores_the_global_rng(model: ReferenceModel) -> None:
    torch.manual_seed(1)
    a = sums(advance(model, model.init_state("g", "p", 9), 2))
    torch.manual_seed(2)
    torch.randn(100)
    assert sums(advance(model, model.init_state("g", "p", 9), 2)) == a


def _mixed_sessions(model: ReferenceModel) -> list[SessionState]:
    """Sessions at different context lengths (0 up to a full window) and conditionings."""
    states = []
    for i, pre in enumerate([0, 1, 2, 5, 3, 0, 7, 1]):
        s = model.init_state(f"m{i}", f"prompt number {i}", seed=100 + i)
        if i % 3 == 0:
            model.apply_input(s, f"steer {i}", seq=1)
        advance(model, s, pre)
        states.append(s)
    return states


def test_output_does_not_depend_on_batch_mates(model: ReferenceModel) -> None:
    """Exact: padding is to the fixed window W, so shapes per session never change."""
    alone = _mixed_sessions(model)
    together = _mixed_sessions(model)
    for _ in range(2):
        solo = [model.run_batch([s])[0] for s in alone]
        batch = model.run_batch(together[::-1])[::-1]
        for a, b in zip(solo, batch):
            assert a.session_id == b.session_id and a.chunk_index == b.chunk_index
            assert torch.equal(a.frames, b.frames) and a.checksum == b.checksum
    for a, b in zip(alone, together):
        assert torch.equal(a.context, b.context) and torch.equal(a.kv, b.kv)  # type: ignore[arg-type]


def test_padding_is_masked_out() -> None:
    """Same weights, window 8 (padded) vs window 2 (never padded): same first chunks.

    Not bitwise: the key axis has a different length, so attention reduces in another
    order; latents agree to float32 rounding.
    """
    wide = ReferenceModel(ModelConfig(context_frames=8), seed=3)
    tight = ReferenceModel(ModelConfig(context_frames=2), seed=3)
    a, b = wide.init_state("p", "q", 1), tight.init_state("p", "q", 1)
    for _ in range(2):  # context 0 then 2 frames: both fit in either window
        wide.run_batch([a])
        tight.run_batch([b])
        torch.testing.assert_close(a.context[-2:], b.context, rtol=1e-5, atol=1e-5)


def test_recache_rebuilds_the_incremental_cache_exactly(model: ReferenceModel) -> None:
    s = model.init_state("rc", "waves", seed=2)
    advance(model, s, 6)
    incremental = s.kv
    s.kv = None
    with torch.inference_mode():
        model._recache([s])
    assert torch.equal(s.kv, incremental)  # type: ignore[arg-type]


def test_apply_input_steers_and_ignores_redeliveries(model: ReferenceModel) -> None:
    a, b = model.init_state("i", "a beach", 4), model.init_state("i", "a beach", 4)
    advance(model, a, 2)
    advance(model, b, 2)
    model.apply_input(a, "now a storm", seq=1)
    assert a.input_seq == 1 and a.kv is None, "new conditioning marks the KV cache stale"
    model.apply_input(a, "ignored duplicate", seq=1)
    model.apply_input(a, "ignored stale", seq=0)
    assert a.inputs == [(1, "now a storm")]
    out_a, out_b = model.run_batch([a, b])
    assert out_a.input_seq == 1 and out_b.input_seq == 0
    assert out_a.checksum != out_b.checksum
    for seq in range(2, 10):
        model.apply_input(a, f"t{seq}", seq)
    assert len(a.inputs) == CFG.input_history and a.inputs[-1] == (9, "t9")


def _plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return isinstance(value, (str, int, float, bytes)) and not isinstance(value, bool)


def test_export_is_compact_plain_data_without_kv(model: ReferenceModel) -> None:
    s = model.init_state("e", "p", seed=1)
    model.apply_input(s, "hello", seq=3)
    advance(model, s, 5)
    data = model.export_state(s)
    assert _plain(data)
    assert "kv" not in data
    ctx = data["context"]
    assert ctx["dtype"] == "float32" and ctx["shape"] == [CFG.context_frames, 4, 8, 8]
    assert len(ctx["data"]) == CFG.context_frames * 4 * 8 * 8 * 4
    assert len(data["rng"]) == 16
    assert model.state_nbytes(s) == len(msgpack.packb(data, use_bin_type=True))
    assert model.state_nbytes(s) < len(ctx["data"]) + 1024
    assert s.kv is not None and model.state_nbytes(s) < s.kv.numel() * 4, "compact < KV cache"


def test_continuity_across_export_import_msgpack_and_fresh_model(
    model: ReferenceModel, tmp_path: Path
) -> None:
    """A moved session's next chunks equal the unmoved one's, bitwise.

    Exact, not within a tolerance: the rebuilt cache runs the same frame-local pass over
    the same frames, positions and conditioning, and a GEMM row's value does not depend
    on how many rows share the call (asserted in the recache test above).
    """
    ckpt = tmp_path / "ref.safetensors"
    model.save(ckpt)
    fresh = ReferenceModel.load(ckpt)
    assert fresh.fingerprint == model.fingerprint

    stay = model.init_state("c", "a train through snow", seed=11)
    model.apply_input(stay, "faster", seq=1)
    advance(model, stay, 3)
    model.apply_input(stay, "into a tunnel", seq=2)
    advance(model, stay, 1)  # the cache now holds incrementally appended frames
    moved = model.import_state(model.export_state(stay))
    wire = msgpack.packb(model.export_state(stay), use_bin_type=True)
    far = fresh.import_state(msgpack.unpackb(wire, raw=False))

    for step in range(6):
        if step == 3:
            for m, s in ((model, stay), (model, moved), (fresh, far)):
                m.apply_input(s, "out into the light", seq=3)
        (o1,), (o2,), (o3,) = model.run_batch([stay]), model.run_batch([moved]), fresh.run_batch([far])
        assert o1.checksum == o2.checksum == o3.checksum
        assert (o1.chunk_index, o1.input_seq) == (o3.chunk_index, o3.input_seq)
    assert torch.equal(stay.kv, far.kv)  # type: ignore[arg-type]


def test_import_rejects_corrupt_or_foreign_snapshots(model: ReferenceModel) -> None:
    s = model.init_state("bad", "p", seed=1)
    advance(model, s, 2)
    good = model.export_state(s)
    truncated = {**good, "context": {**good["context"], "data": good["context"]["data"][:-4]}}
    with pytest.raises(SnapshotCorruptError):
        model.import_state(truncated)
    with pytest.raises(SnapshotCorruptError):
        model.import_state({k: v for k, v in good.items() if k != "rng"})
    with pytest.raises(SnapshotCorruptError):
        model.import_state({**good, "chunk_index": 0})
    with pytest.raises(ConfigError):
        ReferenceModel(CFG, seed=8).import_state(good)


def test_checkpoint_load_rejects_other_files(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "other.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    with pytest.raises(ConfigError):
        ReferenceModel.load(path)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a checkpoint")
    for bad in (garbage, tmp_path / "missing.safetensors"):  # one line at the command line, not a traceback
        with pytest.raises(ConfigError, match="cannot read it as safetensors"):
            ReferenceModel.load(bad)


def test_config_validation() -> None:
    with pytest.raises(ConfigError):
        ModelConfig(d_model=0)
    with pytest.raises(ConfigError):
        ModelConfig(latent_size=9)
    assert ModelConfig.from_json(CFG.to_json()) == CFG


def test_patchify_roundtrip() -> None:
    x = torch.randn(3, 4, 8, 8)
    tok = patchify(x, 2)
    assert tok.shape == (3, 16, 16)
    assert torch.equal(unpatchify(tok, 4, 8, 8, 2), x)


def test_state_to_cpu_is_a_noop_and_cuda_roundtrip_is_exact(model: ReferenceModel) -> None:
    s = model.init_state("d", "p", seed=1)
    advance(model, s, 1)
    ctx = s.context
    assert s.to("cpu") is s and s.context is ctx
    if not torch.cuda.is_available():
        return
    kv = s.kv.clone()  # type: ignore[union-attr]
    s.to("cuda").to("cpu")
    assert s.context.is_pinned() and torch.equal(s.kv, kv)  # type: ignore[arg-type]


def test_run_batch_rejects_a_session_twice(model: ReferenceModel) -> None:
    s = model.init_state("twice", "p", seed=1)
    with pytest.raises(ValueError):
        model.run_batch([s, s])
    assert model.run_batch([]) == []


def test_profile_latency_reports_medians_with_an_injected_clock(model: ReferenceModel) -> None:
    ticks = iter(range(1000))
    lat = profile_latency(model, [1, 2], repeats=3, warmup=0, clock=lambda: float(next(ticks)))
    assert lat == {1: 1.0, 2: 1.0}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["batch", "move", "input"]),
            st.lists(st.integers(0, 3), min_size=1, max_size=4),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_any_schedule_matches_each_session_run_alone(model: ReferenceModel, schedule: list) -> None:
    """Whatever batches, moves and inputs interleave, each session sees its solo history."""
    live = {i: model.init_state(f"h{i}", f"prompt {i}", seed=i) for i in range(4)}
    history: dict[int, list[tuple[str, Any]]] = {i: [] for i in live}
    seen: dict[int, list[str]] = {i: [] for i in live}
    seq = 0
    for op, ids in schedule:
        ids = sorted(set(ids))
        if op == "batch":
            for i, out in zip(ids, model.run_batch([live[i] for i in ids])):
                seen[i].append(out.checksum)
                history[i].append(("chunk", None))
        elif op == "move":
            for i in ids:
                live[i] = model.import_state(msgpack.unpackb(msgpack.packb(model.export_state(live[i]))))
        else:
            seq += 1
            for i in ids:
                model.apply_input(live[i], f"input {seq}", seq)
                history[i].append(("input", seq))
    for i in live:
        solo, got = model.init_state(f"h{i}", f"prompt {i}", seed=i), []
        for kind, arg in history[i]:
            if kind == "chunk":
                got.append(model.run_batch([solo])[0].checksum)
            else:
                model.apply_input(solo, f"input {arg}", arg)
        assert got == seen[i]
