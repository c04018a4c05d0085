"""The autoscaler's configuration and state, as data: a stated SLO, the knobs, and what a
decision leaves for the next (a new leader resumes it from the log)."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.errors import ConfigError

__all__ = ["Slo", "AutoscalerConfig", "AutoscalerState", "Recent"]

# per bucket of the burst memory, oldest first: (index, fewest, most executing sessions, rise into it)
Recent = tuple[tuple[int, int, int, int], ...]


@dataclass(frozen=True, slots=True)
class Slo:
    """A service level users state: at most ``miss_rate`` of chunks past their deadline and
    no chunk slower than ``worst_s`` seconds."""

    miss_rate: float = 0.001
    worst_s: float = 3.0

    def __post_init__(self) -> None:
        if not (0 <= self.miss_rate < 1 and self.worst_s > 0):
            raise ConfigError("slo", "need 0 <= miss_rate < 1 and worst_s > 0", "slo")

    def met(self, miss_rate: float, worst_s: float) -> bool:
        """Whether a run with this miss rate and worst chunk latency meets the SLO."""
        return miss_rate <= self.miss_rate + 1e-12 and worst_s <= self.worst_s + 1e-9


@dataclass(frozen=True, slots=True)
class AutoscalerConfig:
    """Pool bounds, the GPU type to add, dwell between actions, boot time and scale-in delay (s),
    and how long the burst reserve remembers a rise (0: no reserve).

    ``scale_in_delay_s`` None means ``boot_s``.
    """

    gpu_type: str = "b300"
    # two, not one: a pool of one has nowhere to put its sessions while its GPU fails and
    # another boots, and no room for a crowd the burst reserve has not yet seen (N + 1)
    min_gpus: int = 2
    max_gpus: int = 1024
    dwell_s: float = 30.0
    boot_s: float = 60.0
    scale_in_delay_s: float | None = None
    burst_memory_s: float = 900.0  # 0: no burst reserve
    burst_bucket_s: float = 5.0
    reserve_at_capacity: bool = True  # the reserve takes full GPUs' slots, not slots at u*
    burst_decay: bool = True  # a rise counts less as it ages (linearly, to 0 at burst_memory_s)
    burst_utilization: float | None = 0.75  # a rise filling GPUs up to this needs no reserve (None: any rise does)
    slo: Slo | None = None  # SLO feedback on measured chunks (None: off)
    slo_step_s: float = 60.0
    headroom_start: float = 0.6
    headroom_down: float = 0.9
    headroom_up: float = 1.03
    headroom_min: float = 0.3
    headroom_max: float = 1.6
    # with an SLO: u* no lower than the load per GPU at which first chunks (the activations
    # of the last burst memory, at their mean step's rate) would miss this share of the SLO's
    # rate, once that many seconds have been watched and while the run is within its budget
    # (None: off)
    slo_floor_share: float | None = 0.8
    slo_floor_after_s: float = 300.0
    # the floor reads the busiest step's starts of the burst memory instead of their mean
    slo_floor_busiest: bool = False
    # with an SLO: the burst reserve holds no more than the sessions that may start executing
    # within a boot time: every idle one, and the most opens of a step of the burst memory
    slo_reserve_cap: bool = True
    # without an SLO: u* may rise to the load per GPU the worst chunk of the last burst
    # memory already allows (less delta), up to this (None: off)
    follow_worst: float | None = 0.75
    # without an SLO: a rise counts only above the level the load held (each bucket's fewest
    # executing sessions, the highest of them) in the settle_s seconds before the boot time it
    # rose within, and a scale-in keeps the last settle_s seconds' peak plus the reserve
    # (0: every rise counts in full and a scale-in keeps the peak since the load fell)
    settle_s: float = 120.0

    def __post_init__(self) -> None:
        if (not (0 <= self.min_gpus <= self.max_gpus) or self.dwell_s < 0 or self.boot_s < 0 or self.scale_in_delay < 0
                or self.burst_memory_s < 0 or self.burst_bucket_s <= 0 or self.settle_s < 0
                or (self.burst_utilization is not None and not 0 < self.burst_utilization <= 1)
                or (self.follow_worst is not None and not 0 < self.follow_worst <= 1)
                or (self.slo_floor_share is not None and not 0 < self.slo_floor_share <= 1) or self.slo_floor_after_s < 0):
            raise ConfigError("autoscaler", "need 0 <= min_gpus <= max_gpus, dwell_s, boot_s, scale_in_delay_s, burst_memory_s, settle_s >= 0, "
                              "burst_bucket_s > 0, 0 < burst_utilization <= 1, 0 < follow_worst <= 1, 0 < slo_floor_share <= 1, "
                              "slo_floor_after_s >= 0", "autoscaler")

    @property
    def scale_in_delay(self) -> float:
        """Seconds u_max must stay below the band before a scale-in."""
        return self.boot_s if self.scale_in_delay_s is None else self.scale_in_delay_s


@dataclass(frozen=True, slots=True)
class AutoscalerState:
    """When the last scale action was taken, since when u_max is below the band, and the
    peak executing sessions seen since then (None: never / not below)."""

    last_action_at: float | None = None
    low_since: float | None = None
    low_peak: int = 0
    recent: Recent = ()  # the burst reserve's buckets (processors.burst)
    # SLO feedback: u* is multiplied by ``headroom``; chunks and misses so far, then in the
    # current step, chunks over the worst bound in it, and the step's index
    headroom: float | None = None  # None: the config's headroom_start
    measured: tuple[int, int, int, int, int, int] | None = None
    # without an SLO: per minute of the last burst memory, the worst chunk measured in it
    worst_seen: tuple[tuple[int, float], ...] = ()
    deadline_s: float = 0.0  # the chunk deadline measured chunks were last judged against (read with an SLO)
    # with an SLO: per step, the sessions that started executing in it (opens and returns),
    # and the load per GPU the first-chunk floor allows (None: no floor now)
    starts: tuple[tuple[int, int], ...] = ()
    floor_u: float | None = None
    # with an SLO: per step of the burst memory, the sessions that opened in it (the reserve's cap)
    opens: tuple[tuple[int, int], ...] = ()
