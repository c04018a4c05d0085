"""What each wire field means, in what unit, for the AsyncAPI document (``asyncapi.py``).

``FIELDS`` gives a field name's meaning wherever it appears; ``OVERRIDES`` the meaning of a
field in one record where it says more there. Units are UCUM-like codes (``s``, ``By``,
``W``, ``%``, ``USD``, ``1`` for a ratio) and also go to the schema as ``x-unit``.
"""

from __future__ import annotations

__all__ = ["FIELDS", "OVERRIDES", "HEADERS", "TOPIC_NOTES", "EXAMPLE_VALUES", "field_doc"]

Doc = tuple[str, str | None]  # (description, unit)

_TS = ("Event time: Unix seconds (UTC, fractional) when the writer produced the record. "
       "Consumers window, bill and break ties by it, so writers keep clocks in sync. On "
       "session-events and session-inputs a ts more than 300 s from the Kafka record's own "
       "timestamp (milliseconds sent as seconds, a clock far off, an old event re-sent) is "
       "replaced by that timestamp, counted in chunkserve_event_time_replaced_total and logged.", "s")
_GEN = ("The session's generation this record acts under: the worker holding execution "
        "authority and its epoch (see Generation).", None)

FIELDS: dict[str, Doc] = {
    "ts": _TS,
    "session_id": ("The session's id, chosen by the producer that opened it; also the key of "
                   "session-events and session-inputs. Any non-empty UTF-8 string.", None),
    "worker_id": ("The worker's id, unique in the fleet (`--worker-id`; the provisioner names "
                  "its workers `<pool>-<n>`); also the key of worker-commands and worker-events.", None),
    "generation": _GEN,
    "epoch": ("The generation's epoch: 1 at the session's first commit, one more at each "
              "commit (admission, migration, recovery). Authority belongs to the highest.", None),
    "prompt": ("The session's prompt: free UTF-8 text the model conditions on from the first "
               "chunk.", None),
    "state_bytes": ("Expected size of the session's state (the portable snapshot), which "
                    "placement weighs as migration cost; 0: unknown, the profile's default.", "By"),
    "reason": ("Why, in words or a short code (see the record).", None),
    "seq": ("The input's per-session sequence number: 1 for a session's first input, then one "
            "more for each (a seq below 1, or above 2^53 - 1, the largest every JSON number holds "
            "exactly, is refused to dead-letters). The owner applies inputs in "
            "seq order, each once: the same record delivered again gets no second verdict, its "
            "first (InputAccepted) stands (at-least-once redelivery); another record that uses an "
            "applied seq again, later in the log than the last input applied (a producer that "
            "restarted and numbered from 1), is refused as `late`. Numbering is the producer's, per "
            "session, across its restarts: go on from the session's last InputAccepted + 1. After a gap (3 arrives, 2 has not) later inputs wait up to 5 s for the "
            "missing one, then the owner looks for it in session-inputs and applies it from there, "
            "else applies the later ones without it; the missing one, if it comes later, is "
            "refused as `late` (only the latest given up on are remembered, 1,024 by the owner "
            "and 256 by the store for the next one: an older one is refused as `late` too, even "
            "a copy of one applied, whose InputAccepted stands; so number inputs one by one). A missing one that dispatch refused (over the size or rate bound, "
            "keyed by another id, for a session it did not know, or for its schema while its bytes "
            "still name its session, as its key, and its seq) is not waited for: sent again "
            "before a later input is applied, it is applied in its place, after that it is refused "
            "as `late`. Inputs still waiting when the session closes are refused as "
            "`closed`. Every input ends applied (worker-events `worker.input`, InputAccepted) "
            "or refused with a reason (dead-letters, the InputPushed's bytes in `raw`).", None),
    "kind": ("What the input is: `text` (PushText, streamed text), `prompt` (a new prompt) "
             "or `control` (a control input for the model).", None),
    "payload": ("The input's content, UTF-8; at most `max_input_bytes` (65536 by default) "
                "bytes, else refused to dead-letters.", "By"),
    "capacity": ("K: the most sessions the worker executes at once within the chunk deadline.", None),
    "pool": ("The worker pool: workers of one pool are started and stopped by that pool's "
             "provisioner.", None),
    "gpu_type": ("The device type's name in the latency profile (`cpu`, `h20`, `b300`...).", None),
    "decision_id": ("Id of the control decision that issued the command; a decision sends one "
                    "ScaleOut per GPU type, and a provisioner carries out a scale-out once per id "
                    "and GPU type and refuses a replay.", None),
    "level": ("Workload volatility level, 1 (steady) .. 10 (bursty), from the detector.", None),
    "sessions": ("Sessions counted (see the record).", None),
    "chunk_index": ("0-based index of the session's chunk; consecutive over the session's "
                    "whole life, whichever worker produced it.", None),
}

