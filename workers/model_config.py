"""The reference model's shape (:class:`ModelConfig`), apart so its layers and the model
both import it."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from schemas.errors import ConfigError

__all__ = ["ModelConfig"]


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape of the reference model. Frames are ``latent_size * upsample`` pixels square."""

    latent_channels: int = 4
    latent_size: int = 8
    patch_size: int = 2
    frames_per_chunk: int = 2
    context_frames: int = 8
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    mlp_ratio: int = 4
    denoise_steps: int = 3
    text_buckets: int = 4096
    text_ngrams: tuple[int, ...] = (1, 2, 3)
    input_history: int = 4
    upsample: int = 4
    decoder_hidden: int = 64
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0:
                raise ConfigError(f.name, f"must be positive, got {v}", "ModelConfig")
        if self.latent_size % self.patch_size:
            raise ConfigError("patch_size", "must divide latent_size", "ModelConfig")
        if self.d_model % (2 * self.n_heads):
            raise ConfigError("n_heads", "d_model must split into even-sized heads", "ModelConfig")
        if not self.text_ngrams or min(self.text_ngrams) <= 0:
            raise ConfigError("text_ngrams", "must be positive n-gram sizes", "ModelConfig")

    @property
    def tokens_per_frame(self) -> int:
        return (self.latent_size // self.patch_size) ** 2

    @property
    def frame_size(self) -> int:
        return self.latent_size * self.upsample

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ModelConfig":
        raw = json.loads(text)
        raw["text_ngrams"] = tuple(raw["text_ngrams"])
        return cls(**raw)
