"""The measured-run data contract: the columns of a CSV of measured training runs, the values
its label columns take, and how a row is read. ``sweep validate`` and ``sweep calibrate`` both
read through it; it imports neither.

Two layouts are read into one row type, :class:`Run`: that of
``sweep/data/measured_training_runs.csv`` (a row gives its model's dimensions) and that of
``sweep/data/measured_moe_blackwell.csv`` (a row names its model, found in ``jobs/``, and has
``step_time_s``, ``fsdp``, ``is_moe``, ``system``, ``nvlink_domain``, ``other_flags``).

Columns (:data:`COLUMNS`; other spellings in :data:`ALIASES`; empty = not stated):

* the run: ``id``, ``source``, ``framework`` (:data:`FRAMEWORKS`), ``gpu`` (a product name,
  matched to the hardware catalog by :func:`match_gpu`), ``n_gpus``, ``precision``
  (:data:`PRECISIONS`), ``seq_len``, ``global_batch_seqs``;
* the model: ``n_layers``, ``hidden``, ``ffn_hidden``, ``n_heads`` (and ``n_kv_heads``,
  ``vocab``, ``arch_notes``), or ``model``, a name in ``jobs/`` (:func:`resolve_model`;
  dimension columns given, or notes saying "truncated model: N layers", override its);
  ``is_moe`` (1: a mixture-of-experts run, which must name a ``jobs/`` model with experts);
* the layout: ``tp``, ``pp``, ``dp``, ``cp``, ``vp``, ``sp``, ``ep``, ``etp``, ``micro_batch``,
  ``zero_fsdp`` or ``fsdp`` (:data:`SHARDING`), ``recompute``, ``gpus_per_node``,
  ``nvlink_domain``, ``interconnect``, ``compile``;
* metrics, at least one: ``iter_time_s``, ``tokens_per_s_per_gpu``, ``tokens_per_s_total``,
  ``samples_per_s``, ``tflops_per_gpu`` with ``flops`` (:data:`FLOPS`), ``mfu`` with
  ``peak_tflops_used``; and ``mem_per_gpu_GB`` with ``mem_definition``
  (:data:`MEMORY_DEFINITIONS`: reserved, the default, or allocated; some sources' default is
  in :data:`MEMORY_DEFINITION_OF_SOURCE`), ``outcome`` (``ok`` or ``OOM``).

A row that cannot be read is a :class:`Refusal`: why, and for a label not recognised the
nearest accepted values (difflib). A precision the cost model does not model, or one the
GPU has no tensor cores for (fp8 on an A100), is refused, never costed as another.
"""

from __future__ import annotations

import csv
import difflib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..engine.catalog import list_names, load_hardware, load_job, search_roots
from ..errors import SweepError
from ..model.cost.calibrated import unsupported_precision
from ..model.cost.flops import model_flops_per_token
from ..model.hardware import Hardware
from ..model.job import Job

__all__ = ["DEFAULT_DATA", "SHIPPED", "COLUMNS", "ALIASES", "REQUIRED_COLUMNS", "DIMENSIONS",
           "LAYOUT", "METRICS", "FLOPS", "PRECISIONS", "SHARDING", "FRAMEWORKS", "MOE", "Run",
           "Refusal", "Case", "read_runs", "read_data", "data_paths", "canonical", "parse_run",
           "match_gpu", "resolve_model", "framework_of", "precision_of", "flops_of",
           "sharding_of", "nearest", "suggest", "metric_of", "iteration_flops", "MODEL_FILE_NOTE"]

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
DEFAULT_DATA = DATA_DIR / "measured_training_runs.csv"
#: the measured runs shipped with sweep (``--data all``)
SHIPPED = (DEFAULT_DATA, DATA_DIR / "measured_moe_blackwell.csv")

