"""The reference network's torch pieces: hashed text embedding, adaLN blocks, decoder.

Private to :mod:`workers.model`. Every matmul here works on rows that belong to one
session (or one frame), so a session's numbers do not depend on what else shares a batch.
"""

from __future__ import annotations

import array
import functools
import hashlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .model_config import ModelConfig

__all__ = ["RefNet", "hash_ngrams", "patchify", "unpatchify"]


# a text conditions on its first 4 KiB, as a text encoder reads up to its context: hashing
# every byte of each 64 KiB input (and again with each later one) held the worker's loop for
# seconds, past its heartbeat
MAX_TEXT_BYTES = 4096


def hash_ngrams(texts: list[str], buckets: int, ngrams: tuple[int, ...]) -> list[int]:
    """Bucket ids of every byte n-gram of ``texts`` (each framed by STX/ETX, its first
    ``MAX_TEXT_BYTES`` bytes); stable hash, each text's ids remembered for the next call."""
    ids: list[int] = []
    for text in texts:
        ids.extend(_text_ids(text, buckets, ngrams))
    return ids


@functools.lru_cache(maxsize=256)
def _text_ids(text: str, buckets: int, ngrams: tuple[int, ...]) -> array.array[int]:
    """One text's ids, kept as 8-byte machine integers (a tuple of Python ints took about
    36 bytes an id, up to 110 MB for the cache; this about 25 MB)."""
    data = b"\x02" + text.encode("utf-8")[:MAX_TEXT_BYTES] + b"\x03"
    ids = array.array("q")
    for n in ngrams:
        tag = bytes([n])
        for i in range(len(data) - n + 1):
            digest = hashlib.blake2b(tag + data[i : i + n], digest_size=8).digest()
            ids.append(int.from_bytes(digest, "little") % buckets)
    return ids


def patchify(lat: Tensor, p: int) -> Tensor:
    """``[..., C, h, w]`` latents -> ``[..., (h/p)(w/p), C p p]`` tokens."""
    *lead, c, h, w = lat.shape
    x = lat.reshape(*lead, c, h // p, p, w // p, p)
    n = len(lead)
    x = x.permute(*range(n), n + 1, n + 3, n, n + 2, n + 4)
    return x.reshape(*lead, (h // p) * (w // p), c * p * p)


def unpatchify(tok: Tensor, c: int, h: int, w: int, p: int) -> Tensor:
    """Inverse of :func:`patchify`."""
    *lead, _, _ = tok.shape
    n = len(lead)
    x = tok.reshape(*lead, h // p, w // p, c, p, p)
    x = x.permute(*range(n), n + 2, n, n + 3, n + 1, n + 4)
    return x.reshape(*lead, c, h, w)


def rope_tables(pos: Tensor, dim: int, base: float) -> tuple[Tensor, Tensor]:
    """cos/sin ``[..., dim]`` for integer frame positions ``pos`` (rotary, rotate-half form)."""
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=pos.device) / dim)
    ang = (pos.to(torch.float64).unsqueeze(-1) * inv).to(torch.float32)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-b, a], dim=-1) * sin