OVERRIDES: dict[tuple[str, str], Doc] = {
    ("SessionClosed", "reason"): ("Why the session ended: `user` (default) or the front end's "
                                  "word for it.", None),
    ("Assign", "prompt"): ("The prompt from the session's SessionOpened.", None),
    ("Assign", "restore"): ("Start from the session's last fenced snapshot rather than from "
                            "its prompt.", None),
    ("Assign", "recover"): ("Restore and also replay the inputs after the snapshot from "
                            "session-inputs (a recovery: the previous owner died; a migration: "
                            "an input the source never got to is not lost).", None),
    ("Revoke", "reason"): ("Why the generation stopped being current: `migrated` after a "
                           "handoff, or the store's refusal.", None),
    ("Revoke", "successor"): ("After a handoff: the target's new generation (the source then "
                              "reports Released `migrated` with it); else null.", None),
    ("PolicyState", "policy"): ("The policy the state belongs to (`turboserve`, a plug-in's "
                                "`module:Name`); a leader running another policy ignores it.", None),
    ("PolicyState", "state"): ("The policy's state as a msgpack map of its fields (nested "
                               "dataclasses as maps, tuples as arrays); never code.", None),
    ("PolicyState", "decision_id"): ("The decision round that left this state.", None),
    ("AdmissionPlan", "policy"): ("The policy that made the plan.", None),
    ("AdmissionPlan", "order"): ("Where the next sessions go, in order: each entry a worker and "
                                 "the session count that admission brings it to (at most 128 "
                                 "entries).", None),
    ("AdmissionPlan", "pinned"): ("Sessions the policy placed itself (waiting ones, resumes): "
                                  "session id -> worker id.", None),
    ("AdmissionPlan", "fallback"): ("Whether a session past the order goes to the least-loaded "
                                    "worker; false: it waits for the next plan's pin.", None),
    ("AdmissionPlan", "decision_id"): ("The decision round that made the plan.", None),
    ("AdmitSlot", "count"): ("The worker's session count once this entry's session is admitted.", None),
    ("Frozen", "target_worker"): ("The worker the Handoff names as the session's next owner.", None),
    ("Frozen", "chunk_index"): ("The last chunk released before the freeze; the snapshot holds "
                                "the state after it.", None),
    ("Handoff", "target_worker"): ("The worker the session moves to.", None),
    ("Handoff", "reason"): ("Why control moves it: `rebalance` (default), `drain` or another "
                            "word of the policy.", None),
    ("RoutedInput", "source_partition"): ("Partition of session-inputs holding the original "
                                          "InputPushed (kept when an owner refused it and it is "
                                          "routed again); -1: unknown.", None),
    ("RoutedInput", "source_offset"): ("Offset of the original InputPushed in that partition; "
                                       "-1: unknown.", None),
    ("RoutedInput", "refused_before"): ("Seqs of this session's inputs that dispatch refused "
                                        "(dead-lettered) since it routed the previous one: the "
                                        "owner applies this input without waiting for them.", None),
    ("WorkerUp", "device"): ("The torch device the worker runs on (`cpu`, `cuda`, `cuda:1`...).", None),
    ("WorkerUp", "pid"): ("The worker's process id on its host; 0: not said.", None),
    ("WorkerUp", "input_rate_per_s"): ("The input rate rule the worker's replays apply (with "
                                       "`input_burst`); dispatch logs an error when it applies another "
                                       "(a replay would then apply inputs dispatch refused); 0: not said.", None),
    ("WorkerUp", "input_burst"): ("The input burst of that rule; 0: not said.", None),
    ("WorkerUp", "chunk_interval_s"): ("The media duration of one of its chunks, so the deadline of "
                                       "each: a chunk whose `latency_s` is over it missed its deadline "
                                       "(the control processor counts them for its policy); 0: not said.", "s"),
    ("Heartbeat", "sessions"): ("Sessions whose state the worker holds (executing or idle "
                                "and still resident).", None),
    ("Heartbeat", "executing"): ("Of those, sessions executing (producing chunks).", None),
    ("Heartbeat", "capacity"): ("K at the time of the heartbeat.", None),
    ("Heartbeat", "chunk_latency_s"): ("Latency of the worker's last coalesced chunk batch.", "s"),
    ("Heartbeat", "device_mem_bytes"): ("Device memory in use (GPU: NVML's used memory; CPU: the "
                                        "worker process's resident memory, as `rss_bytes`).", "By"),
    ("Heartbeat", "device_util"): ("Device utilization, 0..1 (GPU: NVML; CPU: the worker "
                                   "process's CPU use over all cores).", "1"),
    ("Heartbeat", "power_w"): ("Device power draw (GPU: NVML; CPU: 0).", "W"),
    ("Heartbeat", "cpu_percent"): ("CPU use of the worker process, percent of one core (may "
                                   "exceed 100 on several cores).", "%"),
    ("Heartbeat", "rss_bytes"): ("Resident memory of the worker process.", "By"),
    ("WorkerDown", "reason"): ("`shutdown` (a clean stop), `shutdown by provisioner`, `missed "
                               "heartbeats` (declared dead by control) or `exited rc=N` (the "
                               "provisioner saw it die).", None),
    ("WorkerProvisioned", "provisioner"): ("Who started the worker and stops it on Shutdown "
                                          "(`provisioner-<pool>`, `local-fleet`...).", None),
    ("Claimed", "generation"): ("The generation claimed: from now on only this worker "
                                "releases the session's chunks and inputs.", None),
    ("Released", "reason"): ("`closed`, `suspended` (offloaded, slot freed), `migrated` (then "
                             "`successor` is set), `revoked` (a Revoke without a successor) or "
                             "`fenced` (the store refused the worker's write: its generation had "
                             "passed).", None),
    ("Released", "detail"): ("Prose for operators: the Revoke's reason, the store's refusal.", None),
    ("Released", "successor"): ("For `migrated`: the target's new generation; else null.", None),
    ("Released", "chunk_index"): ("The last chunk index released under this generation; -1: "
                                  "none.", None),
    ("ChunkDone", "latency_s"): ("Time to compute the coalesced batch the chunk was part of.", "s"),
    ("ChunkDone", "batch_size"): ("Sessions coalesced in that batch.", None),
    ("ChunkDone", "input_seq"): ("The highest input seq applied before this chunk; 0: none.", None),
    ("ChunkDone", "checksum"): ("SHA-256 (hex) of the chunk's frame bytes.", None),
    ("InputAccepted", "seq"): ("The input applied: once and in order per generation (a recovering owner "
                               "reports the inputs it replays after its snapshot again, under its own "
                               "generation: count by session and seq).", None),
    ("CommandRejected", "worker_id"): ("Who refused it: the worker, or `provisioner-POOL` for a "
                                       "pool's command a provisioner refused.", None),
    ("CommandRejected", "session_id"): ("The session the refused command named; empty for a "
                                        "pool's command.", None),
    ("CommandRejected", "command"): ("Type tag of the refused command (`cmd.assign`, "
                                     "`scale.out`...).", None),
    ("CommandRejected", "reason"): ("A code, one of the schema's enum: ownership (`stale_epoch`, "
                                    "`not_owner`, `unknown_session`, `ownership`), `no_capacity`, "
                                    "bounds (`over_limit`, `snapshot_corrupt`), command signing "
                                    "(`unsigned`, `unknown_key`, `forged`), the provisioner "
                                    "(`replayed`, `not-provisioned`), `access_denied`, `error`; "
                                    "for an input: `late` (after its gap was given up on), "
                                    "`closed` (still waiting at the close), `too_many_pending`.", None),
    ("CommandRejected", "generation"): ("The generation the refused command carried; null for "
                                        "a pool's command.", None),
    ("CommandRejected", "seq"): ("For a refused input: its seq; -1 otherwise.", None),
    ("CommandRejected", "detail"): ("Prose for operators.", None),
    ("CommandRejected", "kind"): ("For a refused input: its kind, so it can be re-routed; "
                                  "empty otherwise.", None),
    ("CommandRejected", "payload"): ("For a refused input: its payload; empty otherwise.", "By"),
    ("CommandRejected", "source_partition"): ("For a refused input: the partition of session-inputs "
                                              "holding the InputPushed, from its RoutedInput; -1: "
                                              "unknown, or not an input.", None),
    ("CommandRejected", "source_offset"): ("For a refused input: the offset of that InputPushed, so "
                                           "its dead letter names the record itself; -1: unknown.", None),
    ("ScaleOut", "count"): ("Workers to start; a provisioner dead-letters a count outside 1..32 (control asks "
                              "for at most 32 at once, the next decision for the rest).", None),
    ("Drain", "worker_id"): ("The worker that gets no new session; its sessions migrate away.", None),
    ("Shutdown", "worker_id"): ("The worker to stop once it holds no session (never one no "
                                "provisioner announced).", None),
    ("WorkloadSignal", "window_s"): ("Length of the sliding window.", "s"),
    ("WorkloadSignal", "active"): ("Sessions executing at `ts`.", None),
    ("WorkloadSignal", "arrivals"): ("Sessions opened within the window.", None),
    ("WorkloadSignal", "departures"): ("Sessions closed within the window.", None),
    ("WorkloadSignal", "to_idle"): ("Active -> idle flips within the window.", None),
    ("WorkloadSignal", "to_active"): ("Idle -> active flips within the window.", None),
    ("WorkloadSignal", "volatility"): ("Standard deviation of newly active sessions per slot "
                                       "over the window (sessions per slot).", None),
    ("PlacementReport", "workers"): ("Workers in the placement (up: a worker declared down is "
                                     "left out).", None),
    ("PlacementReport", "sessions"): ("Executing sessions placed on them.", None),
    ("PlacementReport", "worst_latency_s"): ("Worst per-chunk latency the latency profile "
                                             "predicts for this placement (control's; 0 in "
                                             "dispatch's, which does not predict).", "s"),
    ("PlacementReport", "migrations"): ("Migrations (Handoffs) this decision asked for.", None),
    ("PlacementReport", "source"): ("The process that reported: `control` (its placement "
                                    "decision, each control period) or a dispatch replica's "
                                    "name (the store's slot counts after an admission, at "
                                    "most ten a second). Tell them apart by it.", None),
    ("PlacementReport", "loads"): ("Executing sessions per worker id (at most 256 workers).", None),
    ("ScalingDecision", "current"): ("Workers in the pool that are not draining.", None),
    ("ScalingDecision", "target"): ("Workers after this decision.", None),
    ("ScalingDecision", "u_max"): ("Worst n_j / K_j over the workers, raised to unplaced "
                                   "demand's share (above 1: short of slots; capped at 1e6).", "1"),
    ("ScalingDecision", "u_target"): ("Target utilization u* for the volatility level.", "1"),
    ("ScalingDecision", "delta"): ("Hysteresis band around u*.", "1"),
    ("ScalingDecision", "reason"): ("`scale-out` or `scale-in`.", None),
    ("CostTick", "gpus"): ("Workers up at `ts`.", None),
    ("CostTick", "gpu_seconds"): ("Worker-seconds accrued since the log began (cumulative).", "s"),
    ("CostTick", "cost"): ("Cost accrued since the log began at the latency profile's prices "
                           "(cumulative).", "USD"),
    ("CostTick", "pool"): ("The pool; empty: all pools together.", None),
    ("DeadLetter", "source_topic"): ("The full name (prefix included) of the topic the record "
                                     "was read from; also this record's key.", None),
    ("DeadLetter", "partition"): ("Its partition.", None),
    ("DeadLetter", "offset"): ("Its offset.", None),
    ("DeadLetter", "reason"): ("Why it was refused, always beginning `schema: ` (it does not decode "
                                "as its topic's records) or `refused: ` (it decodes, and was refused: a "
                                "bound, an unknown or closed session, its owner's refusal such as "
                                "`late`), then prose. A refused input's `key` is its session id when "
                                "it came keyed by it; `raw` holds its `session_id` and `seq`.", None),
    ("DeadLetter", "consumer"): ("The process that refused it (`dispatch`, `metrics`...).", None),
    ("DeadLetter", "raw"): ("The refused bytes, cut to fit the dead-letters bound (at most "
                            "256 KiB).", "By"),
    ("DeadLetter", "raw_size"): ("Size of the refused record before any cut.", "By"),
    ("DeadLetter", "key"): ("The refused record's key (at most 1 KiB), or null.", None),
}

