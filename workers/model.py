"""The streaming-model interface the worker runtime drives, and the reference model behind it.

A model advances sessions chunk by chunk. ``run_batch`` coalesces every ready session into
one batched forward pass; ``export_state`` / ``import_state`` move the *compact* state
(context latents, inputs, RNG, chunk index) and rebuild the KV cache from it on arrival
(LongLive's KV-recache), so the portable snapshot is kilobytes, not the cache.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

import msgpack
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file
from torch import Tensor

from schemas.errors import ConfigError, SnapshotCorruptError

from . import _codec
from ._layers import RefNet, hash_ngrams, patchify, rope_tables, unpatchify
from .model_config import ModelConfig

__all__ = [
    "ChunkOutput",
    "ModelConfig",
    "ReferenceModel",
    "SessionState",
    "StreamingModel",
    "profile_latency",
]

_U64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class ChunkOutput:
    """One chunk of one session: ``frames`` is uint8 ``[F,H,W,3]`` on the CPU."""

    session_id: str
    chunk_index: int
    input_seq: int
    frames: Tensor
    checksum: str  # sha256 hex of the frame bytes


@dataclass(slots=True, eq=False)
class SessionState:
    """One session's state region; only ``export_state``'s compact part is portable.

    ``context`` holds the last ``<= W`` clean latent frames ``[n,C,h,w]``; ``kv`` their
    per-layer keys/values ``[L,2,H,n*T,dh]`` (``None``: stale, rebuilt before the next
    chunk); ``mods`` the adaLN parameters derived from the conditioning.
    """

    session_id: str
    prompt: str
    seed: int
    context: Tensor
    cond: Tensor
    mods: Tensor
    kv: Tensor | None
    inputs: list[tuple[int, str]] = field(default_factory=list)
    input_seq: int = 0
    chunk_index: int = 0
    rng_counter: int = 0
    last_checksum: str = ""
    generator: torch.Generator = field(default_factory=torch.Generator)  # CPU: noise is device-portable

    @property
    def device(self) -> torch.device:
        return self.context.device

    def to(self, device: torch.device | str) -> "SessionState":
        """Move the tensors (in place; returns self). CUDA -> CPU lands in pinned memory."""
        dev = _resolve(device)
        from_cuda = self.context.is_cuda
        self.context = _move(self.context, dev)
        self.cond = _move(self.cond, dev)
        self.mods = _move(self.mods, dev)
        self.kv = None if self.kv is None else _move(self.kv, dev)
        if from_cuda and dev.type == "cpu":
            torch.cuda.synchronize()  # the non-blocking copies into pinned memory must land
        return self


def _resolve(device: torch.device | str) -> torch.device:
    """``"cuda"`` means the current CUDA device; name its index so comparisons hold."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return dev


def _move(t: Tensor, dev: torch.device) -> Tensor:
    if t.device == dev:
        return t
    if t.is_cuda and dev.type == "cpu" and torch.cuda.is_available():
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        return host.copy_(t, non_blocking=True)
    return t.to(dev, non_blocking=t.is_pinned())


@runtime_checkable
class StreamingModel(Protocol):
    """What the worker runtime needs from a model; real models plug in behind it.

    Contract: a session's outputs depend only on its own seed, prompt, inputs and chunk
    count, never on its batch mates or on having been exported and imported.
    """

    def init_state(self, session_id: str, prompt: str, seed: int) -> SessionState:
        """A fresh session at chunk 0 with no context."""
        ...

    def apply_input(self, state: SessionState, text: str, seq: int) -> None:
        """Update the conditioning and record ``seq`` as the applied input seq."""
        ...

    def run_batch(self, states: list[SessionState]) -> list[ChunkOutput]:
        """Advance each state by exactly one chunk in one coalesced pass; outputs in order."""
        ...

    def export_state(self, state: SessionState) -> dict[str, Any]:
        """The compact portable state as msgpack-ready plain data (no KV cache)."""
        ...

    def import_state(self, data: dict[str, Any]) -> SessionState:
        """Rebuild a session (KV cache recomputed from context) from ``export_state``."""
        ...

    def state_nbytes(self, state: SessionState) -> int:
        """Size in bytes of the compact state."""
        ...


def _checkpoint_meta(path: str | Path) -> dict[str, str]:
    """A safetensors checkpoint's metadata, or ConfigError (missing, unreadable, not safetensors)."""
    try:
        with safe_open(str(path), framework="pt") as fh:
            return fh.metadata() or {}
    except (OSError, SafetensorError) as exc:
        raise ConfigError("checkpoint", f"{path}: cannot read it as safetensors ({exc})", "load") from None