#: the documented columns (canonical names)
COLUMNS = {
    "id": "unique id of the row", "source": "who published it", "table": "their table",
    "source_ref": "where exactly", "release": "software release", "date": "YYYY-MM",
    "framework": "training stack (FRAMEWORKS)", "model": "model name, a jobs/ entry",
    "is_moe": "1 for a mixture-of-experts model", "n_layers": "transformer blocks",
    "hidden": "model width", "ffn_hidden": "MLP width", "n_heads": "attention heads",
    "n_kv_heads": "key/value heads", "vocab": "vocabulary", "seq_len": "tokens per sequence",
    "arch_notes": "SwiGLU / RMSNorm / RoPE / untied / biases on / squared-ReLU",
    "gpu": "GPU product name", "system": "system name (DGX-GB200, ...)",
    "n_gpus": "GPUs of the run", "gpus_per_node": "GPUs per node",
    "nvlink_domain": "GPUs per NVLink domain (72 on NVL72)",
    "interconnect": "scale-out network", "tp": "tensor parallel", "pp": "pipeline stages",
    "dp": "data parallel", "cp": "context parallel", "sp": "sequence parallel: yes / no",
    "vp": "virtual stages per GPU", "ep": "expert parallel",
    "etp": "expert tensor parallel (default: the stack's)", "pp_schedule": "pipeline schedule",
    "zero_fsdp": "sharding (SHARDING)", "fsdp": "FSDP shard GPUs: 0 none, 1 the DP group, N",
    "recompute": "none / selective / full / recompute_num_layers=N / per-op SAC",
    "global_batch_seqs": "sequences per iteration", "micro_batch": "sequences per micro-batch",
    "precision": "PRECISIONS", "compile": "torch.compile: yes / no",
    "tflops_per_gpu": "TFLOP/s per GPU", "flops": "its FLOP count (FLOPS)",
    "mfu": "model FLOP utilisation", "hfu": "hardware FLOP utilisation",
    "peak_tflops_used": "the peak MFU divides by", "tokens_per_s_per_gpu": "tokens/s/GPU",
    "tokens_per_s_total": "tokens/s", "samples_per_s": "sequences/s",
    "iter_time_s": "seconds per iteration", "mem_per_gpu_GB": "peak memory per GPU, GiB",
    "outcome": "ok or OOM", "notes": "free text", "metric_notes": "free text",
    "other_flags": "free text (torch.compile, TP comm overlap disabled, no overlap-p2p, "
                   "CP comm a2a, cpu_offloading_num_layers=N, expert_tensor_parallel_size=N, "
                   "moe_a2a_overlap=True, moe_flex_dispatcher_backend=..., w/o MTP, "
                   "token-drop are read)",
}
#: other spellings of a column -> its canonical name
ALIASES = {"step_time_s": "iter_time_s", "tflops_definition": "flops"}
#: columns a file may carry for its readers, not read here (the shipped dense runs' file)
INFORMATIONAL = ("n_params_B", "gpu_mem_GB", "n_nodes", "grad_accum", "inferred_fields",
                 "data_file")  # (data_file: the file a row was read from, written back)
REQUIRED_COLUMNS = ("id", "source", "framework", "gpu", "n_gpus", "precision", "seq_len",
                    "global_batch_seqs")
#: a row gives these, or names its ``model``
DIMENSIONS = ("n_layers", "hidden", "ffn_hidden", "n_heads")
#: layout columns: a positive whole number, or empty (unstated)
LAYOUT = ("tp", "pp", "dp", "cp", "vp", "ep", "etp", "micro_batch", "gpus_per_node",
          "nvlink_domain")
#: published metrics, in the order of preference (the most direct measurement first)
METRICS = ("iter_time_s", "tokens_per_s_per_gpu", "tokens_per_s_total", "samples_per_s",
           "tflops_per_gpu")

#: FLOP conventions of a TFLOP/s or MFU column
FLOPS = {
    "model": "model FLOPs, no recompute, attention counted in full (Megatron-Core r0.8 "
             "num_floating_point_operations; Korthikanti et al. 2022 sec. 6)",
    "model-causal": "model FLOPs, no recompute, causal attention counted half "
                    "(Megatron-Bridge training/utils/flop_utils.py)",
    "model-6n": "6 x parameters + non-causal attention per token (PaLM appendix B, nanoGPT, "
                "llm-foundry)",
    "hardware-eq3": "Narayanan et al. 2021 eq. 3: the recompute forward counted",
    "hardware": "every executed FLOP, as a FLOP counter sees it (HFU)",
}
_FLOPS_NAMES = {"eq3": "hardware-eq3", "mfu": "model", "hfu": "hardware"}
#: (pattern in the lowercased text, convention): the first that matches
_FLOPS_TEXT = [
    (r"eq\. ?3|eq3|equation 3", "hardware-eq3"),
    (r"non-?causal|\b6n\b|palm|nanogpt", "model-6n"),
    (r"causal", "model-causal"),
    (r"model[ _-]?t?flop|mfu ?= ?tflops|korthikanti|nemo formula|\bmfu\b", "model"),
    (r"\bhfu\b|hardware flop|flop counter", "hardware"),
]

#: the note of a row whose dimensions come from a jobs/ file (validate.predict_command reads
#: the file's name back from it)
MODEL_FILE_NOTE = "model dimensions from jobs/{}.yaml"

