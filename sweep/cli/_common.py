"""Argument types and helpers shared by the command groups."""

from __future__ import annotations

import argparse
import json
import math
import sys

from ..errors import SweepError

DEFAULT_PROFILE = "calibrated"


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def positive_number(text: str) -> float:
    """A finite number above 0 (seconds, tokens); argparse refuses anything else (exit 2)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return v


def rank_count(text: str) -> int:
    """A number of MPI ranks, at most a million (``sweep plan --ranks``)."""
    v = positive_int(text)
    if v > 1_000_000:
        raise argparse.ArgumentTypeError(f"at most 1,000,000 ranks, got {text!r}")
    return v


def gpu_count(text: str) -> int:
    from ..engine.spec import MAX_GPUS

    v = positive_int(text)
    if v > MAX_GPUS:
        raise argparse.ArgumentTypeError(f"at most {MAX_GPUS:,} GPUs, got {text!r}")
    return v


def shard(text: str) -> tuple[int, int]:
    """``I/K``: shard I (from 0) of K."""
    index, sep, count = text.partition("/")
    try:
        i, k = int(index), int(count)
    except ValueError:
        i = k = -1
    if not sep or k < 1 or not 0 <= i < k:
        raise argparse.ArgumentTypeError(f"expected I/K with 0 <= I < K (shard I of K), "
                                         f"got {text!r}")
    return i, k


def max_variants_flag(parser: argparse.ArgumentParser) -> None:
    from ..engine.spec import DEFAULT_MAX_VARIANTS

    parser.add_argument("--max-variants", type=positive_int, default=DEFAULT_MAX_VARIANTS,
                        metavar="N", help="refuse a spec whose hardware grid expands to more "
                        f"than N variants (default {DEFAULT_MAX_VARIANTS:,}), before expanding it")


def set_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        dest="overrides",
                        help="replace a key of the spec, VALUE in YAML, a dotted KEY for a "
                             "nested one: --set gpus=256 --set hardware.grid.nvlink_domain=[8]"
                             " (repeatable; the run records the spec as resolved)")


def plan_and_estimate(spec, budget_s: float):
    """(plan, estimate of its search, CPU seconds of planning) on this machine; the estimate
    also holds ``memory``: the bytes before planning, what the plan added and the cost
    core's peak over one block (for engine.plan.estimate_memory)."""
    import time

    from ..analysis.bench import estimate_search_seconds
    from ..engine import runner  # noqa: F401  (what a run has loaded when it measures its base)
    from ..engine.plan import SpaceCache, make_plan, measure_working_set, rss_bytes

    cache = SpaceCache(spec.cost_model, offload=spec.offload)
    base = rss_bytes()  # (as sweep run measures it: the run's modules and h5py loaded)
    start = time.process_time()
    plan = make_plan(spec, cache)  # SpecError for a spec that cannot run
    plan_s = time.process_time() - start  # every rank of a run builds the plan first
    plan_bytes = max(0.0, rss_bytes() - base)
    estimate = estimate_search_seconds(plan, cache, budget_s=budget_s)
    estimate["memory"] = {"base_bytes": base, "plan_bytes": plan_bytes,
                          "startup_bytes": estimate["startup_bytes"],
                          "working_bytes": measure_working_set(plan, cache)}
    return plan, estimate, plan_s


def max_memory_flag(parser: argparse.ArgumentParser, where: str) -> None:
    parser.add_argument("--max-memory", type=memory_size, metavar="SIZE",
                        help=f"refuse (exit 2) a run whose estimated peak memory per rank "
                             f"({where}) exceeds SIZE, e.g. 1GiB or 300MiB")


def memory_size(text: str) -> float:
    """``--max-memory``: a size with its unit (``300MiB``, ``1 GiB``, ``2GB``), in bytes."""
    from ..model.units import parse_quantity

    try:
        v = parse_quantity(text, "bytes")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive size, got {text!r}")
    return v


def os_error_text(exc: OSError) -> str:
    """One line for an OSError: the file and what the system said."""
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"


def print_error(args: argparse.Namespace, exc: SweepError) -> int:
    """One line on stderr (from rank 0 only: every rank has the same error); the exit code."""
    from ..engine.runner import Interrupted

    stopped = isinstance(exc, Interrupted)
    if getattr(args, "_rank", 0) == 0:
        print(f"sweep {args.command}: {'stopped' if stopped else 'error'}: "
              f"{' '.join(str(exc).split())}", file=sys.stderr, flush=True)
    return 143 if stopped else 2


def strict_json(value, **kwargs) -> str:
    """``json.dumps`` of ``value`` with NaN and infinities as null: strict JSON, which a
    strict parser reads (Python's own writes NaN, which none does)."""
    def strict(v):
        if isinstance(v, float):
            return v if math.isfinite(v) else None
        if isinstance(v, dict):
            return {k: strict(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [strict(x) for x in v]
        return v

    return json.dumps(strict(value), allow_nan=False, **kwargs)