HEADERS: dict[str, str] = {
    "cs-t": "The record's type tag (as `t` in the payload), UTF-8: consumers that act on a few "
            "types skip the others without decoding them. Every chunkserve writer sets it; "
            "optional for others.",
    "cs-kid": "With command signing on (worker-commands, scaling-commands): the id of the key "
              "the record was signed with, UTF-8.",
    "cs-mac": "With command signing on: HMAC-SHA256, under the key `cs-kid` names, of the "
              "logical topic name (without the prefix, UTF-8), one zero byte and the record's "
              "bytes; 32 raw bytes. Unsigned, unknown-key and forged commands are refused.",
}

#: the same two headers on worker-events, where they bind a record to its worker
EVENT_HEADERS: dict[str, str] = {
    "cs-kid": "With worker-event signing on (CHUNKSERVE_EVENT_KEYS): the id of the master key the "
              "signing worker's key was derived from, UTF-8.",
    "cs-mac": "With worker-event signing on: HMAC-SHA256, under the key of the worker the record is "
              "keyed by (HMAC-SHA256 of `worker-events`, one zero byte and the worker id, under the "
              "master `cs-kid` names), of `worker-events`, one zero byte and the record's bytes; 32 "
              "raw bytes. Dispatch, control and metrics act on no unsigned, unknown-key or forged "
              "record, nor on one whose `worker_id` (or, but on a CommandRejected, its generation's "
              "worker) is not the worker it is keyed by; readers outside the fleet may ignore both headers.",
}