#: precision -> the Job dtype it is costed as; None: not modelled (such rows are refused)
PRECISIONS = {
    "fp32": "fp32", "bf16": "bf16", "fp16": "fp16",
    "fp8": "fp8",  # recipe unstated
    "fp8-delayed": "fp8",  # Transformer Engine delayed scaling
    "fp8-current": "fp8",  # per-tensor current scaling (Megatron-Bridge FP8-CS)
    "fp8-tensorwise": "fp8",  # torchao float8 tensorwise (dynamic per-tensor)
    "fp8-rowwise": "fp8",  # torchao float8 rowwise
    "fp8-blockwise": "fp8",  # 128x128 weight / 1x128 activation blocks (DeepSeek-V3)
    "mxfp8": "mxfp8",  # OCP MX: 32-element blocks with E8M0 scales (FP8-MX)
    "nvfp4": "nvfp4",  # 16-element blocks with E4M3 scales
}
#: (pattern, precision): the earliest match in the text wins, ties in this order
_PRECISION_TEXT = [
    (r"nv-?fp4", "nvfp4"), (r"mx-?fp8|fp8[-_ ]?mx", "mxfp8"), (r"fp8|float8|e4m3", "fp8"),
    (r"bf16|bfloat16", "bf16"), (r"fp16|float16", "fp16"), (r"fp32|float32|tf32", "fp32")]
_FP8_RECIPES = [
    (r"block|subchannel|128x128|1x128", "fp8-blockwise"), (r"delayed", "fp8-delayed"),
    (r"current|(?<![a-z])cs(?![a-z])", "fp8-current"),
    (r"tensor-?wise|per-tensor", "fp8-tensorwise"), (r"row-?wise|per-row", "fp8-rowwise")]

#: sharding names -> what they shard (ZeRO stage: none 0 ... zero-3 3)
SHARDING = {
    "none": "nothing: plain data parallelism",
    "zero-1": "optimizer state (Megatron distributed optimizer)",
    "zero-2": "optimizer state and gradients (FSDP SHARD_GRAD_OP)",
    "zero-3": "parameters too (FSDP FULL_SHARD; dp_shard=N or FSDP=N: over N GPUs)",
    "hsdp": "zero-3 within a node, replicated across nodes",
}

#: framework -> (display name, pattern in the lowercased label); the first that matches
FRAMEWORKS = {
    "megatron-lm-2021": ("Megatron-LM (2021)", r"megatron[- ]?lm\W*2021"),
    "megatron-lm-2022": ("Megatron-LM (2022)", r"megatron[- ]?lm\W*2022"),
    "megatron-deepspeed": ("Megatron-DeepSpeed", r"megatron[- ]?deepspeed"),
    "deepspeed-zero3": ("DeepSpeed ZeRO-3", r"deepspeed\W*zero[- ]?3"),
    "nemo": ("NeMo", r"\bnemo\b"),
    "megatron-bridge": ("Megatron-Bridge", r"megatron[- ]?bridge|\bmbridge\b"),
    "megatron-core": ("Megatron-Core", r"megatron[- ]?core|\bmcore\b"),
    "composer": ("Composer", r"composer|llm[- ]?foundry"),
    "fms-fsdp": ("fms-fsdp", r"fms[- ]?fsdp"),
    "torchtitan": ("torchtitan", r"torch[- ]?titan"),
}

MOE = "a mixture-of-experts row must name its model (a jobs/ entry with its experts)"
#: other names of jobs/ entries: Llama 3.1 has Llama 3's dimensions, and the 405B was
#: released only as 3.1 (Llama Team 2024, arXiv 2407.21783, Table 3)
MODEL_ALIASES = {"Llama3.1-8B": "llama3_8b", "Llama3.1-70B": "llama3_70b",
                 "Llama3.1-405B": "llama3_405b", "Grok-1-314B": "grok1_314b",
                 "Llama4-Maverick-400B": "llama4_maverick", "Llama4-Scout-109B": "llama4_scout",
                 "Llama4-Scout (2-layer debug)": "llama4_scout",
                 "Nemotron-3-Super-120B-A12B": "nemotron_3_super",
                 "Nemotron-3-Ultra-550B-A55B": "nemotron_3_ultra",
                 "Nemotron-3.5-Lightning-30B-A3B": "nemotron_3_5_lightning"}


@dataclass(frozen=True)
class Refusal:
    """Why a row is not expressed: ``kind`` groups rows (the summary counts them per kind),
    ``reason`` is the row's own sentence."""

    kind: str
    reason: str

    def __str__(self) -> str:
        return self.reason


@dataclass(frozen=True)
class Run:
    """A measured row read through the contract: its columns by their canonical names and
    its labels resolved to the enumerated values."""

    values: Mapping[str, str]  # canonical column -> text ("" = not stated)
    hardware: str  # hardware catalog name
    framework: str  # a FRAMEWORKS key
    precision: str  # a PRECISIONS key
    dtype: str  # the Job dtype it is costed as
    flops: str | None  # a FLOPS key; None: not stated or not recognised
    shape: Mapping[str, int]  # n_layers, hidden, ffn_hidden, n_heads, n_kv_heads, head_dim,
    #                           vocab, seq_len, n_gpus, global_batch_seqs
    model: Job | None = None  # the named model (jobs/), when the row gives no dimensions
    notes: tuple[str, ...] = ()  # what reading the row assumed


