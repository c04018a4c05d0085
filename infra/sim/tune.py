"""Build the autoscaler's volatility table by simulation (``chunkserve tune``).

Per generator level: generate traces at that level, run turboserve with every
(u_target, delta) of the grid applied to all levels, and keep the cheapest setting whose
worst chunk latency meets the bound. The setting is written at the level the detector
reads on those traces (its most frequent level), which is what indexes the table at run
time; when two generator levels read the same, the more conservative setting wins. Levels
with no feasible setting get the most conservative grid point; levels no generator level
reads take their nearest written neighbour's setting (the more conservative one on a tie),
so that a detector reading flipping between neighbours does not flip the pool's size. The
result is processors.autoscaler's VolatilityTable.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Callable, Sequence

from processors.autoscaler import AutoscalerConfig
from processors.volatility import DEFAULT_VOLATILITY_TABLE, VolatilityTable
from processors.latency import LatencyModel

from infra.sim.report import Runner
from infra.sim.simulator import SimConfig
from infra.sim.trace import Trace
from infra.sim.tracegen import GenConfig, generate

__all__ = ["tune", "U_GRID", "DELTA_GRID"]

U_GRID = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.5, 0.4, 0.3, 0.25)
DELTA_GRID = (0.05, 0.1)
# the table is the band u* starts from: tuned without the rule that raises it to the run's
# worst chunk (AutoscalerConfig.follow_worst), which only ever raises it
BASE_BAND = AutoscalerConfig(follow_worst=None)


def tune(
    model: LatencyModel,
    bound_s: float,
    levels: Sequence[int] = tuple(range(1, 11)),
    seeds: Sequence[int] = (0,),
    gen: GenConfig = GenConfig(duration_s=900.0, sessions=1200),
    config: SimConfig = SimConfig(warm_start=True),
    on_step: Callable[[str], None] | None = None,
) -> VolatilityTable:
    """The cheapest (u_target, delta) per level meeting ``bound_s``; every level written by none
    takes its nearest written neighbour's entry (``fill_unread``)."""
    entries = list(DEFAULT_VOLATILITY_TABLE.entries)
    written: set[int] = set()
    band = replace(BASE_BAND, gpu_type=config.gpu_type, boot_s=config.boot_s)  # the pool's type and boot
    for level in levels:
        runners = [Runner(Trace(tuple(generate(replace(gen, level=level, seed=s))), f"level{level}/seed{s}"), model, config) for s in seeds]
        best: tuple[float, float, float] | None = None  # (cost, u, delta)
        for u in U_GRID:
            for d in DELTA_GRID:
                if d >= u:
                    continue
                table = VolatilityTable(((u, d),) * 10)
                if on_step is not None:
                    on_step(f"level {level}: u*={u} delta={d}")
                runs = [r.run("turboserve", None, table=table, autoscaler=band) for r in runners]
                if max(x.worst_chunk_latency_s for x in runs) <= bound_s:
                    cost = sum(x.cost for x in runs)
                    if best is None or cost < best[0]:
                        best = (cost, u, d)
        pick = (best[1], best[2]) if best is not None else (U_GRID[-1], DELTA_GRID[0])
        seen = Counter(sig.level for r in runners for sig in r.signals.signals)  # type: ignore[union-attr]
        read = seen.most_common(1)[0][0] if seen else level
        if read in written and entries[read - 1][0] < pick[0]:
            pick = entries[read - 1]
        entries[read - 1] = pick
        written.add(read)
    return VolatilityTable(fill_unread(tuple(entries), written))


def fill_unread(entries: tuple[tuple[float, float], ...], written: set[int]) -> tuple[tuple[float, float], ...]:
    """Each level not in ``written`` (1-based) takes its nearest written neighbour's entry."""
    if not written:
        return entries
    out = []
    for lvl, entry in enumerate(entries, 1):
        if lvl in written:
            out.append(entry)
            continue
        dist = min(abs(w - lvl) for w in written)
        out.append(min((entries[w - 1] for w in written if abs(w - lvl) == dist), key=lambda e: e[0]))
    return tuple(out)