TOPIC_NOTES: dict[str, str] = {
    "session-events": "Per session, records are handled in partition order, whatever their `ts`: "
                      "send a session's events with one idempotent producer (enable.idempotence, so a "
                      "retry cannot reorder them), in order, on the partition murmur2 of its key gives (one elsewhere is taken as it comes, out of order "
                      "with the others). An idle or close of a session never opened is refused "
                      "to dead-letters and no processor counts it. When every worker is "
                      "full, an open (or a return of an offloaded session) waits for room up to "
                      "dispatch's admission timeout (30 s) and is then refused to dead-letters "
                      "with the reason; past 256 waiting at once, or within 30 s of its session's "
                      "timed-out admission, it is refused at once.",
    "session-inputs": "Per session, inputs are handled in partition order. An input on another "
                      "partition than its key's (murmur2) is refused to dead-letters with the "
                      "reason: a recovery reads a session's inputs from its key's partition only "
                      "(do not add partitions to this topic while sessions live). Rate: the broker stamps "
                      "each input as it appends it (the topic's `message.timestamp.type` is "
                      "LogAppendTime); per session, the first `input_burst` inputs (default 100) in "
                      "each window of `input_burst / input_rate_per_s` seconds of those timestamps "
                      "(default 2 s, windows counted from the Unix epoch) are accepted and the rest "
                      "refused to dead-letters with the reason; an input refused for its seq, size, "
                      "key or partition does not count, and a seq repeated within a window (a retry) counts "
                      "once and gets its first copy's verdict. The rule is decided from the log, so a replay "
                      "decides it the same. An input to an offloaded session restores it and is applied, "
                      "but the scheduler and the metrics count the session idle until its "
                      "SessionActive: send one when the user is back. While every worker is "
                      "full such an input waits for room as an open does (session-events) and is "
                      "refused the same way. An input of a session whose open is not yet in the store "
                      "is read again for up to 10 s (the open may be on its way), and for as long as "
                      "its open waits for room (up to the admission timeout, 30 s): then it is routed "
                      "once the open is admitted, or refused with the reason `its open was refused` "
                      "when the open finds no room. That holds where one dispatch process reads the "
                      "session's events and inputs: with session-events and session-inputs of equal "
                      "partition counts (8 each by default), as faust gives a process the same "
                      "partitions of both.",
    "worker-commands": "A worker reads the partition its id hashes to and skips other "
                       "workers' records; commands of one worker arrive in order, and a "
                       "command whose generation is no longer current is refused "
                       "(CommandRejected).",
    "worker-events": "Per worker, in the order the worker wrote them.",
    "scaling-commands": "One partition: commands arrive in the order control issued them.",
    "metrics": "One partition, in the order written; keyed by the record's type tag `t`.",
    "dead-letters": "One partition, in the order consumers refused the records. At least "
                    "once: a record may be refused twice (a processor restarted before it "
                    "committed its read, or refused again by another path, such as an input "
                    "routed to a closed session and read back by the close's sweep); count "
                    "refusals by source topic, partition and offset.",
}