#: what a measured memory figure counts: ``reserved`` (nvidia-smi, or
#: torch.cuda.max_memory_reserved: the allocator's cache and the CUDA context included, the
#: default) or ``allocated`` (torch.cuda.max_memory_allocated: live tensors only)
MEMORY_DEFINITIONS = ("reserved", "allocated")
#: sources whose .md says which one they publish (column ``mem_definition`` overrides)
MEMORY_DEFINITION_OF_SOURCE = {
    "SimuMax B200 release v1.2": "allocated",  # measured_moe_blackwell.md: "peak allocated"
}


def memory_definition(row: Mapping[str, str]) -> str:
    """What the row's ``mem_per_gpu_GB`` counts (MEMORY_DEFINITIONS).

    Raises:
        SweepError: an unknown ``mem_definition`` value.
    """
    given = (row.get("mem_definition") or "").strip().lower()
    if given and given not in MEMORY_DEFINITIONS:
        raise SweepError(f"row {row.get('id')}: mem_definition {given!r}: expected one of "
                         f"{', '.join(MEMORY_DEFINITIONS)}")
    return given or MEMORY_DEFINITION_OF_SOURCE.get(row.get("source", ""), "reserved")


@dataclass
class Case:
    """One measured run, expressed: what to evaluate and what to compare with."""

    row: Mapping[str, str]
    job: Job
    hw: Hardware
    n_gpus: int
    options: np.ndarray  # (k,) CANDIDATE_DTYPE: the configuration, or the choices left open
    metric: str
    measured: float
    flops: float = 0.0  # FLOPs per iteration by the source's formula (TFLOP/s metrics)
    mem_measured_bytes: float | None = None
    mem_definition: str = "reserved"  # what the measured memory counts (MEMORY_DEFINITIONS)
    oom: bool = False
    assumptions: list[str] = field(default_factory=list)

    @property
    def source(self) -> str:
        return self.row["source"]

    @property
    def group(self) -> str:
        """The sweep a row belongs to (its source and table)."""
        return f"{self.row['source']} / {self.row.get('table', '')}"


# ------------------------------------------------------------------------------ files

def read_runs(path: Path) -> list[dict[str, str]]:
    """Rows of a measured-runs CSV (either layout), each with ``data_file``: the file's name.

    Raises:
        SweepError: unreadable file, or columns missing (named).
    """
    path = Path(path)
    try:
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            have = set(reader.fieldnames or [])
            # a column name not documented (a typo: recompte) would be read as absent
            known = {*COLUMNS, *ALIASES, *INFORMATIONAL}
            unknown = [c for c in (reader.fieldnames or []) if c not in known]
            if unknown:
                c = unknown[0]
                raise SweepError(f"{path}: unknown column {c!r} ({suggest(c, sorted(known))}"
                                 f"the documented ones: sweep/analysis/measured.py COLUMNS)")
            have |= {ALIASES[c] for c in have if c in ALIASES}
            missing = [c for c in REQUIRED_COLUMNS if c not in have]
            if not set(DIMENSIONS) <= have and "model" not in have:
                missing += [c for c in DIMENSIONS if c not in have]
                missing[-1] += " (or model)"
            if missing:
                raise SweepError(f"{path}: missing column(s): {', '.join(missing)}")
            if not have & {*METRICS, "mfu", "outcome"}:
                raise SweepError(f"{path}: no metric column (one of {', '.join(METRICS)}, "
                                 f"step_time_s, mfu)")
            return [dict(r, data_file=path.name) for r in reader]
    except OSError as exc:
        raise SweepError(f"{path}: cannot read ({exc.strerror})") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise SweepError(f"{path}: not a CSV file ({exc})") from None


def data_paths(data: str | Path | None) -> list[Path]:
    """The files ``--data`` names: a path; ``all`` (the shipped files); or a shipped file's
    name or stem (``measured_moe_blackwell``); default both shipped files (what
    ``hardware/calibration.yaml`` is fitted on)."""
    if data is None:
        return list(SHIPPED)
    if str(data) == "all":
        return list(SHIPPED)
    path = Path(data)
    if not path.exists():
        for shipped in SHIPPED:
            if str(data) in (shipped.name, shipped.stem):
                return [shipped]
    return [path]


def read_data(paths: Sequence[Path]) -> list[dict[str, str]]:
    """Rows of every file, in order.

    Raises:
        SweepError: an id given twice (a row's errors, assumptions and the fit's weights
            are keyed by it), naming both places.
    """
    rows: list[dict[str, str]] = []
    seen: dict[str, str] = {}
    for p in paths:
        for k, r in enumerate(read_runs(p)):
            rid = (r.get("id") or "").strip()
            where = f"{p} line {k + 2}"  # (after the header)
            if rid and rid in seen:
                raise SweepError(f"{where}: id {rid!r} is already the id of {seen[rid]}")
            seen[rid] = where
            rows.append(r)
    return rows


