"""``sweep validate``: predict measured training runs in each run's own metric convention.

Reads CSVs of measured runs through the data contract (sweep.analysis.measured: the columns, the
labels, both shipped layouts), turns every row into a job, a hardware variant (the GPU and the
row's interconnect) and the configuration it ran - or says why it cannot - and predicts the metric
the source published: iteration time, tokens/s, samples/s, or TFLOP/s by the source's own
FLOP formula. Fields a source leaves unstated (micro-batch size, virtual stages, recompute)
are filled with the best feasible choice under the model, i.e. the tuned configuration the
published run stands for; the report says which rows needed it.

All rows are evaluated in one vectorised call of the calibrated profile (the context arrays
hold one job and hardware per row), which is what makes calibration and leave-one-source-out
fast (sweep.analysis.calibration).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..engine.catalog import load_hardware
from ..errors import SweepError
from ..model.candidates import divisors, expert_ranks_per_domain
from ..model.cost.calibrated import MEMORY_PARAMETERS
from ..model.hardware import Hardware, apply_overrides
from ..model.job import Job
from ..model.schema import Recompute, empty_candidates
from .calibration import Evaluator, fill_generations, fit, predictions
from .measured import (
    DEFAULT_DATA,
    FLOPS,
    METRICS,
    REQUIRED_COLUMNS,
    SHARDING,
    SHIPPED,
    Case,
    Refusal,
    Run,
    canonical,
    flops_of,
    iteration_flops,
    memory_definition,
    metric_of,
    parse_run,
    precision_of,
    read_runs,
    sharding_of,
    suggest,
)

__all__ = ["DEFAULT_DATA", "SHIPPED", "Case", "read_runs", "express", "express_all",
           "flops_convention", "Evaluator", "REQUIRED_COLUMNS", "METRICS", "metric_of",
           "report", "render", "spearman", "catalog_parameters"]

#: interconnect column (regex) -> scale-out per GPU, when it differs from the catalog default
INTERCONNECT = [
    # IDRIS Jean Zay A100 nodes: 4 Omni-Path 100 Gb/s adapters per 8 GPUs
    (r"Omni-Path", {"scaleout_Gbps": 100, "nics_per_gpu": 0.5}),
    (r"^400 Gbps inter-node", {"scaleout_Gbps": 400, "nics_per_gpu": 0.125}),
    (r"^800 Gbps inter-node", {"scaleout_Gbps": 400, "nics_per_gpu": 0.25}),
    (r"1600 Gbps RoCE", {"scaleout_Gbps": 200, "nics_per_gpu": 1}),
]


@dataclass(frozen=True)
class Stack:
    """How a framework runs a model (the Job fields it sets), and its defaults."""

    attention_kernel: str
    fused_kernels: bool
    dp_overlap: bool
    grad_dtype: str
    default_sp: bool
    tp_overlap: bool
    buffers_GiB: float = 0.0
    fused_loss: bool = False
    cp_comm: int = 0  # context parallelism's K/V exchange: 0 ring, 1 all-gather
    #: from this date (YYYY-MM) on, the stack's compile option also compiles the loss, so the
    #: fp32 upcast of the logits is fused into the cross-entropy (a fused loss)
    compiled_loss_since: str = ""
    #: without a stated micro-batch count, the pipeline splits the local batch into as many
    #: micro-batches as there are pipeline stages, p x v (torchtitan's
    #: pipeline_parallel_microbatches default)
    microbatches_are_stages: bool = False
    #: virtual stages per GPU of an interleaved schedule that does not state them (0: unknown)
    interleaved_v: int = 0
    #: ZeRO-3 gathered-parameter and unsharded-gradient caps, in parameters (0: whole layers)
    zero3_live_params: float = 0.0
    grad_bucket_params: float = 0.0
    #: interleaved pipelines overlap their p2p with compute (Megatron-Core overlap_p2p_comm)
    pp_overlap: bool = False
    #: gradients accumulate across micro-batches outside the weight-gradient GEMMs (the
    #: DeepSpeed engine), not fused into them (Megatron gradient_accumulation_fusion)
    unfused_grad_accum: bool = False
    #: fp8 / MXFP8 weights held only in that format (Megatron fp8_param_gather)
    lp_params: bool = False
    #: linear-layer inputs saved for backward in the low-precision format (Transformer Engine
    #: does; torchao's Float8Linear saves the 16-bit input in eager mode: float8_linear.py
    #: matmul_with_hp_or_float8_args, pytorch/ao#1850)
    lp_saved_inputs: bool = True
    lp_norm_cast: bool = True  # Transformer Engine fuses the cast into the norm
    #: recompute policy of the stack's benchmark configs when a row does not state one
    default_recompute: str = ""


#: DeepSpeed ZeRO-1/2 default reduce and all-gather buckets: 2 x 5e8 16-bit elements
#: (DeepSpeed config docs: reduce_bucket_size, allgather_bucket_size)
DEEPSPEED_BUCKETS_GiB = 2 * 5e8 * 2 / 2**30


#: framework (sweep.analysis.measured.FRAMEWORKS) -> stack
STACKS = {
    "megatron-lm-2021": Stack("materialized", True, False, "fp32", False, False),
    "megatron-lm-2022": Stack("materialized", True, False, "fp32", False, False),
    "megatron-deepspeed": Stack("materialized", True, False, "fp32", False, False,
                                DEEPSPEED_BUCKETS_GiB, unfused_grad_accum=True),
    # DeepSpeed ZeRO-3 defaults: stage3_max_live_parameters 1e9, reduce_bucket_size 5e8
    # (DeepSpeed configuration docs)
    "deepspeed-zero3": Stack("materialized", True, True, "fp32", False, False,
                             zero3_live_params=1e9, grad_bucket_params=5e8),
    # NeMo's performance configs only fit with 16-bit gradient reduction (before Megatron-Core:
    # NeMo's framework string names it too); both overlap the interleaved pipeline's p2p
    # (NeMo configs: overlap_p2p_comm true, batch_p2p_comm false; Megatron-LM's default)
    # Transformer Engine's DotProductAttention runs cuDNN's fused attention (or FA3) on Hopper
    # and Blackwell (TE attention/dot_product_attention/utils.py get_attention_backend): the
    # "fused" class, not FlashAttention-2
    "nemo": Stack("fused", True, True, "bf16", True, True, pp_overlap=True),
    # NeMo's successor for Megatron models: its performance configs reduce gradients in 16 bits
    # too (Megatron-Bridge scripts/performance/utils/helpers.py set_basic_perf_overrides:
    # ddp.grad_reduce_in_fp32 = False)
    # its performance configs (scripts/performance, v0.2.0 - v0.3.1) set fp8_param_gather /
    # fp8_param for FP8 and MXFP8, and no recompute for the dense Llama models but for three
    # that state recompute_num_layers (configs/llama/*_workload_base_configs.py)
    "megatron-bridge": Stack("fused", True, True, "bf16", True, True, pp_overlap=True,
                             lp_params=True, default_recompute="none"),
    "megatron-core": Stack("fused", True, True, "fp32", True, True, pp_overlap=True),
    # llm-foundry's MPT defaults to flash-attn's fused cross-entropy (loss_fn default
    # 'fused_crossentropy', llm-foundry models/mpt/modeling_mpt.py)
    "composer": Stack("flash", False, True, "fp32", False, False, fused_loss=True),
    "fms-fsdp": Stack("flash", False, True, "bf16", False, False),
    # PyTorch context parallelism rotates K/V with all-gather by default (torchtitan
    # context_parallel_rotate_method = "allgather"); training.compile also compiles the loss
    # since April 2025 (pytorch/torchtitan PR #1033, build_loss_fn); pipelines default to
    # p x v micro-batches and, interleaved, v = 2 stages per rank (generate_split_points)
    "torchtitan": Stack("flash", False, True, "fp32", True, False, cp_comm=1,
                        compiled_loss_since="2025-04", microbatches_are_stages=True,
                        interleaved_v=2, lp_saved_inputs=False, lp_norm_cast=False),
}


def _num(row: Mapping[str, str], key: str) -> float | None:
    text = (row.get(key) or "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _int(row, key) -> int | None:
    v = _num(row, key)
    return int(v) if v is not None and np.isfinite(v) and v == int(v) else None


# ------------------------------------------------------------------------------ expressing rows

def _recompute(text: str, row, layers_per_stage: int) -> tuple[list[tuple[int, float]],
                                                                 str | None]:
    """Recompute options [(policy, layer fraction)] from the recompute column."""
    t = text.lower()
    # Megatron --recompute-method block: the first N layers of each stage, in full
    block = re.fullmatch(r"recompute[_-]num[_-]layers\s*=\s*(\d+)", t.strip())
    if block:
        return [(Recompute.FIRST_K, min(int(block.group(1)) / layers_per_stage, 1.0))], None
    if t.startswith("none"):
        return [(Recompute.NONE, 0.0)], None
    modules = re.fullmatch(r"recompute_modules\s*=\s*\[(.*)\]", t.strip())
    if modules:
        # Megatron-Core selective recompute of named modules (transformer_config.py
        # recompute_modules): the attention core is Megatron's selective recompute; the MoE
        # block (with the attention core) nearly the whole layer; the rest (norms, the MoE
        # activation, MLA's up-projections) are cheap elementwise / small GEMM recomputes
        names = set(re.findall(r"[a-z_]+", modules.group(1)))
        if "moe" in names or "mlp" in names:
            return [(Recompute.FULL, 0.0)], f"recompute of {sorted(names)} costed as full"
        if "core_attn" in names:
            return [(Recompute.SELECTIVE, 0.0)], None
        return [(Recompute.NONE, 0.0)], None  # the cheap modules: Job recompute_* fields
    if t.startswith("full"):
        return [(Recompute.FULL, 0.0)], None
    if "per-op sac" in t:
        return [(Recompute.OP_SAC, 0.0)], None
    if "block fraction" in t:
        mfu, hfu = _num(row, "mfu"), _num(row, "hfu")
        if mfu and hfu:
            # HFU / MFU = (3 + p) / 3 when a fraction p of the blocks is recomputed
            frac = min(max(3.0 * (hfu / mfu - 1.0), 0.0), 1.0)
            return [(Recompute.FIRST_K, frac)], \
                f"recomputed block fraction {frac:.2f} from HFU/MFU"
        return [(Recompute.FIRST_K, 0.5)], "recomputed block fraction 0.5 assumed"
    if t.startswith("selective"):
        return [(Recompute.SELECTIVE, 0.0)], None
    if not t:
        return [(Recompute.NONE, 0.0), (Recompute.SELECTIVE, 0.0), (Recompute.FULL, 0.0)], \
            "recompute unstated: best of none / selective / full"
    return [], f"recompute {text!r} not understood"


def _placement(order: Sequence[tuple[str, int]], node: int) -> dict[str, int]:
    """GPUs of each group inside one node, filling the node in rank order (TP first:
    Megatron's tp-cp-dp-pp order and torchtitan's device mesh)."""
    out, left = {}, node
    for name, degree in order:
        inside = int(np.gcd(degree, left))
        out["nv_" + name] = max(inside, 1)
        left //= max(inside, 1)
    return out


def _grad_dtype(row, stack: Stack) -> str:
    precision = row.get("precision", "")
    if "BF16Optimizer" in precision:
        return "mixed"  # bf16 gradients + fp32 accumulation buffer
    if "pre BF16-optimizer" in precision:
        return "bf16"  # DeepSpeed fp16 optimizer: 16-bit gradients
    if "DEFAULT" in precision:
        return "fp32"  # Composer FSDP DEFAULT mixed precision reduces in fp32
    return stack.grad_dtype


#: bytes moved per parameter and micro-batch to accumulate gradients outside the GEMMs:
#: autograd adds each micro-batch's 16-bit gradient into .grad (read 2 + 2, write 2);
#: DeepSpeed BF16Optimizer.update_hp_grads casts it to fp32 (read 2, write 4) and adds it
#: into the fp32 buffer (read 4 + 4, write 4) (deepspeed/runtime/bf16_optimizer.py)
UNFUSED_ACCUM_BYTES = {"bf16": 6.0, "mixed": 18.0}


def _refuse(kind: str, reason: str = "") -> Refusal:
    return Refusal(kind, reason or kind)


def _job(run: Run, stack: Stack, assumptions: list[str]) -> Job:
    """The Job a run trained: its model (dimensions from the columns or jobs/) as the
    framework runs it."""
    v, shape = run.values, run.shape
    if run.model is not None:
        m = run.model
        arch = {"mlp": m.mlp, "norm": m.norm, "position": m.position, "causal": m.causal,
                "dropout": m.dropout, "bias": m.bias, "tied_embeddings": m.tied_embeddings}
    else:
        notes = v["arch_notes"]
        if "squared-ReLU" in notes:
            assumptions.append("squared-ReLU MLP costed as a 2-matrix GELU MLP")
        megatron_2021 = v["source"] in ("Narayanan2021", "Korthikanti2022", "BLOOM-prequel")
        arch = {"mlp": "swiglu" if "SwiGLU" in notes else "gelu",
                "norm": "rmsnorm" if "RMSNorm" in notes else "layernorm",
                "position": "rope" if "RoPE" in notes or "LLaMA" in notes else "learned",
                "causal": True, "dropout": megatron_2021,
                "bias": "biases on" in notes or megatron_2021,
                "tied_embeddings": "untied" not in notes}
    compiled = v["compile"] == "yes"
    compiled_loss = compiled and bool(stack.compiled_loss_since) \
        and v["date"] >= stack.compiled_loss_since
    grad_dtype = _grad_dtype(v, stack)
    flags = v["other_flags"].lower()
    # Megatron-Core activation offloading: cpu_offloading_num_layers=N
    offload = re.search(r"cpu_offloading_num_layers\s*=\s*(\d+)", flags)
    moe = _moe_fields(run, shape, flags, stack, assumptions) if run.model is not None else {}
    modules = set(re.findall(r"[a-z_]+", v["recompute"])) if "recompute_modules" in \
        v["recompute"] else set()
    return Job(**moe,
        name=v["id"], n_layers=shape["n_layers"], hidden=shape["hidden"],
        ffn_hidden=shape["ffn_hidden"], n_heads=shape["n_heads"],
        n_kv_heads=shape["n_kv_heads"], head_dim=shape["head_dim"], vocab=shape["vocab"],
        seq_len=shape["seq_len"], global_batch=shape["global_batch_seqs"], **arch,
        dtype=run.dtype, attention_kernel=stack.attention_kernel,
        fused_kernels=stack.fused_kernels or compiled,
        dp_overlap=stack.dp_overlap,
        pp_overlap=stack.pp_overlap and "no overlap-p2p" not in flags,
        buffers_GiB=stack.buffers_GiB,
        zero3_live_params=stack.zero3_live_params, grad_bucket_params=stack.grad_bucket_params,
        fused_loss=stack.fused_loss or compiled_loss,
        lp_params=stack.lp_params, lp_saved_inputs=stack.lp_saved_inputs,
        lp_norm_cast=stack.lp_norm_cast,
        fp8_scaling="current" if run.precision in ("fp8-current", "fp8-tensorwise",
                                                    "fp8-rowwise") else "delayed",
        grad_dtype=grad_dtype, source=v["source_ref"],
        grad_accum_bytes=UNFUSED_ACCUM_BYTES.get(grad_dtype, 0.0) * stack.unfused_grad_accum,
        # Megatron-DeepSpeed's partition method type:transformer|embed(ding): the embedding
        # and the LM head take a pipeline slot each (the row's notes say so)
        embedding_slots=bool(re.search(r"type:transformer\|embed", v["notes"])),
        offload_act_layers=float(offload.group(1)) if offload else 0.0,
        recompute_norms="layernorm" in modules, recompute_moe_act="moe_act" in modules,
        recompute_mla_up="mla_up_proj" in modules and moe.get("attention") == "mla")


#: the Job fields of a named model's experts and attention that a row inherits
MODEL_FIELDS = ("n_experts", "top_k", "moe_ffn_hidden", "shared_ffn_hidden", "first_k_dense",
                "moe_layer_step", "router", "router_groups", "router_group_topk",
                "attention", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                "qk_rope_head_dim", "v_head_dim", "mtp_layers")


def _moe_fields(run: Run, shape, flags: str, stack: Stack, assumptions: list[str]) -> dict:
    """The named model's MoE / MLA / MTP fields as the row ran them: dense layers of a
    truncated model ("first layer dense"), multi-token prediction (Megatron-Bridge's
    DeepSeek-V3 recipes have one MTP layer and its FLOPs count it, unless the row says
    "w/o MTP"; other sources' rows none unless "w/ MTP"), token dropping with capacity
    factor 1 (SimuMax's --moe-expert-capacity-factor 1 with padding; Megatron-Bridge's
    "token-drop" rows), the flex dispatcher (DeepEP / HybridEP backends)."""
    m, v = run.model, run.values
    out = {k: getattr(m, k) for k in MODEL_FIELDS}
    if not m.is_moe and m.attention == "mha":
        return out
    text = " | ".join((v["notes"], flags))
    layers = shape["n_layers"]
    if layers < m.n_layers:
        first = re.search(r"first layer dense", text, re.I)
        out["first_k_dense"] = 1 if first else min(m.first_k_dense, layers - 1)
    out["moe_layer_step"] = min(out["moe_layer_step"], layers - out["first_k_dense"])
    with_mtp = re.search(r"w/ ?MTP", text, re.I)
    without = re.search(r"w/o ?MTP", text, re.I)
    keep = with_mtp or (run.framework == "megatron-bridge" and not without
                        and layers == m.n_layers)
    out["mtp_layers"] = m.mtp_layers if keep else 0
    if re.search(r"capacity-factor 1\b|token-drop(?!less)", text, re.I):
        out["capacity_factor"] = 1.0
        assumptions.append("token-drop MoE costed at capacity factor 1, padded")
    if re.search(r"flex_dispatcher_backend|deepep|hybridep|token_dispatcher_type\s*=\s*flex",
                 text, re.I):
        out["moe_dispatcher"] = "flex"
    return out


def _hardware(run: Run, n: int) -> tuple[Hardware, int]:
    """The catalog hardware with the row's interconnect, and the GPUs of one NVLink domain
    the run fills."""
    v = run.values
    hw = load_hardware(run.hardware)
    for pattern, overrides in INTERCONNECT:
        if re.search(pattern, v["interconnect"]):
            hw = apply_overrides(hw, overrides, "interconnect")
    domain = _int(v, "nvlink_domain")
    if domain:
        # a run fills NVLink domains in equal parts: 64 of an NVL72's 72 GPUs at 64 - 256 GPUs
        node = max(d for d in divisors(n).tolist() if d <= domain)
    else:
        node = _int(v, "gpus_per_node") or hw.nvlink_domain
    return dataclasses.replace(hw, nvlink_domain=node), node


def express(row: Mapping[str, str]) -> Case | Refusal:
    """A measured run as a Case, or why it cannot be expressed."""
    run = parse_run(row)
    if isinstance(run, Refusal):
        return run
    v, stack = run.values, STACKS[run.framework]
    assumptions = list(run.notes)
    n, B = run.shape["n_gpus"], run.shape["global_batch_seqs"]
    tp, pp, cp = (_int(v, k) or 1 for k in ("tp", "pp", "cp"))
    dp = _int(v, "dp") or n // max(tp * pp * cp, 1)
    if tp * pp * cp * dp != n:
        return _refuse("layout inconsistent", f"tp x pp x cp x dp = {tp * pp * cp * dp}, "
                                              f"not {n} GPUs")
    if B % dp:
        return _refuse("layout inconsistent", f"global batch {B} is not a multiple of dp = {dp}")
    job = _job(run, stack, assumptions)
    hw, node = _hardware(run, n)
    zero = sharding_of(v["zero_fsdp"], v["fsdp"], node)
    if zero is None:
        text = v["zero_fsdp"] or v["fsdp"]
        return _refuse("sharding not understood", f"sharding {text!r} not understood "
                       f"({suggest(text, list(SHARDING))}accepted: {', '.join(SHARDING)}, "
                       f"FSDP=N, dp_shard=N)")
    if not zero[2]:
        assumptions.append("distributed optimizer (ZeRO-1) assumed")
    layers_per_stage = int(np.ceil(job.n_layers / pp))
    recomputes, note = _recompute(v["recompute"] or stack.default_recompute, v,
                                  layers_per_stage)
    if not v["recompute"] and stack.default_recompute:
        assumptions.append(f"recompute unstated: {stack.default_recompute} (the stack's "
                           "benchmark configs)")
    if not recomputes:
        return _refuse("recompute not understood", note or "recompute not understood")
    if note:
        assumptions.append(note)
    flags = v["other_flags"]
    sp_text = v["sp"]
    sp = 1 if sp_text == "yes" or (not sp_text and stack.default_sp) else 0
    # torchtitan's async TP (the row's id or metric notes name it) measured 4 - 16 % over
    # plain TP in the same runs; the model's TE-userbuffers overlap (all but 15 % of each
    # collective hidden behind its GEMM) would credit 19 - 27 %: predicted as plain TP
    async_tp = re.search(r"async ?tp", v["id"] + " " + v["metric_notes"], re.I)
    tp_overlap = 1 if tp > 1 and stack.tp_overlap else 0
    if re.search(r"tp comm overlap disabled", flags, re.IGNORECASE):
        tp_overlap = 0
    if async_tp and tp > 1 and not tp_overlap:
        assumptions.append("async TP predicted as plain TP")
    cp_comm = stack.cp_comm if cp > 1 else 0
    if cp > 1 and re.search(r"cp comm a2a", flags, re.IGNORECASE):
        # Megatron cp_comm_type a2a (Ulysses all-to-all) is not modelled; all-gather is nearest
        cp_comm = 1
        assumptions.append("context-parallel all-to-all costed as an all-gather of K/V")
    fixed = {"dp": dp, "tp": tp, "cp": cp, "pp": pp, "zero": zero[0], "shard_group": zero[1],
             "sp": sp if tp > 1 else 0, "tp_overlap": tp_overlap, "cp_comm": cp_comm}
    if job.is_moe:
        experts = _experts(v, run, job, fixed, flags)
        if isinstance(experts, Refusal):
            return experts
        fixed.update(experts)
        if tp > 1:
            fixed["sp"] = 1  # Megatron-Core MoE needs sequence parallelism with TP
    options = _options(v, stack, job, fixed, recomputes, node, assumptions)
    if options is None:
        return _refuse("no configuration satisfies the stated batch sizes")
    oom = v["outcome"] == "OOM"
    mem = _num(v, "mem_per_gpu_GB")
    case = Case(row, job, hw, n, options, "", 0.0, mem_measured_bytes=mem * 2**30 if mem else None,
                mem_definition=memory_definition(row), oom=oom, assumptions=assumptions)
    if oom:
        return case  # compared on feasibility only
    return _metric(case, run)


def _experts(v: Mapping[str, str], run: Run, job: Job, fixed: Mapping[str, int],
             flags: str) -> dict[str, int] | Refusal:
    """ep, etp and a2a_overlap of an MoE row: the stated degrees (the expert tensor-parallel
    degree from its column or expert_tensor_parallel_size=N, else the stack's default:
    Megatron-Bridge's MoE recipes set 1, Megatron-Core defaults it to TP), checked against
    the model and the parallel folding."""
    ep = _int(v, "ep")
    if ep is None:
        return _refuse("expert parallel degree unstated",
                       "an MoE row needs its expert-parallel degree (column ep)")
    stated = re.search(r"expert_tensor_parallel_size\s*=\s*(\d+)", flags)
    etp = _int(v, "etp") or (int(stated.group(1)) if stated else
                             1 if run.framework == "megatron-bridge" else fixed["tp"])
    mesh = fixed["tp"] * fixed["cp"] * fixed["dp"]
    if job.n_experts % ep or mesh % (ep * etp) or job.moe_ffn_hidden % etp:
        return _refuse("layout inconsistent",
                       f"ep = {ep}, etp = {etp} do not fold into tp x cp x dp = {mesh} GPUs "
                       f"with {job.n_experts} experts of width {job.moe_ffn_hidden}")
    overlap = 1 if re.search(r"moe_a2a_overlap\s*=\s*true", flags, re.I) and ep > 1 else 0
    return {"ep": ep, "etp": etp, "a2a_overlap": overlap}


def _options(v: Mapping[str, str], stack: Stack, job: Job, fixed: dict[str, int],
             recomputes: list[tuple[int, float]], node: int,
             assumptions: list[str]) -> np.ndarray | None:
    """(k,) CANDIDATE_DTYPE: the stated configuration, or every choice it leaves open
    (virtual stages, micro-batch, recompute); None if no choice fits the batch sizes."""
    dp, tp, cp, pp = fixed["dp"], fixed["tp"], fixed["cp"], fixed["pp"]
    local = job.global_batch // dp
    layers_per_stage = int(np.ceil(job.n_layers / pp))
    vp_given = _int(v, "vp")
    interleaved = "interleaved" in v["pp_schedule"].lower()
    if vp_given:
        vp_options = [vp_given]
    elif pp > 1 and interleaved and stack.interleaved_v:
        vp_options = [stack.interleaved_v]
        assumptions.append(f"virtual stages unstated: {stack.interleaved_v} (the stack's "
                           "default)")
    elif pp > 1 and (interleaved or v["source"] in ("Narayanan2021",
                                                    "MegatronLM-README-H100")):
        # an interleaved schedule without its v (these two sources ran it, their .md)
        vp_options = [x for x in divisors(layers_per_stage).tolist()
                      if x <= 8 and (x > 1 or not interleaved)]
        assumptions.append("virtual stages unstated: best feasible")
    else:
        vp_options = [1]
    mbs_given = _int(v, "micro_batch")
    stage_rule = not mbs_given and pp > 1 and stack.microbatches_are_stages

    def mbs_options(vp: int) -> list[int]:
        if mbs_given:
            return [mbs_given]
        if stage_rule:
            return [local // (pp * vp)] if local % (pp * vp) == 0 else []
        return divisors(local).tolist()

    if stage_rule:
        assumptions.append("micro-batch unstated: local batch / (p x v) micro-batches "
                           "(the stack's default)")
    elif not mbs_given:
        assumptions.append("micro-batch unstated: best feasible")
    place = _placement([("tp", tp), ("cp", cp), ("dp", dp), ("pp", pp)], node)
    rows = []
    choices = [(mbs, vp, rf) for vp in vp_options for mbs in mbs_options(vp)
               for rf in recomputes]
    for mbs, vp, (rec, frac) in choices:
        if mbs > local or local % mbs:
            continue
        if vp > 1 and (local // mbs) % pp:  # interleaving needs m % p == 0 (Megatron)
            continue
        rows.append(dict(fixed, mbs=mbs, vpp=vp, recompute=rec,
                         recompute_layers=int(round(frac * layers_per_stage)), **place))
    if not rows:
        return None
    options = empty_candidates(len(rows))
    for i, r in enumerate(rows):
        for k, x in r.items():
            options[k][i] = x
    options["index"] = np.arange(len(rows))
    cols = {k: options[k].astype(np.int64) for k in ("nv_tp", "nv_cp", "nv_dp", "ep", "etp")}
    options["nv_ep"] = expert_ranks_per_domain(cols)
    return options


def _metric(case: Case, run: Run) -> Case | Refusal:
    """The case with the metric it is compared on (METRICS, the most direct first; else MFU
    by its formula), or why there is none."""
    v, job = run.values, case.job
    for metric in METRICS:
        value = _num(v, metric)
        if value is None or value <= 0:
            continue
        if metric == "tflops_per_gpu":
            flops = iteration_flops(run.flops, job, job.global_batch)
            if flops is None:
                continue
            case.flops = flops
        case.metric, case.measured = metric, value
        return case
    # MFU alone: model TFLOP/s per GPU = MFU x the peak the source divided by
    mfu, peak = _num(v, "mfu"), _num(v, "peak_tflops_used")
    if mfu and peak and run.flops in ("model", "model-causal"):
        case.flops = iteration_flops(run.flops, job, job.global_batch)
        case.metric, case.measured = "tflops_per_gpu", mfu * peak
        case.assumptions.append(f"MFU {mfu:g} x {peak:g} TFLOP/s peak compared as model "
                                "TFLOP/s per GPU")
        return case
    text = v["flops"].strip()
    if (_num(v, "tflops_per_gpu") or mfu) and text and run.flops is None:
        return _refuse("FLOP convention not recognised",
                       f"TFLOP/s or MFU given, but its FLOP count {text!r} is not recognised "
                       f"({suggest(text, list(FLOPS))}accepted: {', '.join(FLOPS)})")
    return _refuse("no time-based metric",
                   "no time-based metric with a known convention (iteration time, tokens/s, "
                   "samples/s, TFLOP/s or MFU with its formula)")


def flops_convention(row: Mapping[str, str]) -> str | None:
    """Which FLOPS convention a row's TFLOP/s or MFU uses (the ``flops`` or
    ``tflops_definition`` column), or None when not stated or not recognised."""
    v = canonical(row)
    return flops_of(v["flops"], v["framework"])


#: columns that identify a sibling run: the same model on the same GPUs, laid out alike
SIBLING_KEYS = ("n_layers", "hidden", "n_heads", "seq_len", "gpu", "n_gpus", "tp", "pp")


def express_all(rows: Sequence[Mapping[str, str]]) -> tuple[list[Case], list[dict]]:
    """Every row expressed (``express``), or listed with its reason. A row without a global
    batch borrows it from a sibling row of the same data (SIBLING_KEYS equal) that has
    one, and says so."""
    cases, unexpressed = [], []
    for r in rows:
        row = dict(r)
        sibling = None
        if not (row.get("global_batch_seqs") or "").strip():
            sibling = next((o for o in rows if (o.get("global_batch_seqs") or "").strip()
                            and all(o.get(k) == row.get(k) for k in SIBLING_KEYS)), None)
            if sibling is not None:
                row["global_batch_seqs"] = sibling["global_batch_seqs"]
        c = express(row)
        if isinstance(c, Refusal):
            unexpressed.append({"id": r.get("id", ""), "source": r.get("source", ""),
                                "reason": c.reason, "kind": c.kind,
                                "data_file": r.get("data_file", "")})
            continue
        if sibling is not None:
            c.row = r
            c.assumptions.append(f"global batch unstated: {sibling['global_batch_seqs']} "
                                 f"from {sibling.get('id', 'a sibling run')}")
        cases.append(c)
    return cases, unexpressed


# ------------------------------------------------------------------------------ the report

def _stats(errors) -> dict:
    a = np.abs(np.asarray(errors, dtype=np.float64))
    if a.size == 0:
        return {"n": 0, "median_abs": float("nan"), "p90_abs": float("nan"), "bias": float("nan")}
    return {"n": int(a.size), "median_abs": float(np.median(a)),
            "p90_abs": float(np.percentile(a, 90)), "bias": float(np.median(errors))}


def _ranks(a) -> np.ndarray:
    """Ranks 0..n-1, ties sharing their average rank."""
    a = np.asarray(a, dtype=np.float64)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a))
    ranks[order] = np.arange(len(a), dtype=np.float64)
    _, inverse, counts = np.unique(a, return_inverse=True, return_counts=True)
    return (np.bincount(inverse, weights=ranks) / counts)[inverse]


def spearman(a, b) -> float:
    """Spearman rank correlation (Pearson correlation of the tie-averaged ranks)."""
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = np.sqrt((ra ** 2).sum() * (rb ** 2).sum())
    return float((ra * rb).sum() / denom) if denom > 0 else float("nan")


#: columns that are measurements or provenance, not the configuration of a run
NOT_CONFIG = frozenset({
    "id", "source_ref", "table", "date", "tflops_per_gpu", "mfu", "hfu",
    "tokens_per_s_per_gpu", "tokens_per_s_total", "samples_per_s", "iter_time_s",
    "mem_per_gpu_GB", "outcome", "inferred_fields", "notes", "data_file", "release",
    "step_time_s"})


def replicates(cases: Sequence[Case]) -> list[dict]:
    """Groups of runs of one configuration measured more than once, and how far apart their
    measurements are: the noise floor under any model's error.

    One configuration: the same source and the same text in every column but the
    measurements and provenance (NOT_CONFIG), and, since the free-text notes are among
    those but ``express`` reads settings from them, the same job, options and assumptions.
    """
    groups: dict[tuple, list[Case]] = {}
    for c in cases:
        if c.oom:
            continue
        described = tuple(sorted((k, v) for k, v in c.row.items() if k not in NOT_CONFIG))
        key = (c.source, c.metric, described, repr(dataclasses.replace(c.job, name="")),
               c.options.tobytes(), tuple(c.assumptions))
        groups.setdefault(key, []).append(c)
    out = []
    for members in groups.values():
        if len(members) < 2:
            continue
        entry = {"ids": [c.row["id"] for c in members], "source": members[0].source,
                 "metric": members[0].metric, "spread": None, "mem_spread": None}
        values = [c.measured for c in members if c.metric]
        if len(values) > 1:
            entry["spread"] = max(values) / min(values) - 1.0
        mems = [c.mem_measured_bytes for c in members if c.mem_measured_bytes]
        if len(mems) > 1:
            entry["mem_spread"] = max(mems) / min(mems) - 1.0
        out.append(entry)
    return out


def report(rows: Sequence[Mapping[str, str]], params: Mapping[str, Mapping[str, float]],
           loso: bool = True, workers: int = 1) -> dict:
    """Predict every row with ``params`` ({generation | memory: {name: value}}) and summarise.

    With ``loso``, also re-calibrate without each source and predict it, one source per
    process on up to ``workers`` processes (``sweep validate`` uses every available core;
    more than one worker needs the ``if __name__ == "__main__":`` guard in a calling script).
    """
    cases, unexpressed = express_all(rows)
    if not cases:
        why = "; ".join(f"{u['id'] or '(no id)'}: {u['reason']}" for u in unexpressed[:3])
        more = f" (and {len(unexpressed) - 3} more)" if len(unexpressed) > 3 else ""
        raise SweepError(f"no row of the data can be expressed: {why}{more}")
    ev = Evaluator(cases)
    ev.set_parameters(params)
    pred, out = predictions(ev)
    per_row, errors, by_source, by_kind, mem_err = [], [], {}, {}, []
    by_category: dict[str, dict[str, list[float]]] = {k: {} for k in CATEGORIES}
    oom_rows, false_oom = [], []
    for i, c in enumerate(cases):
        mem_pred = float(out["mem_bytes"][i])
        reported = float(out["mem_reported_bytes"][i])
        entry = {"id": c.row["id"], "source": c.source, "group": c.group,
                 "gpu": c.row["gpu"], "hardware": c.hw.name,
                 "precision": precision_of(c.row.get("precision") or ""),
                 "kind": CATEGORIES["model_kind"](c),
                 "metric": c.metric, "measured": c.measured,
                 "predicted": float(pred[i]) if c.metric else None,
                 "error": float(pred[i] / c.measured - 1.0) if c.metric else None,
                 "feasible": bool(out["feasible"][i]), "outcome": "OOM" if c.oom else "ok",
                 "mem_required_GiB": mem_pred / 2**30, "mem_reported_GiB": reported / 2**30,
                 "mem_measured_GiB": c.mem_measured_bytes / 2**30 if c.mem_measured_bytes
                 else None, "capacity_GiB": c.hw.hbm_capacity_bytes / 2**30,
                 "assumptions": c.assumptions}
        if c.mem_measured_bytes:
            entry["mem_error"] = reported / c.mem_measured_bytes - 1.0
            mem_err.append(entry["mem_error"])
        if c.metric:
            errors.append(entry["error"])
            by_source.setdefault(c.source, []).append(entry["error"])
            by_kind.setdefault(f"{c.hw.name} {entry['precision']}", []).append(entry["error"])
            for kind, of in CATEGORIES.items():
                by_category[kind].setdefault(of(c), []).append(entry["error"])
        if c.oom:
            oom_rows.append(entry)
        elif not out["feasible"][i]:
            false_oom.append(entry)
        per_row.append(entry)
    # ranking within each sweep (source / table): measured vs predicted throughput
    batch = {c.row["id"]: c.job.global_batch for c in cases}

    def throughput(entry, value):
        return batch[entry["id"]] / value if entry["metric"] == "iter_time_s" else value

    groups: dict[str, list[dict]] = {}
    for e in per_row:
        if e["metric"]:
            groups.setdefault(e["group"], []).append(e)
    ranking = {}
    for g, members in sorted(groups.items()):
        if len(members) < 3:
            continue
        meas = [throughput(m, m["measured"]) for m in members]
        predt = [throughput(m, m["predicted"]) for m in members]
        ranking[g] = {"n": len(members), "rho": spearman(meas, predt)}
    result = {
        "replicates": replicates(cases),
        "parameters": {k: dict(v) for k, v in params.items()},
        "rows": per_row, "unexpressed": unexpressed,
        "expressed_fraction": len(cases) / len(rows),
        "files": _files(rows, unexpressed),
        "refused": dict(Counter(u["kind"] for u in unexpressed).most_common()),
        "overall": _stats(errors),
        "per_source": {s: _stats(v) for s, v in sorted(by_source.items())},
        "per_hardware_precision": {k: _stats(v) for k, v in sorted(by_kind.items())},
        **{f"per_{kind}": {k: _stats(v) for k, v in sorted(groups_.items())}
           for kind, groups_ in by_category.items()},
        "memory": {**_stats(mem_err), "within_15pct": float(np.mean(np.abs(mem_err) < 0.15))
                   if mem_err else float("nan")},
        "oom": {"n": len(oom_rows), "predicted_infeasible": sum(not e["feasible"]
                                                               for e in oom_rows),
                "missed": [e["id"] for e in oom_rows if e["feasible"]]},
        "ran_but_predicted_over_capacity": [
            {"id": e["id"], "over_pct": 100 * (e["mem_required_GiB"] / e["capacity_GiB"] - 1)}
            for e in false_oom],
        "spearman": ranking,
    }
    if loso:
        sources = sorted({c.source for c in cases if c.metric})
        held_out = _held_out_all(sources, cases, workers)
        per = {s: _stats(errs) for s, errs in zip(sources, held_out)}
        loso_err = [e for errs in held_out for e in errs]
        result["loso"] = {"overall": _stats(loso_err), "per_source": per}
        # the held-out errors by category (each row predicted without its own source)
        for kind, of in CATEGORIES.items():
            grouped: dict[str, list[float]] = {}
            for source, errs in zip(sources, held_out):
                test = [c for c in cases if c.source == source and c.metric]
                for c, e in zip(test, errs):
                    grouped.setdefault(of(c), []).append(e)
            result["loso"][f"per_{kind}"] = {k: _stats(v) for k, v in sorted(grouped.items())}
    return result


#: the categories accuracy is stated in besides the source: GPU generation, GEMM precision,
#: dense or mixture-of-experts model
CATEGORIES = {
    "generation": lambda c: c.hw.generation + (" MoE" if c.job.is_moe else ""),
    "precision": lambda c: c.job.dtype + (" MoE" if c.job.is_moe else ""),
    "model_kind": lambda c: "MoE" if c.job.is_moe else "dense",
}


def _files(rows: Sequence[Mapping[str, str]], unexpressed: Sequence[dict]) -> dict:
    """{data file: {"rows": n, "expressed": n}} in the order the rows came."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        f = out.setdefault(r.get("data_file", ""), {"rows": 0, "expressed": 0})
        f["rows"] += 1
        f["expressed"] += 1
    for u in unexpressed:
        out[u.get("data_file", "")]["expressed"] -= 1
    return out


def _held_out_errors(source: str, cases: Sequence[Case]) -> list[float]:
    """Leave ``source`` out: calibrate on the other sources (from the prior centres), then
    predict that source's timed rows; their relative errors."""
    train = [c for c in cases if c.source != source]
    test = [c for c in cases if c.source == source and c.metric]
    fitted = fit(train, tol=1e-2).parameters
    # a generation with no other source borrows its neighbour's fit (never the parameters
    # fitted with this source)
    fitted, _ = fill_generations(fitted, sorted({c.hw.generation for c in test}))
    ev = Evaluator(test)
    ev.set_parameters(fitted)
    pred, _ = predictions(ev)
    return [float(pred[i] / c.measured - 1.0) for i, c in enumerate(test)]


def available_cpus() -> int:
    """Cores this process may run on (its affinity mask: what Slurm or taskset granted)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _held_out_all(sources: Sequence[str], cases: Sequence[Case], workers: int) -> list:
    """``_held_out_errors`` of every source, on up to ``workers`` processes. The re-fits are
    independent and deterministic, so the result does not depend on the number of workers."""
    workers = min(workers, len(sources))
    if workers <= 1:
        return [_held_out_errors(s, cases) for s in sources]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from functools import partial

    # spawn: a fresh interpreter per worker, safe whatever threads this process holds
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(partial(_held_out_errors, cases=cases), sources))


# ------------------------------------------------------------------------------ text

def _pct(x) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{100 * x:+.1f}%"


def _apct(x) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{100 * x:.1f}%"


def render(rep: Mapping, rows: bool = True) -> str:
    """The report as text: per-row table, per-source table, summary, memory and OOM checks,
    replicates, rows not expressed, rankings within sweeps."""
    from . import fmt

    out = []
    if rows:
        table = []
        for e in rep["rows"]:
            mem = "-" if e["mem_measured_GiB"] is None else (
                f"{e['mem_measured_GiB']:.1f}/{e['mem_reported_GiB']:.1f}")
            measured = "OOM" if e["outcome"] == "OOM" else (
                f"{e['measured']:.4g}" if e["metric"] else "-")
            table.append([e["id"], e["source"], e["metric"] or "-", measured,
                          "-" if e["predicted"] is None else f"{e['predicted']:.4g}",
                          _pct(e["error"]), mem,
                          "fits" if e["feasible"] else "OOM",
                          f"{len(e['assumptions'])}" if e["assumptions"] else ""])
        out.append(fmt.table(["run", "source", "metric", "measured", "predicted", "error",
                              "mem GiB meas/pred", "model", "assumed"], table))
        out.append("")
    loso = rep.get("loso", {}).get("per_source", {})
    src_rows = [[s, v["n"], _apct(v["median_abs"]), _apct(v["p90_abs"]), _pct(v["bias"]),
                 _apct(loso[s]["median_abs"]) if s in loso else "-"]
                for s, v in rep["per_source"].items()]
    o = rep["overall"]
    src_rows.append(["all", o["n"], _apct(o["median_abs"]), _apct(o["p90_abs"]),
                     _pct(o["bias"]), _apct(rep["loso"]["overall"]["median_abs"])
                     if "loso" in rep else "-"])
    out.append(fmt.table(["source", "rows", "median |err|", "p90 |err|", "median err",
                          "LOSO median |err|"], src_rows))
    out.append("")
    m = rep["memory"]
    out.append(f"expressed: {rep['expressed_fraction'] * 100:.1f}% of rows "
               f"({len(rep['rows'])} of {len(rep['rows']) + len(rep['unexpressed'])})")
    files = rep.get("files", {})
    if len(files) > 1:
        for name, f in files.items():
            out.append(f"  {name}: {f['expressed']} of {f['rows']} rows expressed")
    out.append(f"time:      median |error| {_apct(o['median_abs'])}, 90th percentile "
               f"{_apct(o['p90_abs'])} over {o['n']} rows")
    if "loso" in rep:
        lo = rep["loso"]["overall"]
        out.append(f"leave-one-source-out: median |error| {_apct(lo['median_abs'])}, "
                   f"90th percentile {_apct(lo['p90_abs'])}")
    if m["n"]:
        out.append(f"memory:    median |error| {_apct(m['median_abs'])}, 90th percentile "
                   f"{_apct(m['p90_abs'])}, {m['within_15pct'] * 100:.0f}% of {m['n']} rows "
                   f"within 15% (measured vs predicted peak, reserved or allocated as "
                   f"each source reports it)")
    oom = rep["oom"]
    if oom["n"]:
        missed = f"; missed: {', '.join(oom['missed'])}" if oom["missed"] else ""
        out.append(f"OOM rows:  {oom['predicted_infeasible']} of {oom['n']} predicted "
                   f"infeasible{missed}")
    over = rep["ran_but_predicted_over_capacity"]
    if over:
        out.append("ran, but predicted over capacity: " + ", ".join(
            f"{e['id']} (+{e['over_pct']:.1f}%)" for e in over))
    reps = rep.get("replicates", [])
    if reps:
        spreads = [r["spread"] for r in reps if r["spread"] is not None]
        mems = [r["mem_spread"] for r in reps if r["mem_spread"] is not None]
        line = f"replicates: {len(reps)} configurations measured more than once"
        if spreads:
            line += f"; the metric differs by up to {_apct(max(spreads))}"
        if mems:
            line += f", memory by up to {_apct(max(mems))}"
        out.append(line)
        for r in reps:
            out.append(f"  {', '.join(r['ids'])}: "
                       + ", ".join(f"{what} {_apct(r[key])}" for what, key in
                                   (("metric", "spread"), ("memory", "mem_spread"))
                                   if r[key] is not None))
    if rep["unexpressed"]:
        out.append("")
        out.append(fmt.table(["row not expressed", "source", "reason"],
                             [[e["id"], e["source"], e["reason"]] for e in rep["unexpressed"]],
                             "lll"))
        out.append("")
        out.append(fmt.table(["rows not expressed, by reason", "rows"],
                             [[k, n] for k, n in rep["refused"].items()]))
    if rep["spearman"]:
        out.append("")
        out.append(fmt.table(["sweep (source / table)", "configs", "Spearman rho"],
                             [[g, v["n"], f"{v['rho']:.2f}"]
                              for g, v in rep["spearman"].items()]))
    return "\n".join(out)


def markdown(rep: Mapping, files: Sequence[str]) -> str:
    """docs/validation.md: the accuracy of the calibrated profile per source, GPU
    generation, precision and model kind, in sample and leave-one-source-out; memory; the
    parameters against their cited physical ranges. Generated: ``sweep validate
    --markdown``."""
    from .calibration import GENERATIONS, load_ranges, outside_ranges

    def pct(x) -> str:
        return "–" if x is None or not np.isfinite(x) else f"{100 * x:.1f} %"

    loso = rep.get("loso", {})
    out = ["# Accuracy of the calibrated profile", "",
           "<!-- generated by `sweep validate --markdown` (the data: "
           + " + ".join(files) + "); do not edit by hand -->", "",
           f"Every row of {' and '.join(f'`sweep/data/{f}`' for f in files)} that the model "
           "can express is predicted in its own metric convention (iteration time, tokens/s, "
           "samples/s, TFLOP/s or MFU by the source's formula). *In sample*: with the shipped "
           "parameters (`hardware/calibration.yaml`, fitted on these rows). *Leave one source "
           "out* (LOSO): each source predicted by parameters re-fitted without it, from the "
           "same prior centres; this is the figure to expect on runs from a new source.", ""]
    ov, lo = rep["overall"], loso.get("overall", {})
    out += [f"**All {ov['n']} timed rows:** median |error| {pct(ov['median_abs'])}, 90th "
            f"percentile {pct(ov['p90_abs'])} in sample; leave one source out "
            f"{pct(lo.get('median_abs'))}, 90th percentile {pct(lo.get('p90_abs'))}. "
            f"Expressed: {sum(f['expressed'] for f in rep['files'].values())} of "
            f"{sum(f['rows'] for f in rep['files'].values())} rows"
            + (" (" + "; ".join(f"{k}: {n}" for k, n in rep["refused"].items())
               + " refused)" if rep["refused"] else "") + ".", ""]
    titles = {"source": "source", "generation": "GPU generation", "precision": "precision",
              "model_kind": "model"}
    for kind, title in titles.items():
        stats = rep[f"per_{kind}"]
        held = loso.get(f"per_{kind}", {})
        out += [f"## By {title}", "",
                f"| {title} | rows | median \\|error\\| | 90th pct | median error | "
                "LOSO median \\|error\\| | LOSO 90th pct |", "|---|---|---|---|---|---|---|"]
        for name, st in stats.items():
            h = held.get(name, {})
            out.append(f"| {name} | {st['n']} | {pct(st['median_abs'])} | "
                       f"{pct(st['p90_abs'])} | {_pct(st['bias']).replace('%', ' %')} | "
                       f"{pct(h.get('median_abs'))} | {pct(h.get('p90_abs'))} |")
        out.append(f"| **all** | {ov['n']} | {pct(ov['median_abs'])} | {pct(ov['p90_abs'])} "
                   f"| {_pct(ov['bias']).replace('%', ' %')} | {pct(lo.get('median_abs'))} | "
                   f"{pct(lo.get('p90_abs'))} |")
        out.append("")
    mem, oom = rep["memory"], rep["oom"]
    out += ["## Memory", "",
            f"{mem['n']} rows publish a measured peak (reserved or allocated, as each source "
            f"counts it): median error {pct(mem['median_abs'])}, 90th percentile "
            f"{pct(mem['p90_abs'])}, {100 * mem['within_15pct']:.0f} % within 15 %. "
            f"Out-of-memory rows: {oom['predicted_infeasible']} of {oom['n']} predicted "
            "infeasible. Rows that ran but are predicted over capacity (the margin): "
            + (", ".join(f"`{e['id']}` (+{e['over_pct']:.1f} %)"
                         for e in rep["ran_but_predicted_over_capacity"]) or "none") + ".", ""]
    params = {k: v for k, v in rep["parameters"].items() if k != "memory"}
    ranges = load_ranges()
    outside = outside_ranges(params, ranges)
    gens = [g for g in GENERATIONS if g in ranges and g in params]
    names = list(dict.fromkeys(n for g in gens for n in params[g]))
    out += ["## Parameters and their physical ranges", "",
            "Each value with its cited range (`hardware/parameter_ranges.yaml`, sources "
            "below). **Bold**: outside its range: the fit absorbs a mechanism the model "
            "lacks (docs/model.md).", "",
            "| parameter | " + " | ".join(gens) + " |", "|---" * (len(gens) + 1) + "|"]
    for name in names:
        cells = []
        for g in gens:
            value = params[g].get(name)
            entry = ranges[g].get(name)
            if value is None:
                cells.append("–")
                continue
            text = f"{value:.3g}"
            if name in outside.get(g, ()):
                text = f"**{text}**"
            cells.append(text + (f" ({entry[0]:g} – {entry[1]:g})" if entry else ""))
        out.append(f"| `{name}` | " + " | ".join(cells) + " |")
    out += ["", "Sources of the ranges:", ""]
    for g in gens:
        for name, (_, _, source) in ranges[g].items():
            out.append(f"* {g} `{name}`: {source}")
    return "\n".join(out) + "\n"


def catalog_parameters(cases) -> dict:
    """The parameters the hardware catalog holds for the generations of ``cases``."""
    params: dict[str, dict[str, float]] = {}
    for c in cases:
        cal = dict(c.hw.calibration)
        params.setdefault(c.hw.generation, {k: v for k, v in cal.items()
                                            if k not in MEMORY_PARAMETERS})
        params.setdefault("memory", {k: v for k, v in cal.items() if k in MEMORY_PARAMETERS})
    return params
