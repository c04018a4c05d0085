"""CLI command ``place``: one placement decision on a snapshot given as JSON.

``register(app)`` adds it to the main app. A bad file or field prints one line naming the
file and the field, and exits 2; never a traceback.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from infra.outputs import json_option, writable
from processors.decisions import Migrate
from processors.latency import MAX_BATCH, MAX_CAPACITY, MAX_POINTS, MAX_TYPES, GpuProfile, LatencyModel, batch_key
from processors.oracles import plan_objective
from processors.placement import RebalanceConfig, plan_placement
from processors.snapshot import Gpu, Session, Snapshot
from processors.turboserve import TURBOSERVE_REBALANCE
from schemas.errors import ChunkserveError, ConfigError
from schemas.json_values import document, number, whole

__all__ = ["register", "parse_instance", "decide"]

_err = Console(stderr=True, emoji=False, soft_wrap=True)
_UNBOUNDED = 1 << 62  # max_moves absent: no move budget
_MAX_NUMBER = 1e9  # seconds, eta, seconds per byte: past this an answer is no longer a number
_MAX_COUNT = 1 << 53  # bytes, moves, capacities: exact as JSON numbers up to here
MAX_FILE_BYTES = 64 << 20  # a snapshot file (a pool of 1,024 GPUs and 16,000 sessions is about 1 MB)
MAX_INSTANCES = 10_000  # in one batch
_KEYS = {"": {"eta", "alpha_s", "beta_s_per_byte", "gpu_types", "gpus", "sessions", "max_moves", "max_transient_s"},
         "gpu_type": {"capacity", "latency"}, "gpu": {"id", "type"}, "session": {"id", "gpu", "state_bytes"}}


def _number(doc: dict, key: str, where: str, src: str) -> float:
    if key not in doc:
        raise ConfigError(f"{where}{key}", "is required", src)
    return number(doc[key], f"{where}{key}", src, 0, _MAX_NUMBER)


def _count(v: Any, key: str, src: str, least: int, most: int = _MAX_COUNT) -> int:
    if v is None:
        raise ConfigError(key, "is required", src)
    return whole(v, key, src, least, most)


def _known(doc: dict, kind: str, at: str, src: str) -> None:
    """A key the format does not have is refused (a typo would silently change the problem)."""
    extra = sorted(set(doc) - _KEYS[kind])
    if extra:
        raise ConfigError(f"{at}{'.' if at and not at.endswith('.') else ''}{extra[0]}",
                          f"not a key of this format (it has {', '.join(sorted(_KEYS[kind]))})", src)


def _obj(v: Any, key: str, src: str) -> dict:
    if not isinstance(v, dict):
        raise ConfigError(key, "is required (an object)" if v is None else "must be an object", src)
    return v


def _list(v: Any, key: str, src: str) -> list:
    if not isinstance(v, list):
        raise ConfigError(key, "is required (a list)" if v is None else "must be a list", src)
    return v


def _name(v: Any, key: str, src: str) -> str:
    if not isinstance(v, str) or not v:
        raise ConfigError(key, "must be a non-empty string", src)
    return v


def _profile(name: str, spec: Any, at: str, src: str) -> GpuProfile:
    spec = _obj(spec, at, src)
    _known(spec, "gpu_type", at, src)
    cap = _count(spec.get("capacity"), f"{at}.capacity", src, 1, MAX_CAPACITY)
    table = _obj(spec.get("latency"), f"{at}.latency", src)
    if not 1 <= len(table) <= MAX_POINTS:
        raise ConfigError(f"{at}.latency", f"needs 1 to {MAX_POINTS} points", src)
    points = []
    for k, v in table.items():
        if not batch_key(k) or not 1 <= int(k) <= MAX_BATCH:
            raise ConfigError(f"{at}.latency", f"key {k[:20]!r} is not a batch size from 1 to {MAX_BATCH}", src)
        points.append((int(k), number(v, f"{at}.latency.{k}", src, 0, _MAX_NUMBER, above=True)))
    try:
        return GpuProfile(name, cap, 0.0, tuple(sorted(points)))
    except ConfigError as exc:
        raise ConfigError(f"{at}.latency", str(exc).rsplit(": ", 1)[-1], src) from None


def parse_instance(doc: Any, src: str, where: str = "") -> tuple[Snapshot, LatencyModel, RebalanceConfig]:
    """One instance of the input document as a snapshot, latency model and settings."""
    doc = _obj(doc, where.rstrip(".") or "document", src)
    _known(doc, "", where, src)
    # The problem as the document states it: min L + eta * sum(kappa), every move allowed.
    # The live controller also bounds a round by a move budget and a transient limit
    # (TURBOSERVE_REBALANCE); a document that names them gets exactly its decision.
    limit = doc.get("max_transient_s")
    if limit is not None:
        limit = _number({"max_transient_s": limit}, "max_transient_s", where, src)
    moves = doc.get("max_moves")
    cfg = RebalanceConfig(
        eta=_number(doc, "eta", where, src),
        alpha_s=_number(doc, "alpha_s", where, src),
        beta_s_per_byte=_number(doc, "beta_s_per_byte", where, src),
        max_moves=_UNBOUNDED if moves is None else _count(moves, f"{where}max_moves", src, 0),
        drain_max_kappa_s=TURBOSERVE_REBALANCE.drain_max_kappa_s,
        max_transient_s=math.inf if limit is None else limit,
    )
    types = _obj(doc.get("gpu_types"), f"{where}gpu_types", src)
    if not types:
        raise ConfigError(f"{where}gpu_types", "must name at least one GPU type", src)
    if len(types) > MAX_TYPES:
        raise ConfigError(f"{where}gpu_types", f"at most {MAX_TYPES} GPU types", src)
    model = LatencyModel({n: _profile(n, spec, f"{where}gpu_types.{n}", src) for n, spec in types.items()}, src)
    gpus: list[Gpu] = []
    for i, g in enumerate(_list(doc.get("gpus"), f"{where}gpus", src)):
        at = f"{where}gpus[{i}]"
        g = _obj(g, at, src)
        _known(g, "gpu", at, src)
        gid, gtype = _name(g.get("id"), f"{at}.id", src), _name(g.get("type"), f"{at}.type", src)
        if gtype not in types:
            raise ConfigError(f"{at}.type", f"no GPU type {gtype!r} in gpu_types", src)
        if any(x.id == gid for x in gpus):
            raise ConfigError(f"{at}.id", f"duplicate GPU id {gid!r}", src)
        gpus.append(Gpu(gid, gtype))
    known = {g.id for g in gpus}
    sessions: list[Session] = []
    seen: set[str] = set()
    for i, s in enumerate(_list(doc.get("sessions"), f"{where}sessions", src)):
        at = f"{where}sessions[{i}]"
        s = _obj(s, at, src)
        _known(s, "session", at, src)
        sid = _name(s.get("id"), f"{at}.id", src)
        if sid in seen:
            raise ConfigError(f"{at}.id", f"duplicate session id {sid!r}", src)
        seen.add(sid)
        if "gpu" not in s:  # read as an arrival, a session left out by mistake moved at no cost
            raise ConfigError(f"{at}.gpu", "is required (a GPU id, or null for a session arriving this round)", src)
        gpu = s["gpu"]
        if gpu is not None and not isinstance(gpu, str):
            raise ConfigError(f"{at}.gpu", "must be a GPU id (a string) or null", src)
        if gpu is not None and gpu not in known:
            raise ConfigError(f"{at}.gpu", f"no GPU {gpu!r} in gpus", src)
        sessions.append(Session(sid, _count(s.get("state_bytes"), f"{at}.state_bytes", src, 0), gpu_id=gpu))
    held = Counter(s.gpu_id for s in sessions if s.gpu_id is not None)
    for g in gpus:  # no GPU holds more than its type's capacity: such a snapshot is not a state
        if held[g.id] > model[g.type].capacity:
            raise ConfigError(f"{where}sessions", f"{held[g.id]} on GPU {g.id!r}, over its type's capacity "
                              f"{model[g.type].capacity}", src)
    return Snapshot(0.0, tuple(gpus), tuple(sessions)), model, cfg


def _one(doc: Any, src: str, where: str = "") -> dict:
    snap, model, cfg = parse_instance(doc, src, where)
    plan = plan_placement(snap, model, cfg)
    where_now: dict[str, Optional[str]] = {s.id: s.gpu_id for s in snap.sessions}
    for c in plan.commands:
        where_now[c.session_id] = c.dst if isinstance(c, Migrate) else c.gpu_id  # type: ignore[attr-defined]
    for sid in plan.unplaced:
        where_now[sid] = None
    return {
        "placement": where_now,
        "moved": [c.session_id for c in plan.commands if isinstance(c, Migrate)],
        "worst_latency_s": plan.worst_after,
        "objective": plan_objective(plan, cfg),
    }


def decide(doc: Any, src: str) -> dict:
    """The decision for one instance, or ``{"results": [...]}`` for ``{"instances": [...]}``."""
    if isinstance(doc, dict) and "instances" in doc:
        if set(doc) != {"instances"}:
            raise ConfigError(sorted(set(doc) - {"instances"})[0], "a batch holds only \"instances\"", src)
        batch = _list(doc["instances"], "instances", src)
        if len(batch) > MAX_INSTANCES:
            raise ConfigError("instances", f"at most {MAX_INSTANCES:,} in one batch (split the file)", src)
        return {"results": [_one(d, src, f"instances[{i}].") for i, d in enumerate(batch)]}
    return _one(doc, src)


def no_room_notes(out: dict) -> list[str]:
    """One line per instance with sessions placed null for want of room; a batch's name the
    instance by its 0-based index in ``instances``."""
    results = out.get("results")
    counted = [(f"instances[{i}] (0-based): ", r) for i, r in enumerate(results)] if results is not None else [("", out)]
    notes = []
    for at, r in counted:
        if homeless := sum(g is None for g in r["placement"].values()):
            notes.append(f"note: {at}{homeless} session(s) found no room (more arrivals than free capacity): placement null")
    return notes


def place_cmd(
    snapshot: Path = typer.Argument(..., help="Snapshot JSON: eta, alpha_s, beta_s_per_byte, gpu_types, gpus, sessions; or {\"instances\": [...]}. Optional: max_moves and max_transient_s (default: none; the live controller runs 512 and 1.4)."),
    json_out: Optional[Path] = json_option("Write the decision here (default: stdout)."),
) -> None:
    """One placement decision: where every session goes, what moves, worst latency, objective."""
    src = str(snapshot)
    try:
        writable(reads=[snapshot], json=json_out)
        try:
            if snapshot.stat().st_size > MAX_FILE_BYTES:
                raise ConfigError("file", f"larger than {MAX_FILE_BYTES >> 20} MiB (split a batch into files)", src)
            text = snapshot.read_text(encoding="utf-8-sig")  # a BOM, as some editors write, is no error
        except OSError as exc:
            raise ConfigError("file", f"cannot read ({exc.strerror})", src) from None
        except UnicodeDecodeError:
            raise ConfigError("file", "not a UTF-8 text file", src) from None
        doc = document(text, "file", src)
        out = decide(doc, src)
        body = json.dumps(out, indent=2) + "\n"
        for note in no_room_notes(out):
            _err.print(note, highlight=False, soft_wrap=True)
        if json_out is None:
            typer.echo(body, nl=False)
        else:
            json_out.write_text(body)
    except ChunkserveError as exc:
        _err.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    except OSError as exc:
        _err.print(f"[red]error:[/red] {json_out}: cannot write ({exc.strerror})", highlight=False, soft_wrap=True)
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    """Add ``place`` to ``app``."""
    app.command("place")(place_cmd)