def field_doc(record: str, name: str) -> Doc:
    """The description and unit of field ``name`` of class ``record``."""
    return OVERRIDES.get((record, name)) or FIELDS.get(name) or ("", None)


# example values of the required fields (optional ones keep their defaults unless named here)
EXAMPLE_VALUES: dict[str, object] = {
    "ts": 1767225600.25, "session_id": "s-42", "worker_id": "default-0", "prompt": "a paper boat on a river",
    "seq": 1, "kind": "text", "payload": "turn left", "capacity": 8, "sessions": 3, "executing": 2,
    "chunk_latency_s": 0.041, "chunk_index": 17, "latency_s": 0.041, "batch_size": 3,
    "target_worker": "default-1", "provisioner": "provisioner-default", "pool": "default",
    "command": "cmd.assign", "count": 1, "window_s": 60.0, "active": 40,
    "arrivals": 12, "departures": 9, "to_idle": 5, "to_active": 4, "volatility": 1.7, "level": 3,
    "workers": 4, "current": 4, "target": 5, "u_max": 0.93, "u_target": 0.7, "delta": 0.07,
    "gpus": 4, "gpu_seconds": 5400.0, "cost": 1.25, "source_topic": "chunkserve.session-events",
    "partition": 3, "offset": 1024, "consumer": "dispatch", "state_bytes": 4194304,
}
# and where one record's example says more ("Record.field")
EXAMPLE_VALUES.update({"Released.reason": "closed", "CommandRejected.reason": "stale_epoch",
                       "DeadLetter.reason": "schema: t: unknown type tag 'nope'",
                       "ScalingDecision.reason": "scale-out", "WorkerDown.reason": "shutdown",
                       "PolicyState.policy": "turboserve", "AdmissionPlan.policy": "turboserve",
                       "AdmissionPlan.pinned": {"s-41": "default-1"}})