def canonical(row: Mapping[str, str]) -> dict[str, str]:
    """The row under the canonical column names, every documented column present."""
    out = {c: "" for c in COLUMNS}
    out.update({k: v or "" for k, v in row.items() if k is not None})
    for alias, name in ALIASES.items():
        if not out[name].strip() and (row.get(alias) or "").strip():
            out[name] = row[alias]
    if not out["compile"] and "torch.compile" in out["other_flags"]:
        out["compile"] = "yes"
    dated = re.search(r"\b(20\d\d-[01]\d)\b", out["release"])
    if not out["date"].strip() and dated:  # "README 2026-03": the release's month
        out["date"] = dated.group(1)
    return out


# ------------------------------------------------------------------------------ labels

def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def nearest(value: str, accepted: Sequence[str], n: int = 3) -> list[str]:
    """The accepted values closest to ``value`` (difflib, ignoring case)."""
    low = {a.lower(): a for a in accepted}
    return [low[m] for m in difflib.get_close_matches(value.lower().strip(), list(low), n,
                                                      cutoff=0.4)]


def suggest(value: str, accepted: Sequence[str]) -> str:
    """"nearest: a, b; " (the start of a parenthesis), or "" when nothing is close."""
    close = nearest(value, accepted)
    return f"nearest: {', '.join(close)}; " if close else ""


def flops_of(text: str, framework: str = "") -> str | None:
    """The FLOPS convention a ``flops`` / ``tflops_definition`` text names, or None."""
    t = text.lower().strip()
    if t in FLOPS or t in _FLOPS_NAMES:
        return _FLOPS_NAMES.get(t, t)
    # the Megatron-LM README's MFU (its model table divides model TFLOP/s by 989)
    if "mfu per readme" in t:
        return "model" if "megatron" in framework.lower() else None
    for pattern, name in _FLOPS_TEXT:
        if re.search(pattern, t):
            return name
    return None


def precision_of(text: str) -> str | None:
    """The PRECISIONS name a precision label gives ("FP8-CS" -> fp8-current, "FP8-MX" ->
    mxfp8, "fp16 mixed" -> fp16, "BF16" -> bf16): the first precision named; None if none."""
    t = text.lower().strip()
    if t in PRECISIONS:
        return t
    found = [(m.start(), i, name) for i, (pattern, name) in enumerate(_PRECISION_TEXT)
             if (m := re.search(pattern, t))]
    if not found:
        return None
    name = min(found)[2]
    if name == "fp8":
        name = next((r for pattern, r in _FP8_RECIPES if re.search(pattern, t)), "fp8")
    return name


def framework_of(text: str) -> str | None:
    """The FRAMEWORKS key a framework label names ("NeMo 25.11 / Megatron-Bridge" -> nemo),
    or None."""
    t = text.lower()
    return next((k for k, (_, pattern) in FRAMEWORKS.items() if re.search(pattern, t)), None)


def sharding_of(zero_fsdp: str, fsdp: str, node: int) -> tuple[int, int, bool] | None:
    """(ZeRO stage, shard group (0: the whole DP group), stated) from the ``zero_fsdp`` text
    or else the ``fsdp`` count; HSDP without a stated group shards within a node of ``node``
    GPUs. Unstated: the distributed optimizer (ZeRO-1), ``stated`` False. None: not
    understood."""
    t = zero_fsdp.lower()
    if not t:
        f = fsdp.strip().lower()
        if f in ("", "0", "no", "false"):  # Megatron-Bridge FSDP 0: plain DDP
            return 1, 0, False
        if f in ("1", "yes", "true"):  # FSDP 1: over the data-parallel group
            return 3, 0, True
        t = f if not f.isdigit() else f"fsdp={f}"
    if "hsdp" in t:
        return 3, node, True
    m = re.search(r"dp_shard=(\d+)", t)
    if m:
        return 3, int(m.group(1)), True
    if "full_shard" in t or "full shard" in t or "zero-3" in t:
        return 3, 0, True
    if "shard_grad_op" in t or "zero-2" in t:
        return 2, 0, True
    if "zero-1" in t or "distributed optimizer" in t:
        return 1, 0, True
    if t.startswith("none"):
        return 0, 0, True
    m = re.search(r"zero[-_ ]?(?:stage[-_ ]?)?([0-3])", t)
    if m:
        return int(m.group(1)), 0, True
    m = re.search(r"fsdp2?\s*(?:[=(:]|\s)\s*(\d+)", t)
    if m:
        n = int(m.group(1))
        return 3, n if n > 1 else 0, True
    if "fsdp" in t:
        return 3, 0, True
    return None


# ------------------------------------------------------------------------------ GPUs

