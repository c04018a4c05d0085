"""A model of your own behind the worker (``--model module:Name``): checked before the worker
serves, each way it can be wrong one line; and the shipped example keeps the worker's contract."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from examples.models.walk import LatentWalk
from schemas.errors import ConfigError
from workers.model import ReferenceModel
from workers.model_plugin import load_model
from workers.null_model import NullModel

ROOT = Path(__file__).resolve().parents[2]


class _Stateless:
    """Every method, but its sessions carry nothing the worker reads."""

    def init_state(self, session_id: str, prompt: str, seed: int) -> object:
        return object()

    apply_input = run_batch = export_state = import_state = state_nbytes = init_state  # type: ignore[assignment]


class _Broken:
    def __init__(self, device: str) -> None:
        raise RuntimeError(f"no weights for {device}")


def test_the_reference_model_is_the_default_and_a_spec_names_a_class_factory_or_model() -> None:
    assert isinstance(load_model(None, "cpu"), ReferenceModel)
    assert isinstance(load_model("workers.null_model:NullModel", "cpu"), NullModel)  # a class, no device taken
    assert isinstance(load_model("examples.models.walk:LatentWalk", "cpu"), LatentWalk)  # given device=


@pytest.mark.parametrize("spec, said", [
    ("no_such_module:Model", "cannot import 'no_such_module'"),
    ("workers.null_model:Nothing", "has no 'Nothing'"),
    ("workers.null_model", "expected module:Name"),
    ("tests.workers.test_model_plugin:ROOT", "not a StreamingModel: it has no init_state"),
    ("tests.workers.test_model_plugin:_Stateless", "lacks what the worker reads: input_seq, chunk_index, to(device)"),
    ("tests.workers.test_model_plugin:_Broken", "raised RuntimeError: no weights for cpu"),
])
def test_a_model_that_cannot_serve_is_one_line_naming_the_spec_and_where_it_came_from(spec: str, said: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_model(spec, "cpu", source="env CHUNKSERVE_WORKER_MODEL", key="model")
    assert str(err.value).startswith(f"env CHUNKSERVE_WORKER_MODEL: model: {spec}: ") and said in str(err.value)
    assert "\n" not in str(err.value)


def test_a_checkpoint_is_the_reference_models_only() -> None:
    with pytest.raises(ConfigError, match="--checkpoint is the reference model's"):
        load_model("examples.models.walk:LatentWalk", "cpu", Path("weights.safetensors"))


def test_the_worker_command_refuses_a_bad_model_in_one_line_before_it_asks_for_a_broker() -> None:
    done = subprocess.run([sys.executable, "-m", "infra", "worker", "--worker-id", "w", "--model", "no_such_module:M"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(ROOT)})  # no broker or Redis named
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "command line: --model: no_such_module:M: cannot import" in done.stderr.replace("\n", " ")


def test_the_example_model_keeps_the_contract_batch_restore_and_device_alike() -> None:
    """A session's chunks depend on that session alone: alone or batched with others, and
    exported and imported half way (a snapshot, a migration), it makes the same frames."""
    model = LatentWalk("cpu")

    def run(states: list, chunks: int) -> list[str]:
        return [o.checksum for _ in range(chunks) for o in model.run_batch(states)][:: len(states)]

    alone = model.init_state("a", "a paper boat", 7)
    model.apply_input(alone, "turn left", 1)
    solo = run([alone], 6)
    batched, other = model.init_state("a", "a paper boat", 7), model.init_state("b", "another", 8)
    model.apply_input(batched, "turn left", 1)
    first = run([batched, other], 3)
    moved = model.import_state(model.export_state(batched)).to("cpu")
    assert first + run([moved], 3) == solo and len(set(solo)) == 6
    assert (moved.input_seq, moved.chunk_index) == (1, 6) and model.state_nbytes(moved) > 0
    out = model.run_batch([model.init_state("c", "", 0)])[0]
    assert out.frames.dtype.is_floating_point is False and out.frames.shape == (2, 32, 32, 3)