class Block(nn.Module):
    """Pre-norm transformer block with adaLN modulation; attends to an optional KV prefix."""

    def __init__(self, d: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc1 = nn.Linear(d, mlp_ratio * d)
        self.fc2 = nn.Linear(mlp_ratio * d, d)

    def forward(
        self,
        x: Tensor,
        mod: Tensor,
        cos: Tensor,
        sin: Tensor,
        prefix: tuple[Tensor, Tensor] | None = None,
        mask: Tensor | None = None,
        last: bool = False,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``x [B,N,d]``, ``mod [B,6,d]``; returns new x and this block's rotated k, v."""
        b, n, d = x.shape
        sh1, sc1, g1, sh2, sc2, g2 = mod.unsqueeze(2).unbind(1)
        h = F.layer_norm(x, (d,)) * (1 + sc1) + sh1
        q, k, v = self.qkv(h).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        if prefix is None:
            a = F.scaled_dot_product_attention(q, k, v)
        else:
            kk = torch.cat([prefix[0], k], dim=2)
            vv = torch.cat([prefix[1], v], dim=2)
            a = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)
        x = x + g1 * self.proj(a.transpose(1, 2).reshape(b, n, d))
        if not last:
            h = F.layer_norm(x, (d,)) * (1 + sc2) + sh2
            x = x + g2 * self.fc2(F.silu(self.fc1(h)))
        return x, k, v


class RefNet(nn.Module):
    """Weights of the reference model; the sampling loop lives in ``ReferenceModel``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, c, p = cfg.d_model, cfg.latent_channels, cfg.patch_size
        self.cfg = cfg
        self.text = nn.EmbeddingBag(cfg.text_buckets, d, mode="mean")
        self.t_fc1 = nn.Linear(d, d)
        self.t_fc2 = nn.Linear(d, d)
        self.ada = nn.Linear(d, cfg.n_layers * 6 * d)
        self.patch_in = nn.Linear(c * p * p, d)
        self.pos = nn.Parameter(torch.zeros(cfg.tokens_per_frame, d))
        self.blocks = nn.ModuleList(Block(d, cfg.n_heads, cfg.mlp_ratio) for _ in range(cfg.n_layers))
        self.head = nn.Linear(d, c * p * p)
        self.dec1 = nn.Linear(c * 9, cfg.decoder_hidden)
        self.dec2 = nn.Linear(cfg.decoder_hidden, 3 * cfg.upsample * cfg.upsample)

    def reset_parameters(self, seed: int) -> None:
        """Seeded init, independent of torch's global RNG: N(0, 1/fan_in) weights."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, prm in sorted(self.named_parameters()):
                if name == "text.weight":
                    std = 1.0
                elif name == "pos":
                    std = 0.5
                elif name.endswith("bias"):
                    std = 0.1 if name.startswith("dec2") else 0.0
                else:
                    std = prm.shape[1] ** -0.5
                if name == "ada.weight":
                    std *= 0.5  # keep gates modest so the residual stream stays near unit scale
                prm.copy_(torch.randn(prm.shape, generator=g) * std)

    def condition(self, ids: list[int]) -> Tensor:
        """Pooled text embedding ``[d]`` of n-gram bucket ids, rescaled to unit RMS."""
        dev = self.pos.device
        t = torch.tensor(ids, dtype=torch.long, device=dev)
        e = self.text(t, torch.zeros(1, dtype=torch.long, device=dev))[0]
        return F.normalize(e, dim=0) * math.sqrt(e.shape[0])

    def modulation(self, cond: Tensor, times: list[float]) -> Tensor:
        """adaLN parameters ``[len(times), layers, 6, d]`` for one session's conditioning."""
        d = self.cfg.d_model
        half = d // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=cond.device) / half)
        t = torch.tensor(times, device=cond.device).unsqueeze(1) * 1000.0 * freqs
        temb = self.t_fc2(F.silu(self.t_fc1(torch.cat([t.cos(), t.sin()], dim=1))))
        mod = self.ada(F.silu(cond.unsqueeze(0) + temb))
        return mod.view(len(times), self.cfg.n_layers, 6, d)

    def denoise(
        self, x: Tensor, mods: Tensor, cos: Tensor, sin: Tensor, prefix_kv: Tensor, mask: Tensor
    ) -> Tensor:
        """One x0 prediction for chunk tokens ``x [B,N,P]`` against padded context KV."""
        f = x.shape[1] // self.cfg.tokens_per_frame
        h = self.patch_in(x) + self.pos.repeat(f, 1)
        for i, blk in enumerate(self.blocks):
            h, _, _ = blk(h, mods[:, i], cos, sin, (prefix_kv[:, i, 0], prefix_kv[:, i, 1]), mask)
        return self.head(F.layer_norm(h, (h.shape[-1],)))

    def encode_context(self, frames: Tensor, mods: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Per-frame KV of clean frames ``[n,T,P]`` (frame-local attention): ``[L,2,n,H,T,dh]``."""
        h = self.patch_in(frames) + self.pos
        ks, vs = [], []
        last = len(self.blocks) - 1
        for i, blk in enumerate(self.blocks):
            h, k, v = blk(h, mods[:, i], cos, sin, last=i == last)
            ks.append(k)
            vs.append(v)
        return torch.stack([torch.stack(ks), torch.stack(vs)], dim=1)

    def decode(self, lat: Tensor) -> Tensor:
        """Latent frames ``[n,C,h,w]`` -> uint8 RGB ``[n, h*u, w*u, 3]``."""
        n, _, h, w = lat.shape
        u = self.cfg.upsample
        cols = F.unfold(lat, kernel_size=3, padding=1).transpose(1, 2)
        y = self.dec2(F.silu(self.dec1(cols)))
        y = y.view(n, h, w, u, u, 3).permute(0, 1, 3, 2, 4, 5).reshape(n, h * u, w * u, 3)
        return (torch.sigmoid(y) * 255.0).round_().to(torch.uint8)
