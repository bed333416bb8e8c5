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

from .candidates import enumerate_space
from .cost import evaluate_columns, op_table, pack_results
from .errors import SweepError
from .hardware import Hardware
from .job import Job
from .schema import CANDIDATE_DTYPE, Reason
from .search import DEFAULT_BLOCK
from .topn import best_positions

__all__ = ["Prediction", "parse_config", "predict", "CONFIG_KEYS"]

#: configuration keys a user may give (every candidate column but the index)
CONFIG_KEYS = tuple(n for n in CANDIDATE_DTYPE.names if n != "index")


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


def parse_config(text: str) -> dict[str, int]:
    """``"tp=8,pp=4"`` -> ``{"tp": 8, "pp": 4}``.

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
        try:
            v = int(value)
        except ValueError:
            raise SweepError(f"--config: {key}: expected an integer, got {value.strip()!r}") from None
        lower = 0 if key in ("recompute", "recompute_layers", "zero", "shard_group", "sp",
                             "tp_overlap", "offload") else 1
        if v < lower:
            raise SweepError(f"--config: {key}: expected an integer >= {lower}, got {v}")
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
    return ("no NVLink placement / panel count among the candidates matches the nv_* / nb "
            "given (placements must fill the domain exactly)")


def predict(profile: str, job: Job, hw: Hardware, strategy: str, n_gpus: int,
            config: Mapping[str, int]) -> Prediction:
    """Predict one configuration.

    Raises:
        SweepError: the configuration is not a candidate of this case (with the rule broken).
    """
    space = enumerate_space(profile, job, n_gpus, strategy, hw.nvlink_domain)
    best = None
    matches = 0
    for start in range(0, space.size, DEFAULT_BLOCK):
        cols = space.columns(start, start + DEFAULT_BLOCK)
        mask = np.ones(len(cols["index"]), dtype=bool)
        for k, v in config.items():
            mask &= cols[k] == v
        if not mask.any():
            continue
        sub = {k: v[mask] for k, v in cols.items()}
        metrics = evaluate_columns(profile, job, hw, strategy, n_gpus, sub)
        matches += int(mask.sum())
        # prefer feasible rows; among equals the fastest (ties: lowest index)
        pos = best_positions(metrics["samples_per_s"], metrics["feasible"], sub["index"], 1)
        if len(pos) == 0:
            pos = best_positions(metrics["samples_per_s"], np.ones_like(metrics["feasible"]),
                                 sub["index"], 1)
        cand = pack_results(sub, metrics, pos)[0]
        if best is None or (cand["feasible"], cand["samples_per_s"]) > (best["feasible"],
                                                                        best["samples_per_s"]):
            best = cand
    if best is None:
        reason = _diagnose_nersc(job, n_gpus, strategy, config) if profile == "nersc2024" \
            else "it breaks the search rules of this profile"
        raise SweepError(f"{_describe(config)} is not a {profile}/{strategy} candidate for "
                         f"{job.name} on {n_gpus} GPUs: {reason}")
    single = {k: np.array([best[k]]) for k in CANDIDATE_DTYPE.names}
    rows = op_table(profile, job, hw, strategy, single)
    ops = [{k: (v if k == "name" else float(np.asarray(v).ravel()[0])) for k, v in r.items()}
           for r in rows]
    return Prediction(profile, job, hw, strategy, n_gpus, best, ops, matches)


def _describe(config: Mapping[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items()) or "the default configuration"
