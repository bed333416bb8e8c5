"""``sweep predict``: one configuration -> iteration time, throughput, memory, per-op table.

The configuration is matched against the case's candidate space, so a prediction is always
of a configuration the search would evaluate. Fields left out (dp, the NVLink placement, the
SUMMA panels nb, ...) are filled with the best choice among the matching candidates, and the
report says how many there were.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import SweepError
from ..model.candidates import (
    NERSC_FIELDS,
    bf16_ends_fit,
    block_kind,
    enumerate_space,
    first_k_layers,
    last_stage_layers,
    mamba_cp_ok,
    summa_models,
)
from ..model.cost import evaluate_columns, op_table, pack_results, unmodelled
from ..model.cost.calibrated import tp_overlap_split, unsupported_job_precision
from ..model.hardware import Hardware
from ..model.job import Job
from ..model.schema import CANDIDATE_DTYPE, Reason, empty_candidates
from ..model.search import DEFAULT_BLOCK
from ..model.topn import best_positions

__all__ = ["CONFIG_KEYS", "Prediction", "parse_config", "predict"]

#: configuration keys a user may give (every candidate column but the index)
CONFIG_KEYS = tuple(n for n in CANDIDATE_DTYPE.names if n != "index")
#: relative difference under which two candidates that do not fit need the same memory
MEMORY_TIE = 1e-9


@dataclass
class Prediction:
    """A predicted configuration: its RESULT row and its per-op rows."""

    profile: str
    job: Job
    hardware: Hardware
    strategy: str
    n_gpus: int
    row: np.ndarray  # () RESULT_DTYPE record
    ops: list[dict[str, float]]  # per-op rows; their time_s adds up to the step time
    matches: int  # candidates that matched the given fields

    def as_dict(self) -> dict:
        """JSON-ready summary."""
        row = {k: (self.row[k].item()) for k in self.row.dtype.names}
        row["reason"] = Reason(int(row["reason"])).name.lower()
        return {"profile": self.profile, "job": self.job.name, "hardware": self.hardware.name,
                "nvlink_domain": self.hardware.nvlink_domain, "strategy": self.strategy,
                "n_gpus": self.n_gpus, "matching_candidates": self.matches,
                "hbm_capacity_bytes": self.hardware.hbm_capacity_bytes,
                "result": row, "ops": self.ops}


def _recompute_names() -> dict[str, int]:
    """The names predict and show print for a recompute policy (and the short ones of
    show's config column) -> its code."""
    from .show import _RECOMPUTE, RECOMPUTE_NAMES

    return {**{v: k for k, v in RECOMPUTE_NAMES.items()}, **{v: k for k, v in _RECOMPUTE.items()}}


_RECOMPUTE_BY_NAME = _recompute_names()
RECOMPUTE_CODES = frozenset(_RECOMPUTE_BY_NAME.values())
#: configuration columns that are on / off switches, and what 1 means
SWITCHES = {"sp": "sequence parallelism", "tp_overlap": "TP communication overlapped",
            "cp_comm": "context parallelism's K/V all-gathered instead of a ring",
            "a2a_overlap": "the MoE all-to-all overlapped"}


def parse_config(text: str) -> dict[str, int]:
    """``"tp=8,pp=4"`` -> ``{"tp": 8, "pp": 4}`` (``recompute`` also by name: none,
    selective, full, first-k, per-op, or show's sel, first, op).

    Raises:
        SweepError: malformed item, unknown key or non-positive value.
    """
    out: dict[str, int] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise SweepError(f"--config: {item!r} is not key=value")
        if key not in CONFIG_KEYS:
            raise SweepError(f"--config: unknown key {key!r}; valid: {', '.join(CONFIG_KEYS)}")
        if key in out:
            raise SweepError(f"--config: {key} is given twice")
        named = _RECOMPUTE_BY_NAME.get(value.strip().lower()) if key == "recompute" else None
        try:
            v = named if named is not None else int(value)
        except ValueError:
            hint = (f" or one of {', '.join(sorted(_RECOMPUTE_BY_NAME))}"
                    if key == "recompute" else "")
            raise SweepError(f"--config: {key}: expected an integer{hint}, "
                             f"got {value.strip()!r}") from None
        lower = 0 if key in ("recompute", "recompute_layers", "zero", "shard_group", "sp",
                             "tp_overlap", "offload", "cp_comm", "a2a_overlap") else 1
        if v < lower:
            raise SweepError(f"--config: {key}: expected an integer >= {lower}, got {v}")
        if key in SWITCHES and v > 1:
            raise SweepError(f"--config: {key}: expected 0 or 1 ({SWITCHES[key]}), got {v}")
        if key == "zero" and v > 3:
            raise SweepError(f"--config: zero: expected a ZeRO stage 0 - 3, got {v}")
        if key == "recompute" and v not in RECOMPUTE_CODES:
            raise SweepError(f"--config: recompute: expected one of "
                             f"{', '.join(sorted(_RECOMPUTE_BY_NAME))} or their codes "
                             f"{', '.join(map(str, sorted(RECOMPUTE_CODES)))}, got {v}")
        out[key] = v
    return out


def _diagnose_nersc(job: Job, n: int, strategy: str, cfg: Mapping[str, int]) -> str:
    """First NERSC search rule (nersc2024_model.md section 8) the configuration breaks."""
    tp, pp, mbs = cfg.get("tp", 1), cfg.get("pp", 1), cfg.get("mbs", 1)
    name2 = {"1d": "", "2d": "tp2", "2d-seqp": "cp"}[strategy]
    second = cfg.get(name2, 1) if name2 else 1
    model = tp * second * pp
    degrees = " x ".join(k for k in ("tp", name2, "pp") if k)
    if "dp" not in cfg and n % model:
        return f"{degrees} = {model} does not divide {n} GPUs"
    dp = cfg.get("dp", n // model)
    e, h, L, l, gbs = job.hidden, job.n_heads, job.n_layers, job.seq_len, job.global_batch
    neutral = empty_candidates(1)[0]
    for key, value in cfg.items():
        if key not in NERSC_FIELDS and value != int(neutral[key]):
            return (f"{key} = {value}: nersc2024 searches tp, tp2 / cp, pp, dp, mbs, the SUMMA "
                    f"panels (nb) and NVLink placements only")
    checks = [
        (dp * model == n, f"dp x {degrees} = {dp * model}, not {n} GPUs"),
        (h % tp == 0 and e % tp == 0, f"tp = {tp} must divide heads ({h}) and hidden ({e})"),
        (strategy != "1d" or (3 * e) // tp >= 128, "1d needs 3 hidden / tp >= 128"),
        (strategy == "1d" or (e // tp >= 128 and l // second >= 128),
         "needs hidden / tp >= 128 and seq / tp2 >= 128"),
        (strategy != "2d" or e % second == 0, f"tp2 = {second} must divide hidden ({e})"),
        (L % pp == 0, f"pp = {pp} must divide the {L} layers"),
        (gbs % dp == 0, f"dp = {dp} must divide the global batch ({gbs})"),
        (gbs % dp == 0 and (gbs // dp) % mbs == 0, f"mbs = {mbs} must divide global batch / dp"),
        ((mbs * l) % {"1d": tp, "2d": second, "2d-seqp": tp * second}[strategy] == 0,
         "micro-batch x seq must divide over the sequence-sharding degree"),
    ]
    for ok, msg in checks:
        if not ok:
            return msg
    return _unmatched(cfg, "nb")


def _diagnose_calibrated(job: Job, hw: Hardware, n: int, cfg: Mapping[str, int]) -> str:
    """First calibrated search rule (candidates.enumerate_calibrated) the configuration breaks."""
    tp, tp2, cp, pp, mbs = (cfg.get(k, 1) for k in ("tp", "tp2", "cp", "pp", "mbs"))
    model = tp * tp2 * cp * pp
    if "dp" not in cfg and n % model:
        return f"tp x tp2 x cp x pp = {model} does not divide {n} GPUs"
    dp = cfg.get("dp", n // model)
    H, Kv, f, s, L, B = (job.n_heads, job.n_kv_heads, job.ffn_hidden, job.seq_len,
                         job.blocks, job.global_batch)
    local = B // dp if dp and B % dp == 0 else 0
    vpp, rec, zero = cfg.get("vpp", 1), cfg.get("recompute", 0), cfg.get("zero", 0)
    ep, etp = cfg.get("ep", 1), cfg.get("etp", 1)
    group = cfg.get("shard_group", 0)
    mamba_cp_rule = (f"cp = {cp} must divide the {job.mamba_heads // max(tp, 1)} Mamba heads "
                     f"of a TP rank and divide or be a multiple of its groups")
    checks = [
        (dp * model == n, f"dp x tp x tp2 x cp x pp = {dp * model}, not {n} GPUs"),
        (tp2 == 1 or cp == 1, "2d (tp2 > 1) has no separate context parallelism"),
        (H % tp == 0 and f % tp == 0, f"tp = {tp} must divide heads ({H}) and ffn ({f})"),
        (Kv % tp == 0 or tp % Kv == 0, f"tp = {tp} must divide or be a multiple of the "
                                       f"{Kv} KV heads"),
        (cp == 1 or s % (2 * cp) == 0, f"2 x cp = {2 * cp} must divide the sequence ({s})"),
        (not job.is_hybrid or (job.n_layers % pp == 0 and vpp == 1 and rec != 4),
         f"a hybrid's pp divides its {job.n_layers} layers; vpp 1, no per-op recompute (4)"),
        (not job.mamba_layers or (job.mamba_heads % tp == 0 and job.mamba_groups % tp == 0),
         f"tp = {tp} must divide the {job.mamba_heads} Mamba heads and {job.mamba_groups} groups"),
        (mamba_cp_ok(job, tp, cp), mamba_cp_rule),
        (bf16_ends_fit(job, pp),
         (f"the 16-bit first / last layers ({job.bf16_first_layers} / "
          f"{job.bf16_last_layers}) must each fit a stage of {job.n_layers // pp} layers at "
          f"pp = {pp}")),
        (not job.dsa or cp == 1 or cfg.get("cp_comm", 1) == 1,
         ("DeepSeek sparse attention under context parallelism all-gathers its keys "
          "(cp_comm=1)")),
        (not job.dsa or rec != 4,
         "DeepSeek sparse attention runs without per-op recompute (4)"),
        (job.attention != "csa" or (tp == 1 and cp == 1 and rec != 4),
         ("compressed sparse attention (csa) runs at tp = 1 and cp = 1, without per-op "
          "recompute (4)")),
        (last_stage_layers(job, pp) >= 1,
         f"pp = {pp}: {pp} stages of ceil({L}{' + 2 slots' if job.embedding_slots else ''}"
         f" / {pp}) {'blocks' if job.is_hybrid else 'layers'} leave the last without one"),
        (B % dp == 0, f"dp = {dp} must divide the global batch ({B})"),
        (local and local % mbs == 0, f"mbs = {mbs} must divide global batch / dp"),
        (vpp == 1 or (pp > 1 and -(-L // pp) % vpp == 0),
         f"vpp = {vpp} needs pp > 1 and to divide the layers per full stage "
         f"(ceil({L} / {pp}))"),
        (vpp == 1 or (local and (local // mbs) % pp == 0),
         "interleaving needs the micro-batch count to be a multiple of pp"),
        (rec <= 4, f"recompute = {rec}: 0 none, 1 selective, 2 full, 3 first-k, 4 per-op"),
        (rec == 3 or not cfg.get("recompute_layers"),
         "recompute_layers needs recompute = first-k (3)"),
        (rec != 3 or cfg.get("recompute_layers", 0) in first_k_layers(-(-L // pp)),
         f"first-k recompute is searched at recompute_layers = "
         f"{', '.join(map(str, first_k_layers(-(-L // pp)))) or 'none'} (a quarter, half and "
         f"three quarters of the {-(-L // pp)} layers of a stage at pp = {pp})"),
        (zero <= 3, f"zero = {zero}: stages are 0-3"),
        (job.is_moe or (ep == 1 and etp == 1), "ep and etp need a mixture-of-experts job"),
        (not job.is_moe or job.n_experts % ep == 0,
         f"ep = {ep} must divide the {job.n_experts} experts"),
        (not job.is_moe or job.moe_ffn_hidden % etp == 0,
         f"etp = {etp} must divide the expert width ({job.moe_ffn_hidden})"),
        (not job.is_moe or (tp * cp * dp) % (ep * etp) == 0,
         f"ep x etp = {ep * etp} must divide tp x cp x dp = {tp * cp * dp} (parallel folding)"),
        (not job.is_moe or tp == 1 or cfg.get("sp", 1) == 1,
         "an MoE job with tp > 1 needs sequence parallelism (sp=1)"),
        (not job.dsa or tp == 1 or cfg.get("sp", 1) == 1,
         ("DeepSeek sparse attention (absorbed MLA) with tp > 1 needs sequence parallelism "
          "(sp=1)")),
        (cfg.get("a2a_overlap", 0) == 0 or (ep > 1 and (pp == 1 or vpp > 1) and rec not in (2, 3)),
         "a2a_overlap needs ep > 1, one stage or interleaved stages, no full / first-k "
         "recompute"),
        (group == 0 or (zero == 3 and dp % group == 0 and group < dp
                        and group & (group - 1) == 0),
         "shard_group needs zero = 3 and a power of two dividing dp, below it"),
        (cfg.get("sp", 0) in (0, 1) and cfg.get("tp_overlap", 0) in (0, 1),
         "sp and tp_overlap are 0 or 1"),
        (tp > 1 or not (cfg.get("sp") or cfg.get("tp_overlap")), "sp / tp_overlap need tp > 1"),
        (not cfg.get("tp_overlap") or cfg.get("sp"), "tp_overlap needs sp = 1"),
        (not cfg.get("offload") or hw.host_memory_bytes > 0,
         f"offload needs a host memory tier; {hw.name} has none"),
        (cfg.get("offload", 0) <= 7, "offload is a bit mask 0-7"),
    ]
    for ok, msg in checks:
        if not ok:
            return msg
    if not job.training and (rec or zero or vpp > 1):
        return "forward-only jobs have no recompute, ZeRO or virtual stages"
    return _unmatched(cfg)


def _unmatched(cfg: Mapping[str, int], *also: str) -> str:
    """Why no candidate matched when every rule checked holds: the NVLink placement given
    (or ``also``: e.g. the SUMMA panels), or a combination the search does not make."""
    given = [k for k in cfg if k.startswith("nv_") or k in also]
    if given:
        return (f"no candidate matches the {', '.join(given)} given (NVLink placements must "
                f"fill the domain exactly; leave them out to take the best)")
    return ("no candidate of this case has this combination of knobs (leave some out to see "
            "the candidates that match the rest)")


def predict(profile: str, job: Job, hw: Hardware, strategy: str, n_gpus: int,
            config: Mapping[str, int]) -> Prediction:
    """Predict one configuration.

    Raises:
        SweepError: the configuration is not a candidate of this case (with the rule broken).
    """
    if profile == "nersc2024" and job.dtype not in ("bf16", "fp16"):
        raise SweepError(f"--profile nersc2024 models 16-bit training only; job {job.name} "
                         f"uses {job.dtype}")
    why = unmodelled(job, profile)
    if why:
        raise SweepError(f"--job {job.name}: {why}")
    why = unsupported_job_precision(job, hw) if profile == "calibrated" else None
    if why:
        raise SweepError(f"--job {job.name}: {why}")
    if profile == "calibrated" and strategy == "2d" and not summa_models(job):
        raise SweepError(f"--strategy 2d: SUMMA is modelled for dense multi-head blocks only; "
                         f"job {job.name} has {block_kind(job)} blocks (use 1d)")
    # offload is opt-in: searched only when the configuration names it
    offload = config.get("offload", 0) > 0
    space = enumerate_space(profile, job, n_gpus, strategy, hw.nvlink_domain,
                            offload and hw.host_memory_bytes > 0)
    best = None
    matches = 0
    for sub in _matching(space, config):
        metrics = evaluate_columns(profile, job, hw, strategy, n_gpus, sub)
        matches += len(sub["index"])
        # the fastest that fits (ties: lowest index); if none fits, the one that needs the
        # least memory (what comes closest to running), and of those the fastest (NVLink
        # placements need the same memory: the worst one would answer "if it fit" wrongly);
        # a layout the stack cannot run (Reason.NOT_EXPRESSIBLE) only if no other matches
        pos = best_positions(metrics["samples_per_s"], metrics["feasible"], sub["index"], 1)
        if len(pos) == 0:
            mem = np.asarray(metrics["mem_bytes"], dtype=np.float64)
            runnable = runs(sub)
            would_fit = np.asarray(metrics["reason"]) == Reason.NOT_EXPRESSIBLE
            if runnable.any():  # the runnable ones needing the least memory
                pick = runnable & (mem <= mem[runnable].min() * (1.0 + MEMORY_TIE))
            elif would_fit.any():  # none runnable: those that would fit
                pick = would_fit
            else:
                pick = mem <= mem.min() * (1.0 + MEMORY_TIE)
            pos = best_positions(metrics["samples_per_s"], pick, sub["index"], 1)
        cand = pack_results(sub, metrics, pos)[0]
        if best is None or _closer(cand, best):
            best = cand
    if best is None:
        reason = _diagnose_nersc(job, n_gpus, strategy, config) if profile == "nersc2024" \
            else _diagnose_calibrated(job, hw, n_gpus, config)
        if not config:  # (no configuration at all: the default's first broken rule)
            raise SweepError(f"{job.name} has no {profile}/{strategy} configuration on "
                             f"{n_gpus} GPUs (the default layout, all {n_gpus} GPUs data-"
                             f"parallel: {reason})")
        raise SweepError(f"{_describe(config)} is not a {profile}/{strategy} candidate for "
                         f"{job.name} on {n_gpus} GPUs: {reason}")
    single = {k: np.array([best[k]]) for k in CANDIDATE_DTYPE.names}
    rows = op_table(profile, job, hw, strategy, single)
    ops = [{k: (v if k == "name" else float(np.asarray(v).ravel()[0])) for k, v in r.items()}
           for r in rows]
    return Prediction(profile, job, hw, strategy, n_gpus, best, ops, matches)


#: ranges of candidates this close together are read as one (fewer, longer column blocks)
MERGE_GAP = DEFAULT_BLOCK // 4


def _matching(space, config: Mapping[str, int]):
    """The candidates of ``space`` that match ``config``, as column blocks of about
    DEFAULT_BLOCK rows: read only from the base rows whose own fields agree with it
    (CandidateSpace.ranges_where; nearby ranges merged), the rest of the configuration
    checked column by column, the matches of short ranges gathered before they are
    evaluated (one evaluation per block, not per range)."""
    merged: list[list[int]] = []
    for lo, hi in space.ranges_where(config):
        if merged and lo - merged[-1][1] <= MERGE_GAP:
            merged[-1][1] = hi
        else:
            merged.append([lo, hi])
    pending: list[dict] = []
    size = 0
    for lo, hi in merged:
        for start in range(lo, hi, DEFAULT_BLOCK):
            cols = space.columns(start, min(start + DEFAULT_BLOCK, hi))
            mask = np.ones(len(cols["index"]), dtype=bool)
            for k, v in config.items():
                mask &= cols[k] == v
            if mask.any():
                pending.append({k: v[mask] for k, v in cols.items()})
                size += int(mask.sum())
            if size >= DEFAULT_BLOCK:
                yield {k: np.concatenate([p[k] for p in pending]) for k in pending[0]}
                pending, size = [], 0
    if pending:
        yield {k: np.concatenate([p[k] for p in pending]) for k in pending[0]}


def runs(c) -> np.ndarray:
    """Whether candidates (columns, or one packed row) are layouts the stack can run
    (calibrated.tp_overlap_split: its Reason.NOT_EXPRESSIBLE, which an out-of-memory row
    reports first)."""
    return ~tp_overlap_split(c)


def _closer(a, b) -> bool:
    """Whether candidate row ``a`` is a better answer than ``b``: one that fits before one
    that does not; among those that fit the faster, among the others the smaller (of equal
    memory, within MEMORY_TIE, the faster)."""
    if a["feasible"] != b["feasible"]:
        return bool(a["feasible"])
    runs_a, runs_b = bool(runs(a)), bool(runs(b))
    if runs_a != runs_b:
        return runs_a
    if a["feasible"]:
        return bool(a["samples_per_s"] > b["samples_per_s"])
    if abs(a["mem_bytes"] - b["mem_bytes"]) <= MEMORY_TIE * min(a["mem_bytes"], b["mem_bytes"]):
        return bool(a["samples_per_s"] > b["samples_per_s"])
    return bool(a["mem_bytes"] < b["mem_bytes"])


def _describe(config: Mapping[str, int]) -> str:
    from .show import RECOMPUTE_NAMES

    return ",".join(f"{k}={RECOMPUTE_NAMES.get(v, v) if k == 'recompute' else v}"
                    for k, v in config.items()) or "the default configuration"
