"""``sweep predict``: one configuration's time, memory and per-op table."""

from __future__ import annotations

import argparse
import dataclasses
import re

import yaml

from ..analysis import fmt
from ..analysis.predict import runs
from ..engine.catalog import check_generation, load_hardware, load_job, parse_value
from ..errors import SweepError
from ..model.cost import PROFILES
from ..model.cost.calibrated import LOW_PRECISION
from ..model.schema import Reason

#: what an infeasible answer's reason code says (the fastest of the matching candidates
#: that need the least memory, runnable ones first: analysis.predict)
INFEASIBLE = {
    Reason.OUT_OF_MEMORY: "out of memory (none of the matching candidates fits: of those "
                          "needing least memory, the fastest)",
    Reason.OFFLOAD_CAPACITY: "the offloaded state exceeds the host memory tier (none of the "
                             "matching candidates fits)",
    Reason.NOT_EXPRESSIBLE: "not runnable: TP communication overlap with the TP group across "
                            "NVLink domains (Transformer Engine's userbuffers need nv_tp = tp)",
}
from ..model.hardware import apply_overrides
from ..model.job import override_job
from ._common import DEFAULT_PROFILE, gpu_count, positive_int, strict_json


def nvlink_domain(text: str) -> int:
    """``--nvlink-domain``: GPUs per NVLink domain, as a hardware file may give them."""
    from ..model.hardware import MAX_NVLINK_DOMAIN

    v = positive_int(text)
    if v > MAX_NVLINK_DOMAIN:
        raise argparse.ArgumentTypeError(f"at most {MAX_NVLINK_DOMAIN:,} GPUs, got {text!r}")
    return v


def _cmd_predict(args: argparse.Namespace) -> int:
    from ..analysis.predict import parse_config, predict

    if args.profile not in PROFILES:
        raise SweepError(f"--profile: unknown profile {args.profile!r}; "
                         f"valid: {', '.join(PROFILES)}")
    if args.strategy not in PROFILES[args.profile]:
        raise SweepError(f"--strategy: {args.strategy!r} is not a strategy of {args.profile}; "
                         f"valid: {', '.join(PROFILES[args.profile])}")
    name, overrides = _label(args.job, "--job")
    job = load_job(name, key="--job")
    if overrides:  # a job of a spec with overrides, by the label show prints
        job = dataclasses.replace(override_job(job, overrides, "--job"), name=args.job.strip())
    name, overrides = _label(args.hardware, "--hardware")
    hw = load_hardware(name, key="--hardware")
    check_generation(hw, name, args.profile, key="--hardware")
    overrides = _hardware_label_values(overrides, args.hardware)
    if overrides:  # a point of a spec's grid, by its label
        hw = dataclasses.replace(apply_overrides(hw, overrides, "--hardware"),
                                 name=args.hardware.strip())
    if args.nvlink_domain and args.nvlink_domain != hw.nvlink_domain and \
            "nvlink_domain" in overrides:  # (the label would name a domain not used)
        raise SweepError(f"--nvlink-domain {args.nvlink_domain} contradicts "
                         f"nvlink_domain={hw.nvlink_domain} in --hardware {args.hardware!r}; "
                         f"give one of them")
    if args.nvlink_domain:
        hw = dataclasses.replace(hw, nvlink_domain=args.nvlink_domain)
    config = parse_config(",".join(args.config))
    pred = predict(args.profile, job, hw, args.strategy, args.gpus, config)
    if args.json:
        print(strict_json(pred.as_dict(), indent=2))
        return 0
    print(_format_prediction(pred))
    return 0


