"""The worker's model: the reference model, or one of your own named ``module:Name``.

A model of your own implements :class:`workers.model.StreamingModel`; the sessions it starts
carry what the runtime reads beside it: ``input_seq`` and ``chunk_index`` (ints it keeps),
and ``to(device)`` (moves the state, returns it: an offload takes it to the CPU and back).
Both are checked once, before the worker serves, so a wrong model is one line at its start
instead of a failure at its first session.
"""

from __future__ import annotations

from pathlib import Path
from schemas.errors import ChunkserveError, ConfigError
from streams.plugin import accepted, resolve

from .model import ReferenceModel, StreamingModel

__all__ = ["load_model", "MODEL_ENV"]

MODEL_ENV = "CHUNKSERVE_WORKER_MODEL"
_METHODS = ("init_state", "apply_input", "run_batch", "export_state", "import_state", "state_nbytes")


def load_model(spec: str | None, device: str, checkpoint: Path | None = None,
               source: str = "command line", key: str = "--model") -> StreamingModel:
    """The reference model (its weights from ``checkpoint`` when given) when ``spec`` is None,
    else what ``spec`` names: a model, or a class or factory called with ``device`` when its
    signature takes it. A bad one is a ConfigError naming ``key`` and ``source``."""
    if spec is None:
        return ReferenceModel.load(checkpoint, device=device) if checkpoint else ReferenceModel(seed=0, device=device)

    def refuse(reason: str) -> ConfigError:
        return ConfigError(key, f"{spec}: {reason}", source)

    if checkpoint is not None:
        raise refuse("--checkpoint is the reference model's; a model of your own loads its own weights")
    try:
        factory = resolve(spec, key)
    except ConfigError as exc:
        raise refuse(exc.reason) from None
    try:
        built = isinstance(factory, type) or (callable(factory) and not isinstance(factory, StreamingModel))
        model = factory(**accepted(factory, {"device": device})) if built else factory
        missing = [m for m in _METHODS if not callable(getattr(model, m, None))]
        if missing:
            raise refuse(f"not a StreamingModel: it has no {', '.join(missing)}")
        probe = model.init_state("model-check", "", 0)
    except ChunkserveError:
        raise
    except Exception as exc:  # the model's own code
        raise refuse(f"building it or starting a session raised {type(exc).__name__}: {exc}"[:300]) from None
    lacking = [a for a in ("input_seq", "chunk_index") if type(getattr(probe, a, None)) is not int]
    lacking += [] if callable(getattr(probe, "to", None)) else ["to(device)"]
    if lacking:
        raise refuse(f"its session state lacks what the worker reads: {', '.join(lacking)}")
    return model  # type: ignore[no-any-return]