def _load_weights(net: torch.nn.Module, path: str | Path) -> None:
    """The checkpoint's weights into ``net``, or ConfigError (weights of another shape or name)."""
    try:
        net.load_state_dict(load_file(str(path)), strict=True)
    except (OSError, SafetensorError, RuntimeError) as exc:
        raise ConfigError("checkpoint", f"{path}: its weights do not fit its config ({exc})"[:400], "load") from None


class ReferenceModel:
    """Small causal latent-video transformer: rolling KV over context frames, few-step
    flow denoising per chunk conditioned on a hashed-n-gram text embedding, tiny decoder.

    Batch invariance: every session's tensors have the same shapes in any batch (context
    KV is padded to the full window W and masked, never to the batch's longest), and no
    reduction crosses sessions, so on one device and build a session's output is bitwise
    the same alone or in any batch. The tests assert exact equality on CPU; on GPUs a
    BLAS that picks split-K kernels by batch size can break this to ~1e-6 relative.
    """

    def __init__(
        self, config: ModelConfig | None = None, seed: int = 0, device: str | torch.device = "cpu"
    ) -> None:
        self.config = config or ModelConfig()
        self.device = _resolve(device)
        self.net = RefNet(self.config)
        self.net.reset_parameters(seed)
        self.net.to(self.device).eval()
        steps = self.config.denoise_steps
        self._times = [1.0 - i / steps for i in range(steps)] + [0.0]  # last: clean, for the cache
        self.fingerprint = self._fingerprint()

    # -- checkpoints -------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Write weights and config to a safetensors checkpoint."""
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in self.net.state_dict().items()}
        meta = {"chunkserve.model": "reference", "config": self.config.to_json()}
        save_file(tensors, str(path), metadata=meta)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> "ReferenceModel":
        """Build a model from a checkpoint written by :meth:`save`."""
        meta = _checkpoint_meta(path)
        if meta.get("chunkserve.model") != "reference" or "config" not in meta:
            raise ConfigError("checkpoint", f"{path} is not a reference-model checkpoint", "load")
        try:
            config = ModelConfig.from_json(meta["config"])
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError("checkpoint", f"{path}: bad config metadata ({exc})", "load") from exc
        model = cls(config, seed=0, device="cpu")
        _load_weights(model.net, path)
        model.device = _resolve(device)
        model.net.to(model.device)
        model.fingerprint = model._fingerprint()
        return model

    def _fingerprint(self) -> str:
        h = hashlib.sha256(self.config.to_json().encode())
        for name, t in sorted(self.net.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()[:16]

    # -- sessions ----------------------------------------------------------------------

    def init_state(self, session_id: str, prompt: str, seed: int) -> SessionState:
        cfg = self.config
        lat = cfg.latent_size
        ctx = torch.empty(0, cfg.latent_channels, lat, lat, device=self.device)
        st = SessionState(session_id, prompt, seed & _U64, context=ctx, cond=ctx, mods=ctx, kv=None)
        self._condition(st)
        return st

    def apply_input(self, state: SessionState, text: str, seq: int) -> None:
        """Steer with ``text``; inputs at or below the applied seq are ignored (redeliveries).

        The KV cache is marked stale and rebuilt under the new conditioning before the next
        chunk, in one batched pass with any other stale sessions.
        """
        if seq <= state.input_seq:
            return
        state.inputs = (state.inputs + [(seq, text)])[-self.config.input_history :]
        state.input_seq = seq
        self._condition(state)

    def _condition(self, st: SessionState) -> None:
        cfg = self.config
        ids = hash_ngrams([st.prompt] + [t for _, t in st.inputs], cfg.text_buckets, cfg.text_ngrams)
        with torch.inference_mode():
            st.cond = self.net.condition(ids)
            st.mods = self.net.modulation(st.cond, self._times)
        st.kv = None

    def run_batch(self, states: list[SessionState]) -> list[ChunkOutput]:
        """Advance every state by one chunk in one batched pass (see the class docstring)."""
        if not states:
            return []
        if len({id(s) for s in states}) != len(states):
            raise ValueError("a session appears twice in one batch")
        for s in states:
            if s.device != self.device:
                raise ValueError(f"session {s.session_id} is on {s.device}, model on {self.device}")
        with torch.inference_mode():
            self._recache([s for s in states if s.kv is None])
            return self._step(states)

    def _step(self, states: list[SessionState]) -> list[ChunkOutput]:
        cfg, net, dev = self.config, self.net, self.device
        b, f, t_, w = len(states), cfg.frames_per_chunk, cfg.tokens_per_frame, cfg.context_frames
        heads, dh, steps = cfg.n_heads, cfg.d_model // cfg.n_heads, cfg.denoise_steps
        p = cfg.latent_channels * cfg.patch_size**2
        # Context KV padded to the full window (never to the batch's longest) plus a key mask.
        kv = torch.zeros(b, cfg.n_layers, 2, heads, w * t_, dh, device=dev)
        valid = torch.zeros(b, w * t_ + f * t_, dtype=torch.bool, device=dev)
        valid[:, w * t_ :] = True
        for i, s in enumerate(states):
            m = s.kv.shape[3]  # type: ignore[union-attr]
            kv[i, :, :, :, :m] = s.kv
            valid[i, :m] = True
        mask = valid[:, None, None, :]
        starts = torch.tensor([s.chunk_index * f for s in states], device=dev)
        frame_pos = starts[:, None] + torch.arange(f, device=dev)  # [B,F] absolute frame index
        cos, sin = rope_tables(frame_pos.repeat_interleave(t_, dim=1), dh, cfg.rope_base)
        cos, sin = cos[:, None], sin[:, None]
        noise = torch.stack([self._noise(s, (steps, f * t_, p)) for s in states]).to(dev)
        mods = torch.stack([s.mods for s in states])  # [B, steps+1, L, 6, d]
        x = noise[:, 0]
        for k in range(steps):
            x0 = net.denoise(x, mods[:, k], cos, sin, kv, mask)
            if k + 1 < steps:
                t_next = self._times[k + 1]
                x = (1.0 - t_next) * x0 + t_next * noise[:, k + 1]
        clean = x0.reshape(b * f, t_, p)
        # New frames' KV: the same frame-local pass _recache runs, so a rebuilt cache matches.
        fcos, fsin = rope_tables(frame_pos.reshape(b * f, 1), dh, cfg.rope_base)
        fmods = mods[:, steps].repeat_interleave(f, dim=0)
        new_kv = net.encode_context(clean, fmods, fcos[:, None], fsin[:, None])
        c, lat = cfg.latent_channels, cfg.latent_size
        lats = unpatchify(clean, c, lat, lat, cfg.patch_size)
        frames = net.decode(lats).to("cpu").view(b, f, cfg.frame_size, cfg.frame_size, 3)
        lats = lats.view(b, f, c, lat, lat)
        outs = []
        for i, s in enumerate(states):
            s_kv = new_kv[:, :, i * f : (i + 1) * f].transpose(2, 3)
            s_kv = s_kv.reshape(cfg.n_layers, 2, heads, f * t_, dh)
            s.kv = torch.cat([s.kv, s_kv], dim=3)[:, :, :, -w * t_ :].contiguous()  # type: ignore[list-item]
            s.context = torch.cat([s.context, lats[i]])[-w:].contiguous()
            fr = frames[i].clone()
            s.last_checksum = hashlib.sha256(fr.numpy().tobytes()).hexdigest()
            outs.append(ChunkOutput(s.session_id, s.chunk_index, s.input_seq, fr, s.last_checksum))
            s.chunk_index += 1
        return outs

    def _noise(self, s: SessionState, shape: tuple[int, ...]) -> Tensor:
        """Draw from the session's counter-based stream: seed and draw count fix the numbers."""
        s.generator.manual_seed(_splitmix64(s.seed ^ _splitmix64(s.rng_counter)))
        s.rng_counter += 1
        return torch.randn(shape, generator=s.generator)

    def _recache(self, states: list[SessionState]) -> None:
        """Rebuild the KV cache of ``states`` from their context frames, in one pass."""
        if not states:
            return
        cfg = self.config
        dh, t_, f = cfg.d_model // cfg.n_heads, cfg.tokens_per_frame, cfg.frames_per_chunk
        counts = [s.context.shape[0] for s in states]
        if sum(counts) == 0:
            for s in states:
                s.kv = torch.empty(cfg.n_layers, 2, cfg.n_heads, 0, dh, device=self.device)
            return
        frames = patchify(torch.cat([s.context for s in states]), cfg.patch_size)
        ends = [s.chunk_index * f for s in states]  # context frames are the last n before this
        pos = torch.cat([torch.arange(e - n, e) for e, n in zip(ends, counts)])
        cos, sin = rope_tables(pos.to(self.device).reshape(-1, 1), dh, cfg.rope_base)
        mods = torch.cat([s.mods[-1:].expand(n, -1, -1, -1) for s, n in zip(states, counts)])
        kv = self.net.encode_context(frames, mods, cos[:, None], sin[:, None])
        start = 0
        for s, n in zip(states, counts):
            part = kv[:, :, start : start + n]
            s.kv = part.transpose(2, 3).reshape(cfg.n_layers, 2, cfg.n_heads, n * t_, dh).contiguous()
            start += n

    # -- compact state -----------------------------------------------------------------

    def export_state(self, state: SessionState) -> dict[str, Any]:
        """The portable state: msgpack-ready plain data, no KV cache."""
        return {
            "kind": _codec.KIND,
            "version": _codec.VERSION,
            "model": self.fingerprint,
            "session_id": state.session_id,
            "prompt": state.prompt,
            "inputs": [[seq, text] for seq, text in state.inputs],
            "input_seq": state.input_seq,
            "chunk_index": state.chunk_index,
            "context": _codec.tensor_to_record(state.context),
            "rng": _codec.pack_rng(state.seed, state.rng_counter),
            "last_checksum": state.last_checksum,
        }

    def import_state(self, data: dict[str, Any], kv: Tensor | None = None) -> SessionState:
        """Rebuild a session from :meth:`export_state` output, KV cache included: recomputed
        from the context (KV-recache), or ``kv`` as moved device-to-device by ``transfer``."""
        fld = _codec.field
        if fld(data, "kind", str) != _codec.KIND or fld(data, "version", int) != _codec.VERSION:
            raise SnapshotCorruptError(f"not a {_codec.KIND} v{_codec.VERSION} snapshot")
        if fld(data, "model", str) != self.fingerprint:
            reason = f"snapshot is for model {data['model']}, this is {self.fingerprint}"
            raise ConfigError("model", reason, "snapshot")
        cfg = self.config
        ctx = _codec.tensor_from_record(fld(data, "context", dict), "context")
        lat = cfg.latent_size
        if ctx.dtype != torch.float32 or ctx.dim() != 4 or ctx.shape[0] > cfg.context_frames or tuple(
            ctx.shape[1:]
        ) != (cfg.latent_channels, lat, lat):
            raise SnapshotCorruptError(f"context: shape {list(ctx.shape)} does not fit this model")
        inputs = []
        for item in fld(data, "inputs", list):
            ok = isinstance(item, list) and len(item) == 2
            if not (ok and isinstance(item[0], int) and isinstance(item[1], str)):
                raise SnapshotCorruptError("inputs: expected [seq, text] pairs")
            inputs.append((item[0], item[1]))
        seed, counter = _codec.unpack_rng(fld(data, "rng", bytes))
        chunk_index = fld(data, "chunk_index", int)
        if chunk_index < 0 or ctx.shape[0] > chunk_index * cfg.frames_per_chunk:
            raise SnapshotCorruptError(f"chunk_index {chunk_index} cannot follow {ctx.shape[0]} context frames")
        ctx = ctx.to(self.device)
        st = SessionState(
            session_id=fld(data, "session_id", str),
            prompt=fld(data, "prompt", str),
            seed=seed,
            context=ctx,
            cond=ctx,  # placeholders until _condition
            mods=ctx,
            kv=None,
            inputs=inputs,
            input_seq=fld(data, "input_seq", int),
            chunk_index=chunk_index,
            rng_counter=counter,
            last_checksum=fld(data, "last_checksum", str),
        )
        self._condition(st)
        if kv is not None:
            want = (cfg.n_layers, 2, cfg.n_heads, ctx.shape[0] * cfg.tokens_per_frame)
            if kv.dim() != 5 or tuple(kv.shape[:4]) != want:
                raise SnapshotCorruptError(f"kv: shape {list(kv.shape)} does not fit {ctx.shape[0]} context frames")
            st.kv = kv.to(self.device)
            return st
        with torch.inference_mode():
            self._recache([st])
        return st

    def state_nbytes(self, state: SessionState) -> int:
        """Bytes of the msgpack-packed compact state (what a snapshot stores)."""
        return len(msgpack.packb(self.export_state(state), use_bin_type=True))


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _U64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _U64
    return x ^ (x >> 31)


def profile_latency(
    model: StreamingModel,
    batch_sizes: list[int],
    repeats: int = 10,
    warmup: int = 2,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[int, float]:
    """Median seconds of one ``run_batch`` call at each batch size (fresh sessions each)."""
    result: dict[int, float] = {}
    for b in batch_sizes:
        states = [model.init_state(f"profile-{b}-{i}", f"profile prompt {i}", seed=i) for i in range(b)]
        for _ in range(warmup):
            model.run_batch(states)
        times = []
        for _ in range(repeats):
            t0 = clock()
            model.run_batch(states)
            times.append(clock() - t0)
        result[b] = statistics.median(times)
    return result