#: a GPU product in a label: GB200, B300, H100, A100, V100, ... (not NVL72's "L72")
_PRODUCT = re.compile(r"(?<![a-z0-9])(g[bh]\d{3}|[abhlv]\d{2,3})(?!\d)")
_MEMORY = re.compile(r"(?<![a-z0-9.])(\d+(?:\.\d+)?)\s*(gib|gb)(?![a-z0-9/])")
_POWER = re.compile(r"(?<![a-z0-9.])(\d{3,4})\s*w(?![a-z0-9])")


def _label_text(label: str) -> str:
    # "DGXH100" -> "dgx h100"
    return re.sub(r"(dgx|hgx)(?=[a-z]+\d)", r"\1 ", label.lower())


@dataclass(frozen=True)
class _Entry:
    name: str
    product: str  # the name starts with it (nersc-* entries are the paper's, never matched)
    gb: float  # HBM capacity, 1e9 bytes
    gib: float
    power: int | None  # a power limit in the name (H100-96GB-500W)
    pcie: bool
    memory_named: bool


@lru_cache(maxsize=8)
def _entries(names: tuple[str, ...], roots: tuple[str, ...]) -> tuple[_Entry, ...]:
    """The catalog entries named after a GPU product (``roots``: the catalogs searched, part
    of the cache key only)."""
    out = []
    for name in names:
        low = name.lower()
        m = _PRODUCT.match(low)
        if not m:
            continue
        try:
            cap = load_hardware(name).hbm_capacity_bytes
        except SweepError:  # a broken catalog file: not a candidate
            continue
        p = _POWER.search(low)
        out.append(_Entry(name, m.group(1), cap / 1e9, cap / 2**30,
                          int(p.group(1)) if p else None, "pcie" in low,
                          bool(_MEMORY.search(low))))
    return tuple(out)


def _gpu_unknown(label: str, names: Sequence[str], why: str = "") -> Refusal:
    why = why or f"GPU {label!r} is not in the hardware catalog"
    return Refusal("GPU not in the hardware catalog",
                   f"{why} ({suggest(label, names)}use a catalog name: {', '.join(names)})")


def match_gpu(label: str, system: str = "") -> str | Refusal:
    """The hardware catalog entry a GPU product name means.

    A catalog name (any case or separators) is itself; otherwise the product (GB300, B200,
    H100, ...) must be that of exactly one entry named after it, after these filters: the
    memory size a label states (within 10 %, GB or GiB), its power limit in watts (else
    entries without one; "power limited" without watts matches nothing), PCIe (else SXM).
    System words (DGX, HGX, NVL72, SXM5, Eos, ...) are ignored; the ``system`` column is read
    when the label names no product, and for a power limit.
    """
    names = list_names("hardware")
    text = _label_text(label)
    if re.search(r"power[- ]limit", f"{text} {system.lower()}") and not _POWER.search(text):
        return Refusal("power-limited GPU not in the hardware catalog",
                       f"GPU {label!r} ({system or 'power limited'}): a power limit without "
                       f"its watts (a limited part is its own catalog entry, as "
                       f"H100-96GB-500W)")
    exact = {_squash(n): n for n in names}
    if _squash(label) in exact:
        return exact[_squash(label)]
    m = _PRODUCT.search(text) or _PRODUCT.search(_label_text(system))
    roots = tuple(str(r.resolve()) for r in search_roots())
    entries = [e for e in _entries(tuple(names), roots) if m and e.product == m.group(1)]
    if not entries:
        return _gpu_unknown(label, names)
    product = m.group(1).upper()
    listed = ", ".join(f"{e.name} ({e.gib:.0f} GiB)" if abs(e.gib - round(e.gib)) < .05
                       else f"{e.name} ({e.gb:.0f} GB)" for e in entries)
    mem, power = _MEMORY.search(text), _POWER.search(text)
    if mem:
        size = float(mem.group(1))
        entries = [e for e in entries if min(abs(size / e.gb - 1), abs(size / e.gib - 1)) <= .1]
        if not entries:
            return Refusal("GPU not in the hardware catalog",
                           f"GPU {label!r}: no {product} with {size:g} GB in the hardware "
                           f"catalog (its {product}: {listed})")
    if power:
        entries = [e for e in entries if e.power == int(power.group(1))]
    else:
        entries = [e for e in entries if e.power is None] or entries
    pcie = "pcie" in text
    entries = [e for e in entries if e.pcie == pcie] or ([] if pcie else entries)
    if len(entries) > 1 and not mem:
        entries = [e for e in entries if not e.memory_named] or entries
    if len(entries) == 1:
        return entries[0].name
    if not entries:
        return Refusal("GPU not in the hardware catalog",
                       f"GPU {label!r} is not in the hardware catalog (its {product}: {listed})")
    return Refusal("GPU ambiguous", f"GPU {label!r} is ambiguous: "
                                    f"{' or '.join(e.name for e in entries)} (give its memory)")


# ------------------------------------------------------------------------------ models

