"""A measured run as a model case: the job, the hardware and the configuration it ran.

Reads rows through the measured-data contract (sweep.analysis.measured: the columns, the
labels, both shipped layouts) and turns every row into a job, a hardware variant (the GPU
and the row's interconnect) and the configuration it ran - or a refusal saying why it
cannot - with the metric the source published: iteration time, tokens/s, samples/s, or
TFLOP/s by the source's own FLOP formula. Fields a source leaves unstated (micro-batch size,
virtual stages, recompute) are filled with the best feasible choice under the model, i.e.
the tuned configuration the published run stands for; the case says which rows needed it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..engine.catalog import load_hardware
from ..model.candidates import divisors, expert_ranks_per_domain, stage_layers
from ..model.hardware import Hardware, apply_overrides
from ..model.job import OFFLOAD_MODULES, Job
from ..model.schema import Recompute, empty_candidates
from .measured import (
    FLOPS,
    METRICS,
    SHARDING,
    Case,
    Refusal,
    Run,
    canonical,
    flops_of,
    iteration_flops,
    memory_definition,
    parse_run,
    sharding_of,
    suggest,
)

__all__ = ["express", "express_all", "flops_convention", "Stack", "STACKS"]

#: interconnect column (regex) -> scale-out per GPU, when it differs from the catalog default
INTERCONNECT = [
    # IDRIS Jean Zay A100 nodes: 4 Omni-Path 100 Gb/s adapters per 8 GPUs
    (r"Omni-Path", {"scaleout_Gbps": 100, "nics_per_gpu": 0.5}),
    (r"^400 Gbps inter-node", {"scaleout_Gbps": 400, "nics_per_gpu": 0.125}),
    (r"^800 Gbps inter-node", {"scaleout_Gbps": 400, "nics_per_gpu": 0.25}),
    (r"1600 Gbps RoCE", {"scaleout_Gbps": 200, "nics_per_gpu": 1}),
]

#: source (regex) -> hardware as that source measured the machine its rows ran on, where it
#: publishes a microbenchmark of it. SimuMax's 8x B200 node: its best bf16 GEMM over the 514
#: training shapes of its runs (Llama 3 70B / 405B, DeepSeek-V2 / V3; Transformer Engine
#: 2.11 general_gemm, CUDA 13.1) reaches 0.655 of the 2,250 TFLOP/s peak (median 0.485, p10
#: 0.416, p90 0.602; the LM head's shapes 0.45 - 0.51), against 0.776 for the catalog's B200
#: (ml-engineering's MAMF table) (MooreThreads/SimuMax @4dcaae5
#: configs/system/b200_bf16_ceperm.json, matmul accurate_efficient_factor)
MEASURED_MACHINE = [
    (r"^SimuMax B200", {"matrix_sustained_fraction": 0.655},
     "GEMMs at the best rate the source measured on its node (0.655 of peak)"),
]


#: source (regex) -> Stack fields its launcher sets against its framework's defaults.
#: SimuMax's B200 runs: its Megatron-LM launchers (run_pretrain_llama3.sh,
#: run_pretrain_deepseekv2.sh, with the EXTRA_ARGS of tools/b200/run_megatron_perf_real_*.py,
#: MooreThreads/SimuMax @4dcaae5) pass neither --overlap-grad-reduce nor
#: --overlap-param-gather, both off by default (Megatron-LM megatron/training/arguments.py),
#: so the gradient reduce-scatter and the parameter all-gather run exposed after the backward
MEASURED_LAUNCH = [
    (r"^SimuMax B200", {"dp_overlap": False},
     ("data-parallel reduce and gather not overlapped (the source's launcher leaves "
      "--overlap-grad-reduce / --overlap-param-gather off)")),
]


#: the pipeline split of dgxc's DeepSeek-V3 script (below): first and last stages of
#: 64 / pp - 1 and 64 / pp - 2 layers, the middle ones 64 / pp
UNEVEN_64 = "first / last pipeline stages of 64/pp - 1, 64/pp - 2 layers"

#: Transformer Engine before v2.5 refuses cuDNN fused attention on Blackwell for head
#: dimensions above 128 (transformer_engine/common/fused_attn/fused_attn.cpp, "special
#: conditions for blackwell": !(sm_arch_ >= 100 && (head_dim_qk > 128 || head_dim_v >
#: 128)), v2.1 - v2.4; lifted by TE 71c76b6, #1797, first in v2.5, with cuDNN >= 9.11 for
#: the backward), and FlashAttention refuses q/k and v head sizes that differ
#: (pytorch/dot_product_attention/utils.py get_attention_backend, "does not support MLA"):
#: MLA's 192 / 128 heads run TE's UnfusedDotProductAttention, the full score matrix
UNFUSED_MLA = "MLA attention unfused (TE < 2.5 on Blackwell)"

#: Megatron-Bridge's NeMo 25.09 table: its DeepSeek-V3 rows (mb_290's 1,297 tokens/s among
#: them) match tag v0.1.0rc4 (docs/performance-summary.md L76; its Qwen3 rows match the later
#: main-branch YAML, fa0315ae2, and are not read here), whose scripts/performance/
#: run_script.py DeepSeek-V3 branch (L56 - 102) runs on H100 DeepEP, the all-to-all overlap
#: (overlap_moe_expert_parallel_comm with delay_wgrad_compute), recompute_modules
#: ['mla_up_proj', 'mlp'] and overlap_grad_reduce False (the parameter all-gather stays
#: overlapped there; the model's one data-parallel switch exposes both: ~0.4 points), and
#: on B200 / GB200 token drop without DeepEP or the overlap and ['mla_up_proj']; the recipe
#: (recipes/deepseek/deepseek_v3.py L315 - 316) leaves TP overlap off; the perf_matrix YAML
#: (configs/deepseek/deepseek_v3_llm_pretrain.yaml) sets the layouts, selective recompute
#: granularity and 16-bit gradient reduction (H100's layout "Et|(tt|)*30mL" is costed as
#: the even split). dgxc-benchmarking's DeepSeek-V3 (v25.05.04) pins NeMo 7a8f1cc
#: (setup.sh NEMO_COMMIT), whose scripts/performance/llm/pretrain_deepseek_v3.py runs token
#: drop (USE_TOKEN_DROP, MegatronTokenDropCallback), selective recompute of the modules
#: dgxc's launch.sh names (L106 H100 'mla_up_proj', L119 GB200 'core_attn'), tp_comm_overlap
#: False and first / last stages of 64 / pp - 1 and 64 / pp - 2 layers (L73 - 77: UNEVEN_64);
#: its recipe one MTP layer (recipes/deepseek_v3.py use_mtp=True) and, in bf16,
#: gradients reduced in fp32 (recipes/deepseek.py; scripts/performance/utils.py turns it off
#: for fp8). dgxc-benchmarking's Nemotron-H 56B (v25.05.04 nemotronh/launch.sh L70 - 121, the
#: same NeMo) runs scripts/performance/llm/pretrain_nemotronh_56b.py, whose recipe has no
#: comm-overlap callback (L150 - 152) and no recompute, in fp8 with NeMo's default "ds" recipe
#: (scripts/performance/utils.py L426 - 437: bf16_with_fp8_mixed, whose
#: recipes/precision/mixed_precision.py L56 - 71 sets fp8_param_gather). Megatron-Bridge's
#: FP8-CS Llama runs on GB200 / GB300 with Megatron FSDP offload
#: activations to the Grace host (cpu_offloading_num_layers), which the table leaves out and
#: the rows' batch size kept the matcher from finding (the layout is the config's; the batch
#: only sets the micro-batch count): 25.09 (v0.1.0rc4 scripts/performance/configs/llama3/
#: llama3_70b_llm_pretrain.yaml, gb200 num_gpus_64 fp8_cs: mbs 2, tp 1, pp 1, FSDP, 40
#: layers; llama31/llama31_405b_llm_pretrain.yaml, gb200 num_gpus_128 fp8_cs: tp 2, pp 1,
#: FSDP, 95 layers) and 25.11 (v0.2.0 configs/llama3/workload_base_configs.py
#: LLAMA3_70B_GB200_FP8_CS_BASE_CONFIG: 40 layers, LLAMA3_70B_GB300_FP8_CS_BASE_CONFIG: 20).
#: Megatron-Bridge's Nemotron 3 Super NVFP4 runs (from v0.4.1 scripts/performance/configs/
#: nemotronh/nemotron_3_llm_pretrain.py L48 - 51 to v0.6.0 perf_recipes/nemotronh/common.py
#: L65 - 70, training/mixed_precision.py nemotron_3_super_bf16_with_nvfp4_mixed) keep the last
#: 14 layers in bf16 and load te_quant.cfg: attention QKV / output and the latent
#: projections in bf16, the Mamba-2 out_proj in MXFP8, whatever the recompute
#: (selective moe_act and layernorm on B300: v0.6.0 perf_recipes/nemotronh/b300/
#: nemotronh.py L188 - 189)
SUPER_NVFP4 = ("first_last_layers_bf16=True; num_layers_at_end_in_bf16=14; "
               "quant_recipe=te_quant.cfg; mamba_out_proj=mxfp8")
#: (source, model, precision) patterns -> flags of a recipe's precision, added to the row's
#: other_flags whatever else it states
RECIPE_PRECISION = [
    (r"^Megatron-Bridge perf summary$", r"(?i)^nemotron[-_ ]?3[-_ ]?super", r"(?i)nvfp4",
     SUPER_NVFP4),
]
#: (source, release, model, GPU, precision) patterns -> the flags added to the row's
#: other_flags (its table labels) and the recompute, for a row that states no recompute
RELEASE_RUNS = [
    (r"^Megatron-Bridge perf summary$", r"NeMo 25\.09 ", r"^DeepSeek-V3$", r"^H100$", r".",
     ("moe_flex_dispatcher_backend=deepep; moe_a2a_overlap=True; overlap_grad_reduce=False; "
      "TP comm overlap disabled"), "recompute_modules=['mla_up_proj', 'mlp']"),
    (r"^Megatron-Bridge perf summary$", r"NeMo 25\.09 ", r"^DeepSeek-V3$", r"^G?B200$", r".",
     "TP comm overlap disabled", "recompute_modules=['mla_up_proj']"),
    (r"^NVIDIA dgxc-benchmarking", r"\(NeMo 25\.04\)", r"^DeepSeek-V3$", r"^H100$", r"^BF16$",
     "token-drop; w/ MTP; TP comm overlap disabled; grad_reduce_in_fp32=True; "
     + UNEVEN_64, "recompute_modules=['mla_up_proj']"),
    (r"^NVIDIA dgxc-benchmarking", r"\(NeMo 25\.04\)", r"^DeepSeek-V3$", r"^GB200$", r"^BF16$",
     "token-drop; w/ MTP; TP comm overlap disabled; grad_reduce_in_fp32=True; " + UNEVEN_64
     + "; " + UNFUSED_MLA, "selective"),
    (r"^NVIDIA dgxc-benchmarking", r"\(NeMo 25\.04\)", r"^Nemotron-H-56B$", r"^H100$", r"^FP8$",
     "TP comm overlap disabled; fp8_param_gather=True", "none"),
    (r"^Megatron-Bridge perf summary$", r"NeMo 25\.(09|11) ", r"^Llama3-70B$", r"^GB200$",
     r"^FP8-CS", "use_megatron_fsdp=True; cpu_offloading_num_layers=40", "none"),
    (r"^Megatron-Bridge perf summary$", r"NeMo 25\.11 ", r"^Llama3-70B$", r"^GB300$",
     r"^FP8-CS", "use_megatron_fsdp=True; cpu_offloading_num_layers=20", "none"),
    (r"^Megatron-Bridge perf summary$", r"NeMo 25\.09 ", r"^Llama3\.1-405B$", r"^GB200$",
     r"^FP8-CS", "use_megatron_fsdp=True; cpu_offloading_num_layers=95", "none"),
]

#: Megatron-Bridge perf configs (cfg=NAME@TAG in other_flags) that name a flex dispatcher
#: backend their perf script did not apply at that tag, so the token dispatcher stayed
#: alltoall: Qwen3-235B on B300, B200 and H100 (scripts/performance/configs/qwen/
#: qwen3_llm_pretrain.py sets moe_token_dispatcher_type = "alltoall" after the backend:
#: v0.3.1 L132 - 133, L158 - 159, L184 - 185, and r0.3.0 alike) and GPT-OSS-120B at r0.3.0
#: (gpt_oss_llm_pretrain.py never applies it; recipes/gpt_oss/gpt_oss.py L184 sets alltoall;
#: the perf scripts apply it only from commit e1088f624, April 2026)
UNAPPLIED_FLEX = (r"cfg=qwen3_235b_a22b_pretrain_config_(b300|b200|h100)_\S*@(v0\.3\.1|r0\.3\.0)",
                  r"cfg=gpt_oss_120b_pretrain_config_\S*@r0\.3\.0")


#: Megatron-Bridge perf configs that turn TP communication overlap off: Qwen3-235B on H100
#: (CommOverlapConfig(tp_comm_overlap=False): v0.3.1 and v0.3.0 configs/qwen/
#: qwen3_llm_pretrain.py qwen3_235b_a22b_pretrain_config_h100, L183 at v0.3.1; v0.2.0
#: configs/qwen3/qwen3_llm_pretrain.py L153)
TP_OVERLAP_OFF = (r"cfg=qwen3_235b_a22b_pretrain_config_h100_", r"cfg=qwen3_235b_a22b_h100_")


def _release_run(row: Mapping[str, str]) -> tuple[Mapping[str, str], str | None]:
    """``row`` with the RELEASE_RUNS flags and recompute of its release, model and GPU (where
    it states no recompute), and the note that says so; else ``row`` as it is. The
    RECIPE_PRECISION flags of its model and precision whatever it states, and their note."""
    recipe = None
    for source, model, precision, flags in RECIPE_PRECISION:
        if (re.search(source, row.get("source") or "")
                and re.search(model, row.get("model") or "")
                and re.search(precision, row.get("precision") or "")
                and flags not in (row.get("other_flags") or "")):
            stated = (row.get("other_flags") or "").strip()
            row = {**row, "other_flags": "; ".join(x for x in (stated, flags) if x)}
            recipe = f"the perf recipe's per-layer precision ({flags})"
    for source, release, model, gpu, precision, flags, recompute in RELEASE_RUNS:
        if (re.search(source, row.get("source") or "")
                and re.search(release, row.get("release") or "")
                and re.search(model, row.get("model") or "")
                and re.search(gpu, row.get("gpu") or "")
                and re.search(precision, row.get("precision") or "")
                and not (row.get("recompute") or "").strip()):
            note = (f"flags and recompute of the release's perf script ({flags or 'defaults'}; "
                    f"{recompute})")
            stated = (row.get("other_flags") or "").strip()
            return {**row, "other_flags": "; ".join(x for x in (stated, flags) if x),
                    "recompute": recompute}, "; ".join(x for x in (recipe, note) if x)
    return row, recipe


def _measured_machine(source: str) -> list[tuple[dict, str]]:
    """(hardware overrides, the row's note) of the MEASURED_MACHINE entries ``source`` matches."""
    return [(overrides, note) for pattern, overrides, note in MEASURED_MACHINE
            if re.search(pattern, source)]


def _launched_stack(stack: Stack, source: str, assumptions: list[str]) -> Stack:
    """``stack`` with the MEASURED_LAUNCH fields of the entries ``source`` matches (and their
    notes added to ``assumptions``)."""
    for pattern, fields, note in MEASURED_LAUNCH:
        if re.search(pattern, source):
            stack = dataclasses.replace(stack, **fields)
            assumptions.append(note)
    return stack


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
    #: Transformer Engine's linears: column-parallel backward collectives asynchronous
    tp_async_bwd: bool = False


#: DeepSpeed ZeRO-1/2 default reduce and all-gather buckets: 2 x 5e8 16-bit elements
#: (DeepSpeed config docs: reduce_bucket_size, allgather_bucket_size)
DEEPSPEED_BUCKETS_GiB = 2 * 5e8 * 2 / 2**30


#: the stacks that run Megatron-Core (its pipeline split rules)
MEGATRON_CORE = ("nemo", "megatron-bridge", "megatron-core")

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
    "nemo": Stack("fused", True, True, "bf16", True, True, pp_overlap=True, tp_async_bwd=True),
    # NeMo's successor for Megatron models: its performance configs reduce gradients in 16 bits
    # too (Megatron-Bridge scripts/performance/utils/helpers.py set_basic_perf_overrides:
    # ddp.grad_reduce_in_fp32 = False)
    # its performance configs (scripts/performance, v0.2.0 - v0.3.1) set fp8_param_gather /
    # fp8_param for FP8 and MXFP8, and no recompute for the dense Llama models but for three
    # that state recompute_num_layers (configs/llama/*_workload_base_configs.py)
    "megatron-bridge": Stack("fused", True, True, "bf16", True, True, pp_overlap=True,
                             lp_params=True, default_recompute="none", tp_async_bwd=True),
    "megatron-core": Stack("fused", True, True, "fp32", True, True, pp_overlap=True,
                           tp_async_bwd=True),
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
    """A column as a finite number, else None (empty, text, nan or inf: not given)."""
    text = (row.get(key) or "").strip()
    if not text:
        return None
    try:
        v = float(text)
    except ValueError:
        return None
    return v if np.isfinite(v) else None


def _int(row, key) -> int | None:
    v = _num(row, key)
    return int(v) if v is not None and np.isfinite(v) and v == int(v) else None


# ------------------------------------------------------------------------------ expressing rows

def _recompute(text: str, row, layers_per_stage: int, moe: bool = False
               ) -> tuple[list[tuple[int, float]], str | None]:
    """Recompute options [(policy, layer fraction)] from the recompute column; ``moe``: every
    block past the first dense ones is an MoE block (its 'mlp' recomputes only those)."""
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
        # recompute_modules): the attention core is Megatron's selective recompute; the
        # others (norms, the MoE activation, the MoE layer, MLA's up-projections) are the
        # Job's recompute_* fields on top of it
        # ("mlp" re-runs a dense layer's MLP, never an MoE layer's: Megatron-Core
        # transformer_layer.py sets recompute_mlp only when not is_moe_layer)
        names = set(re.findall(r"[a-z_]+", modules.group(1)))
        if "mlp" in names and not moe:
            return [(Recompute.FULL, 0.0)], f"recompute of {sorted(names)} costed as full"
        note = ("recompute of 'mlp' re-runs the dense layers' MLPs only: not costed"
                if "mlp" in names else None)
        if "core_attn" in names:
            return [(Recompute.SELECTIVE, 0.0)], note
        return [(Recompute.NONE, 0.0)], note  # the cheap modules: Job recompute_* fields
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
    if re.search(r"grad_reduce_in_fp32\s*=\s*true", row.get("other_flags", ""),
                 re.IGNORECASE):
        return "fp32"
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
    # Megatron-Core activation offloading: cpu_offloading_num_layers=N, or fine-grained
    # (fine_grained_activation_offloading=True; offload_modules=['core_attn', ...])
    offload = re.search(r"cpu_offloading_num_layers\s*=\s*(\d+)", flags)
    modules_off = re.search(r"offload_modules\s*=\s*\[([^\]]*)\]", flags) if re.search(
        r"fine_grained_activation_offloading\s*=\s*true", flags) else None
    moe = _moe_fields(run, shape, flags, stack, assumptions) if run.model is not None else {}
    modules = set(re.findall(r"[a-z_]+", v["recompute"])) if "recompute_modules" in \
        v["recompute"] else set()
    # per-layer precision (Megatron-Bridge MixedPrecisionConfig first_last_layers_bf16 with
    # num_layers_at_start_in_bf16 / _end_, 0 unless set there: mixed_precision.py L53 - 74)
    # and the Nemotron 3 Super quantization recipe's 16-bit modules (te_quant.cfg matchers
    # attn_qkv_bf16, attn_proj_bf16, latent_bf16)
    ends = {k: 0 for k in ("start", "end")}
    if re.search(r"first_last_layers_bf16\s*=\s*true", flags):
        for k in ends:
            n = re.search(rf"num_layers_at_{k}_in_bf16\s*=\s*(\d+)", flags)
            ends[k] = int(n.group(1)) if n else 0
    te_quant = "te_quant.cfg" in flags
    out_proj = re.search(r"mamba_out_proj\s*=\s*(bf16|fp8|mxfp8|nvfp4)", flags)
    # a perf script's overlap_grad_reduce=False (Megatron-Bridge 25.09's DeepSeek-V3 on H100)
    dp_overlap = stack.dp_overlap and not re.search(r"overlap_grad_reduce\s*=\s*false", flags)
    # Megatron-Bridge's FP8_CS configs run per-tensor current scaling (scripts/performance/
    # utils/precision.py get_precision_config: fp8_cs -> bf16_with_fp8_current_scaling_mixed),
    # whatever the table's precision label; from v0.3 (NeMo 26.02) its perf scripts offer
    # only fp8_cs, fp8_mx and fp8_sc (precision.py L28 - 36), so a plain "FP8" row of the
    # 26.02 tables is a current-scaling one
    current = run.precision in ("fp8-current", "fp8-tensorwise", "fp8-rowwise")
    if run.precision == "fp8" and (re.search(r"cfg=\S*_fp8_cs_", flags) or (
            run.framework == "megatron-bridge"
            and re.search(r"NeMo 26\.02", v.get("release") or ""))):
        current = True
        assumptions.append("fp8 current scaling (an FP8_CS config, or the release offers no "
                           "other plain fp8)")
    # Megatron-DeepSpeed's partition method type:transformer|embed(ding): the embedding
    # and the LM head take a pipeline slot each (the row's notes say so); Megatron-Core
    # splits the layers evenly over the p x v (virtual) stages, or with
    # account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split the
    # layers and those two slots (TransformerConfig's checks; Megatron-Bridge's Llama 3.1
    # 405B recipes set both, recipes/llama/h100/llama3.py): a model that splits only so
    slots = bool(re.search(r"type:transformer\|embed", v["notes"]))
    stages = (_int(v, "pp") or 1) * (_int(v, "vp") or 1)
    if UNEVEN_64 in v["other_flags"] and stages > 1 and (_int(v, "vp") or 1) == 1:
        # middle stages of 64 / pp layers, the first one fewer and the last two fewer: for
        # DeepSeek-V3's 61 layers at pp = 4, 8, 16, the split that counts the embedding and
        # the loss as a layer each (calibrated._combine); another model or pp: the even one
        mid = 64 // stages
        if stage_layers(shape["n_layers"], stages, True) == (mid - 1, mid, mid - 2):
            slots = True
            assumptions.append(f"pipeline stages of {mid - 1}, {mid} and {mid - 2} layers "
                               "(first, middle, last: the script's split)")
        else:
            assumptions.append("the script's first and last stages of 64 / pp - 1 and 64 / pp "
                               "- 2 layers do not fit this row: the even split costed")
    if run.framework in MEGATRON_CORE and stages > 1 and shape["n_layers"] % stages \
            and (shape["n_layers"] + 2) % stages == 0:
        slots = True
        assumptions.append("embedding and loss counted in the pipeline split (the only "
                           "even split of its layers)")
    attention_kernel = stack.attention_kernel
    if UNFUSED_MLA in v["other_flags"] and moe.get("attention") == "mla":
        attention_kernel = "materialized"
        assumptions.append("MLA attention materialized (TE before 2.5 has no fused kernel "
                           "for its head sizes on Blackwell)")
    return Job(**moe,
        name=v["id"], n_layers=shape["n_layers"], hidden=shape["hidden"],
        ffn_hidden=shape["ffn_hidden"], n_heads=shape["n_heads"],
        n_kv_heads=shape["n_kv_heads"], head_dim=shape["head_dim"], vocab=shape["vocab"],
        seq_len=shape["seq_len"], global_batch=shape["global_batch_seqs"], **arch,
        dtype=run.dtype, attention_kernel=attention_kernel,
        fused_kernels=stack.fused_kernels or compiled,
        dp_overlap=dp_overlap,
        pp_overlap=stack.pp_overlap and "no overlap-p2p" not in flags,
        buffers_GiB=stack.buffers_GiB,
        zero3_live_params=stack.zero3_live_params, grad_bucket_params=stack.grad_bucket_params,
        fused_loss=stack.fused_loss or compiled_loss,
        lp_params=stack.lp_params or bool(re.search(r"fp8_param_gather\s*=\s*true", flags)),
        lp_saved_inputs=stack.lp_saved_inputs,
        lp_norm_cast=stack.lp_norm_cast, tp_async_bwd=stack.tp_async_bwd,
        fp8_scaling=("rowwise" if run.precision == "fp8-rowwise" else
                     "blockwise" if run.precision == "fp8-blockwise" else
                     "current" if current else "delayed"),
        grad_dtype=grad_dtype, source=v["source_ref"],
        grad_accum_bytes=UNFUSED_ACCUM_BYTES.get(grad_dtype, 0.0) * stack.unfused_grad_accum,
        embedding_slots=slots,
        offload_act_layers=float(offload.group(1)) if offload else 0.0,
        offload_modules="+".join(m for m in OFFLOAD_MODULES if modules_off and re.search(
            rf"\b{m}\b", modules_off.group(1))),
        recompute_norms="layernorm" in modules, recompute_moe_act="moe_act" in modules,
        recompute_moe="moe" in modules and bool(moe.get("n_experts")),
        recompute_mla_up="mla_up_proj" in modules and moe.get("attention") in ("mla", "csa"),
        bf16_first_layers=ends["start"], bf16_last_layers=ends["end"], bf16_attention=te_quant,
        bf16_latent=te_quant and bool(moe.get("moe_latent_size")),
        mamba_out_dtype=out_proj.group(1) if out_proj and moe.get("hybrid_pattern", "").count(
            "M") else "")


#: the Job fields of a named model's experts and attention that a row inherits
MODEL_FIELDS = ("n_experts", "top_k", "moe_ffn_hidden", "shared_ffn_hidden", "first_k_dense",
                "moe_layer_step", "router", "router_groups", "router_group_topk",
                "attention", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                "qk_rope_head_dim", "v_head_dim", "mtp_layers", "sliding_window",
                "full_attention_every", "rope_mscale", "swiglu_clamp", "hybrid_pattern",
                "mamba_heads", "mamba_head_dim", "mamba_state", "mamba_groups", "mamba_conv",
                "moe_latent_size", "mtp_pattern", "mtp_shared", "mtp_bf16", "o_lora_rank",
                "o_groups", "csa_layers", "hca_layers", "index_heads", "index_head_dim",
                "index_topk", "hc_streams")


def _moe_fields(run: Run, shape, flags: str, stack: Stack, assumptions: list[str]) -> dict:
    """The named model's MoE / MLA / MTP fields as the row ran them: dense layers of a
    truncated model ("first layer dense"), multi-token prediction (Megatron-Bridge's
    DeepSeek-V3 recipes have one MTP layer and its FLOPs count it, unless the row says
    "w/o MTP"; other sources' rows none unless "w/ MTP"), token dropping with capacity
    factor 1 (SimuMax's --moe-expert-capacity-factor 1 with padding; Megatron-Bridge's
    "token-drop" rows), the flex dispatcher (DeepEP / HybridEP backends)."""
    m, v = run.model, run.values
    out = {k: getattr(m, k) for k in MODEL_FIELDS}
    if not m.is_moe and m.attention == "mha" and not m.hc_streams:
        return out
    text = " | ".join((v["notes"], flags))
    layers = shape["n_layers"]
    if layers < m.n_layers:
        first = re.search(r"first layer dense", text, re.I)
        out["first_k_dense"] = 1 if first else min(m.first_k_dense, layers - 1)
        # (a truncated csa model keeps its shares of ratio-4 and ratio-128 layers)
        out["csa_layers"] = round(m.csa_layers * layers / m.n_layers)
        out["hca_layers"] = min(round(m.hca_layers * layers / m.n_layers),
                                layers - out["csa_layers"])
        if not out["csa_layers"]:  # (no ratio-4 layer left: no indexer)
            out.update(index_heads=0, index_head_dim=0, index_topk=0)
    out["moe_layer_step"] = min(out["moe_layer_step"], layers - out["first_k_dense"])
    with_mtp = re.search(r"w/ ?MTP", text, re.I)
    without = re.search(r"w/o ?MTP", text, re.I)
    keep = with_mtp or (run.framework == "megatron-bridge" and not without
                        and layers == m.n_layers)
    out["mtp_layers"] = m.mtp_layers if keep else 0
    if not keep:  # (the depths' pattern, sharing and format go with them)
        out.update(mtp_pattern="", mtp_shared=False, mtp_bf16=False)
    if re.search(r"capacity-factor 1\b|token-drop(?!less)", text, re.I):
        out["capacity_factor"] = 1.0
        assumptions.append("token-drop MoE costed at capacity factor 1, padded")
    if re.search(r"flex_dispatcher_backend|deepep|hybridep|token_dispatcher_type\s*=\s*flex",
                 text, re.I):
        if any(re.search(p, flags, re.IGNORECASE) for p in UNAPPLIED_FLEX):
            assumptions.append("alltoall dispatcher: the perf script at that tag did not apply "
                               "the flex backend its config names")
        else:
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
    for overrides, _ in _measured_machine(v["source"]):
        hw = apply_overrides(hw, overrides, "source")
    domain = _int(v, "nvlink_domain")
    if domain:
        # a run fills NVLink domains in equal parts: 64 of an NVL72's 72 GPUs at 64 - 256 GPUs
        node = max(d for d in divisors(n).tolist() if d <= domain)
    else:
        node = _int(v, "gpus_per_node") or hw.nvlink_domain
    return dataclasses.replace(hw, nvlink_domain=node), node


def express(row: Mapping[str, str]) -> Case | Refusal:
    """A measured run as a Case, or why it cannot be expressed."""
    row, release_note = _release_run(row)
    run = parse_run(row)
    if isinstance(run, Refusal):
        return run
    v = run.values
    assumptions = list(run.notes) + ([release_note] if release_note else [])
    stack = _launched_stack(STACKS[run.framework], v["source"], assumptions)
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
    assumptions += [note for _, note in _measured_machine(v["source"])]
    zero = sharding_of(v["zero_fsdp"], v["fsdp"], node)
    if zero is None:
        text = v["zero_fsdp"] or v["fsdp"]
        return _refuse("sharding not understood", f"sharding {text!r} not understood "
                       f"({suggest(text, list(SHARDING))}accepted: {', '.join(SHARDING)}, "
                       f"FSDP=N, dp_shard=N)")
    if not zero[2]:
        assumptions.append("distributed optimizer (ZeRO-1) assumed")
    optimizer = _optimizer(run)
    if optimizer:
        job = dataclasses.replace(job, **optimizer)
        assumptions.append("precision-aware optimizer" + (
            ", bf16 moments (the DeepSeek-V3 recipe)" if len(optimizer) > 1 else
            " (bf16 performance runs)"))
    layers_per_stage = int(np.ceil(job.n_layers / pp))
    recomputes, note = _recompute(v["recompute"] or stack.default_recompute, v,
                                  layers_per_stage, job.is_moe and job.moe_layer_step <= 1)
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
    if re.search(r"tp comm overlap disabled", flags, re.IGNORECASE) or any(
            re.search(p, flags, re.IGNORECASE) for p in TP_OVERLAP_OFF):
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


def _optimizer(run: Run) -> dict:
    """Adam's states as Megatron-Bridge's performance runs keep them: its scripts turn the
    precision-aware optimizer on for bf16 runs (v0.1.0rc3 - rc4 run_script.py, v0.2.0
    utils/helpers.py L255, v0.3.x utils/overrides.py L421 / L437: compute_dtype bf16 ->
    use_precision_aware_optimizer = True; the recipes' fp32 states, master weights as
    remainders), under Megatron FSDP too from v0.2.0 (rc3 - rc4 turned it off there after,
    helpers.py L87; no shipped bf16 row runs FSDP); its DeepSeek-V3 recipe keeps bf16
    moments (and main gradients: the 16-bit gradient buffer, grad_dtype bf16, as the stack
    reduces them) at every precision (recipes/deepseek/deepseek_v3.py, v0.1.0rc4 - v0.3.1:
    exp_avg_dtype = exp_avg_sq_dtype = main_grads_dtype = bfloat16)."""
    if run.framework != "megatron-bridge":
        return {}
    if run.model is not None and run.model.name == "deepseek_v3":
        return {"precision_aware_optimizer": True, "exp_avg_dtype": "bf16",
                "exp_avg_sq_dtype": "bf16"}
    return {"precision_aware_optimizer": True} if run.dtype == "bf16" else {}


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
    if vp_given and vp_given > 1 and pp == 1:
        # (dgxc's Llama 4 Maverick H100 rows: one stage cannot interleave; the same costs)
        vp_options = [1]
        assumptions.append(f"vp {vp_given} with pp 1 read as no interleaving (a single "
                           "stage has no virtual stages)")
    elif vp_given:
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