def _label(text: str, flag: str) -> tuple[str, dict]:
    """(name, overrides) of a job or hardware label as ``sweep show`` prints a spec's cases,
    ``name[key=value,...]`` (a job's field overrides, or a hardware grid point in the spec's
    units); (text, {}) for a plain name or YAML path."""
    m = re.fullmatch(r"([^\[\]]+)\[(.*)\]", text.strip(), flags=re.DOTALL)
    if not m:
        return text, {}
    overrides = {}
    for item in filter(None, (x.strip() for x in _top_level_items(m.group(2)))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SweepError(f"{flag}: {item!r} in {text!r} is not key=value")
        try:
            overrides[key.strip()] = parse_value(value)
        except yaml.YAMLError:
            raise SweepError(f"{flag}: {key.strip()}: {value!r} is not a YAML value (quote "
                             f"a text YAML would misread: {key.strip()}=\"{value}\")") from None
    return m.group(1).strip(), overrides


def _top_level_items(text: str) -> list[str]:
    """``text`` split at its commas outside YAML flow collections and double-quoted strings:
    a value may be a per-precision table, ``matrix_tflops={bf16: 2500, fp8: 5000}``, or a
    quoted text, ``notes="a, b"`` (label_value quotes what a comma would split)."""
    items, depth, start, quoted, escaped = [], 0, 0, False, False
    for i, ch in enumerate(text):
        if quoted:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth = max(depth - 1, 0)
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    return items + [text[start:]]


def _hardware_label_values(overrides: dict, text: str) -> dict:
    """A hardware label's values as overrides: a quantity axis (``hbm_bandwidth``) is
    labelled in SI, a bare number apply_overrides reads in its SI unit; a zip or interpolate
    axis is labelled by the number of its point, which only its spec can resolve."""
    from ..model.hardware import is_parameter, quantity_dimension

    si = {"bytes": "B", "bytes_per_s": "B/s", "flops_per_s": "FLOP/s", "s": "s"}
    out = {}
    for key, value in overrides.items():
        if not is_parameter(key):
            raise SweepError(f"--hardware: {key} in {text!r} is not a hardware parameter: a "
                             f"zip or interpolate axis of a spec is labelled by its point's "
                             f"number, not its values; give the values it sets instead, as "
                             f"name[key=value,...] (a per-precision peak as "
                             f"matrix_tflops={{bf16: 2500, fp8: 5000}}), or the point as a "
                             f"hardware YAML file")
        dim = quantity_dimension(key)
        if dim and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = f"{value!r} {si[dim]}"
        out[key] = value
    return out


def _format_prediction(p, choice: str | None = None) -> str:
    """``p`` (a Prediction) as `sweep predict` prints it; ``choice`` replaces the note on
    how the configuration was picked among the matching candidates."""
    r = p.row
    calibrated = p.profile == "calibrated"
    degrees = ["dp", "tp"] + (["tp2", "nb"] if p.strategy == "2d" else []) + (
        ["cp"] if p.strategy == "2d-seqp" or calibrated else []) + ["pp"] + (
        ["vpp"] if calibrated else []) + ["mbs"]
    placement = ["nv_tp"] + (["nv_tp2"] if p.strategy == "2d" else []) + (
        ["nv_cp"] if p.strategy == "2d-seqp" or calibrated else []) + ["nv_dp", "nv_pp"]
    moe = calibrated and p.job.is_moe
    if moe:  # expert parallelism folded over the same GPUs
        degrees += ["ep", "etp"]
        placement += ["nv_ep"]
    knobs = ""
    if calibrated:
        from ..analysis.show import RECOMPUTE_NAMES

        rec = int(r["recompute"])
        knobs = (f"   sp={int(r['sp'])} tp_overlap={int(r['tp_overlap'])} recompute="
                 f"{RECOMPUTE_NAMES[rec]}" + (f" ({int(r['recompute_layers'])} layers)"
                                              if rec == 3 else "")
                 + f" zero={int(r['zero'])}" + (f" shard_group={int(r['shard_group'])}"
                                                 if r["shard_group"] else "")
                 + (f" offload={int(r['offload'])}" if r["offload"] else "")
                 + (f" cp_comm={int(r['cp_comm'])}" if r["cp"] > 1 else "")
                 + (f" a2a_overlap={int(r['a2a_overlap'])}" if moe else ""))
    step = float(r["step_time_s"])
    lines = [
        f"{p.job.name} on {p.n_gpus} x {p.hardware.name} (NVLink domain "
        f"{p.hardware.nvlink_domain}), profile {p.profile}, strategy {p.strategy}",
        "config:    " + " ".join(f"{k}={int(r[k])}" for k in degrees) + knobs,
        "NVLink:    " + " ".join(f"{k[3:]} {int(r[k])}" for k in placement)
        + "   (GPUs of each group inside one domain; "
        + (choice or f"best of {p.matches} matching candidates") + ")",
        f"step time: {fmt.seconds(step)}   throughput {float(r['samples_per_s']):.6g} samples/s, "
        f"{fmt.si(float(r['tokens_per_s']), 'tokens/s')}   MFU {fmt.percent(float(r['mfu']))}"
        f"   HFU {fmt.percent(float(r['hfu']))}"
        # (of the 16-bit peak whatever the precision: an NVFP4 run may pass 100 %)
        + ("   (MFU / HFU of the 16-bit tensor peak)" if p.job.dtype in LOW_PRECISION else ""),
        f"memory:    {fmt.gigabytes(float(r['mem_bytes']))} of "
        f"{fmt.gigabytes(p.hardware.hbm_capacity_bytes)} per GPU "
        f"(weights {fmt.gigabytes(float(r['mem_weights_bytes']))}, grads "
        f"{fmt.gigabytes(float(r['mem_grads_bytes']))}, optimizer "
        f"{fmt.gigabytes(float(r['mem_optimizer_bytes']))}, activations "
        f"{fmt.gigabytes(float(r['mem_activations_bytes']))}, other "
        f"{fmt.gigabytes(float(r['mem_other_bytes']))})   "
        + ("feasible" if r["feasible"] else "INFEASIBLE: " + INFEASIBLE[
            Reason.NOT_EXPRESSIBLE if not runs(r) else int(r["reason"])]),
        "",
        "time per iteration by op (each op summed over its micro-batches and the stage's layers)",
    ]
    cols = ("compute_s", "memory_s", "tp_comm_s", "cp_comm_s") + (
        ("ep_comm_s",) if moe else ()) + ("other_s",)
    rows, total = [], {k: 0.0 for k in ("time_s",) + cols}
    for op in p.ops:
        if op["time_s"] == 0 and calibrated:
            continue  # a knob this configuration does not use
        rows.append([op["name"], f"{op['time_s']:.6g}", fmt.percent(op["time_s"] / step)]
                    + [f"{op[c]:.4g}" if op[c] else "-" for c in cols])
        for k in total:
            total[k] += op[k]
    rows.append(["total", f"{total['time_s']:.6g}", fmt.percent(total["time_s"] / step)]
                + [f"{total[c]:.4g}" for c in cols])
    lines.append(fmt.table(["op", "time [s]", "share", "compute", "exposed HBM", "TP comm",
                            "CP comm"] + (["EP comm"] if moe else []) + ["pipeline/DP"], rows))
    return "\n".join(lines)


def add_parsers(sub) -> None:
    """Add this group's commands to the ``sweep`` subparsers ``sub``."""
    p = sub.add_parser("predict", help="one configuration: time, throughput, memory, per-op table")
    p.add_argument("--job", required=True, help="job name (jobs/<name>.yaml) or YAML path, "
                   "or a spec's job as show labels it: name[key=value,...]")
    p.add_argument("--hardware", required=True, help="hardware name or YAML path, or a "
                   "spec's grid point as show labels it: name[axis=value,...]")
    p.add_argument("--gpus", required=True, type=gpu_count, help="GPU count")
    p.add_argument("--config", action="append", default=[], help="comma-separated "
                   "key=value, e.g. tp=8,pp=4,mbs=1 (repeatable; dp defaults to what is left; "
                   "unspecified NVLink placement and panels take the best matching candidate)")
    p.add_argument("--strategy", default="1d", help="1d | 2d | 2d-seqp (default 1d)")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help="cost profile "
                   f"(default {DEFAULT_PROFILE})")
    p.add_argument("--nvlink-domain", type=nvlink_domain, help="override the NVLink domain "
                   "size")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=_cmd_predict)