def resolve_model(name: str) -> Job | Refusal:
    """The ``jobs/`` entry a model name means: names compare without case or separators
    (Llama3-70B -> llama3_70b), MODEL_ALIASES added."""
    names = list_names("jobs")
    index = {_squash(n): n for n in names}
    index.update({_squash(k): v for k, v in MODEL_ALIASES.items() if v in names})
    if _squash(name) in index:
        return load_job(index[_squash(name)])
    return Refusal("model not in jobs/", f"model {name!r} is not in jobs/ ({suggest(name, names)}"
                                         f"add jobs/<name>.yaml, or give {', '.join(DIMENSIONS)})")


# ------------------------------------------------------------------------------ rows

def _int(values: Mapping[str, str], key: str) -> int | None:
    text = (values.get(key) or "").strip()
    try:
        v = float(text)
    except ValueError:
        return None
    return int(v) if math.isfinite(v) and v == int(v) else None


def _whole(values: Mapping[str, str], keys: Sequence[str]) -> dict[str, int] | Refusal:
    """The columns ``keys`` as positive whole numbers, or why not."""
    out = {}
    for k in keys:
        v, text = _int(values, k), values[k].strip()
        if v is None:
            return Refusal(f"{k} unknown" if not text else f"{k} not a whole number",
                           f"{k} {text!r} is not a whole number" if text else f"{k} unknown")
        if v <= 0:
            return Refusal(f"{k} not positive", f"{k} {text!r} is not positive")
        out[k] = v
    return out


def _truncated_layers(text: str, layers: int) -> int | None:
    """Layers of a truncated benchmark model the notes state ("truncated model: 4 layers",
    "layers reduced 48->2", "layers=2" below the model's own)."""
    for pattern in (r"truncated model:\s*(\d+) layers", r"layers reduced \d+\s*->\s*(\d+)",
                    r"(?:^|[|;]\s*)layers=(\d+)"):
        found = re.search(pattern, text)
        if found and 0 < int(found.group(1)) < layers:
            return int(found.group(1))
    return None


def _shape(v: Mapping[str, str]) -> tuple[dict[str, int], Job | None, list[str]] | Refusal:
    """The model's dimensions, from the columns or from the named model."""
    run_keys = ("seq_len", "n_gpus", "global_batch_seqs")
    if v["model"].strip() and not all(v[k].strip() for k in DIMENSIONS):
        job = resolve_model(v["model"].strip())
        if isinstance(job, Refusal):
            return job
        given = [k for k in DIMENSIONS if v[k].strip()]  # columns given override the model's
        shape = _whole(v, run_keys + tuple(given))
        if isinstance(shape, Refusal):
            return shape
        notes = [MODEL_FILE_NOTE.format(job.name)]
        cut = _truncated_layers(v["notes"] + " | " + v["other_flags"], job.n_layers)
        if cut and "n_layers" not in given:
            shape["n_layers"] = cut
            notes.append(f"truncated model: {cut} of {job.n_layers} layers (notes)")
        for k in DIMENSIONS:
            shape.setdefault(k, getattr(job, k))
        resized = {"hidden", "n_heads"} & set(given)
        shape.update(n_kv_heads=_int(v, "n_kv_heads") or job.n_kv_heads,
                     head_dim=shape["hidden"] // shape["n_heads"] if resized else job.head_dim,
                     vocab=_int(v, "vocab") or job.vocab)
        return shape, job, notes
    shape = _whole(v, DIMENSIONS + run_keys)
    if isinstance(shape, Refusal):
        return shape
    heads = shape["n_heads"]
    shape.update(n_kv_heads=_int(v, "n_kv_heads") or heads, head_dim=shape["hidden"] // heads,
                 vocab=_int(v, "vocab") or 0)
    return shape, None, []


def _bad_measure(text: str) -> bool:
    """Whether ``text`` is no number at all, or one below 0 (-inf too; nan and inf are a
    cell not given)."""
    try:
        return float(text) < 0
    except ValueError:
        return True


def parse_run(row: Mapping[str, str]) -> Run | Refusal:
    """A CSV row (either layout) read through the contract, or why it cannot be."""
    v = canonical(row)
    if (v["outcome"] or "ok") not in ("ok", "OOM"):
        return Refusal("outcome neither ok nor OOM",
                       f"outcome {row.get('outcome')!r} is neither ok nor OOM")
    got = _shape(v)
    if isinstance(got, Refusal):
        return got
    moe_row = v["is_moe"].strip().lower() in ("1", "yes", "true") or (_int(v, "ep") or 1) > 1
    if moe_row and (got[1] is None or not got[1].is_moe):
        return Refusal(MOE, MOE)
    for k in LAYOUT:  # optional, but a whole number above 0 when given
        text = v[k].strip()
        if text and (_int(v, k) or 0) <= 0:
            return Refusal("layout value not a positive whole number",
                           f"{k} {text!r} is not a positive whole number")
    for k in (*METRICS, "mfu", "hfu", "peak_tflops_used", "mem_per_gpu_GB"):
        # (a measured value that is not a number, or below 0, is an error in the row, not a
        # metric left out: '137,5' or -5 were refused as "no time-based metric", and a
        # negative memory was compared; 0 - a published table's rounding - and nan count as
        # not given, as an empty cell)
        text = v.get(k, "").strip()
        if text and _bad_measure(text):
            return Refusal("measured value not a number",
                           f"{k} {text!r} is not a number of 0 or more")
    shape, model, notes = got
    hardware = match_gpu(v["gpu"], v["system"])
    if isinstance(hardware, Refusal):
        return hardware
    framework = framework_of(v["framework"])
    if framework is None:
        shown = [d for d, _ in FRAMEWORKS.values()]
        return Refusal("framework unknown", f"framework {v['framework']!r} unknown "
                                            f"({suggest(v['framework'], shown)}it must name a "
                                            f"known stack: {', '.join(shown)})")
    precision = precision_of(v["precision"])
    if precision is None:
        text = v["precision"].strip()
        return Refusal("precision unknown",
                       (f"precision {text!r} not recognised ({suggest(text, list(PRECISIONS))}"
                        if text else "precision unknown (") +
                       f"accepted: {', '.join(PRECISIONS)})")
    dtype = PRECISIONS[precision]
    if dtype is None:
        plain = [p for p, d in PRECISIONS.items() if d and not p.startswith("fp8-")]
        recipes = [p[4:] for p, d in PRECISIONS.items() if d and p.startswith("fp8-")]
        return Refusal(f"precision {precision} is not modelled",
                       f"precision {precision} ({v['precision']!r}) is not modelled (modelled: "
                       f"{', '.join(plain)}; fp8 {' / '.join(recipes)} scaling)")
    why = unsupported_precision(dtype, load_hardware(hardware))
    if why:  # e.g. fp8 on an A100: no tensor cores for it, never another format's peak
        return Refusal("precision not supported by the GPU", why)
    return Run(v, hardware, framework, precision, dtype, flops_of(v["flops"], v["framework"]),
               shape, model, tuple(notes))


# ------------------------------------------------------------------------------ metrics

def megatron_eq3_flops(B, s, L, e, V) -> float:
    """Narayanan et al. 2021 eq. 3: 96 B s l h^2 (1 + s / 6h + V / 16 l h) per iteration,
    counting the recompute forward (used by Megatron-LM 2021, BLOOM and MT-NLG logs)."""
    return 96.0 * B * s * L * e**2 * (1.0 + s / (6.0 * e) + V / (16.0 * L * e))


def megatron_core_flops(B, s, L, e, f, H, Kv, d, V, swiglu, causal=False) -> float:
    """Megatron-Core (r0.8, July 2024) num_floating_point_operations: model FLOPs with
    non-causal attention, GQA and gated MLPs; no recompute:
    12 B s L e^2 ((1 + Kv/H + s/e) (H d / e) + (f/e)(3/2 if gated) + V / (2 L e)).
    ``causal``: the attention scores counted half (Megatron-Bridge flop_utils.py, s/2)."""
    gated = 1.5 if swiglu else 1.0
    scores = s / (2.0 * e) if causal else s / e
    return 12.0 * B * s * L * e**2 * ((1.0 + Kv / H + scores) * (H * d / e)
                                      + (f / e) * gated + V / (2.0 * L * e))


def iteration_flops(convention: str | None, job: Job, B: int) -> float | None:
    """FLOPs of one iteration of B sequences counted by ``convention``; None when there is
    no formula for it here."""
    if convention == "hardware-eq3":
        return megatron_eq3_flops(B, job.seq_len, job.n_layers, job.hidden, job.vocab)
    if convention in ("model", "model-causal") and (job.is_moe or job.attention != "mha"):
        # Megatron-Bridge / Megatron-LM transformer_flops for MoE, MLA and MTP (top-k routed
        # and shared experts, causal attention; sweep.model.cost.flops)
        return model_flops_per_token(job) * float(B) * job.seq_len
    if convention in ("model", "model-causal"):
        return megatron_core_flops(B, job.seq_len, job.n_layers, job.hidden, job.ffn_hidden,
                                   job.n_heads, job.n_kv_heads, job.head_dim, job.vocab,
                                   job.mlp == "swiglu", convention == "model-causal")
    return None


def metric_of(case: Case, step_time_s: np.ndarray) -> np.ndarray:
    """The case's published metric from a predicted iteration time."""
    B, s, n = case.job.global_batch, case.job.seq_len, case.n_gpus
    return {"iter_time_s": step_time_s,
            "tokens_per_s_per_gpu": B * s / (step_time_s * n),
            "tokens_per_s_total": B * s / step_time_s,
            "samples_per_s": B / step_time_s,
            "tflops_per_gpu": case.flops / (step_time_s * n) / 1e12}[case.metric]
