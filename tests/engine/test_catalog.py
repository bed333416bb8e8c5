"""Hardware and job files: unit conversion, validation and one-line errors."""

from __future__ import annotations

import pytest

from sweep.engine.catalog import list_names, load_hardware, load_job
from sweep.errors import SpecError
from sweep.model.cost import calibrated
from sweep.model.hardware import apply_overrides, parse_hardware
from sweep.model.job import parse_job
from sweep.model.units import parse_quantity

MIN_HW = {"matrix_tflops": {"bf16": 100}, "vector_tflops": {"bf16": 10, "fp32": 5},
          "hbm_GBps": 1000,
          "hbm_GiB": 40, "nvlink_GBps": 300, "nvlink_latency_us": 3, "nvlink_domain": 8,
          "scaleout_Gbps": 200, "scaleout_latency_us": 5}


def test_units():
    assert parse_quantity("3.35 TB/s", "bytes_per_s") == 3.35e12
    assert parse_quantity("400 Gb/s", "bytes_per_s") == 50e9
    assert parse_quantity("80 GiB", "bytes") == 80 * 2**30
    assert parse_quantity("2.5 us", "s") == pytest.approx(2.5e-6, rel=1e-15)
    assert parse_quantity("989 TFLOPS", "flops_per_s") == 989e12
    with pytest.raises(ValueError, match="not a unit of bytes"):
        parse_quantity("3 TB/s", "bytes")


def test_hardware_keys_convert_to_si():
    hw = parse_hardware(MIN_HW, "x.yaml", "x")
    assert hw.hbm_capacity_bytes == 40 * 2**30 and hw.hbm_bytes_per_s == 1e12
    assert hw.scaleout_bytes_per_s == 25e9 and hw.nvlink_latency_s == 3e-6
    assert hw.matrix_peak("bf16") == 1e14 and hw.matrix_peak("fp16") == 1e14
    alt = parse_hardware({**{k: v for k, v in MIN_HW.items() if k != "hbm_GBps"},
                          "hbm_bandwidth": "1 TB/s"}, "x.yaml", "x")
    assert alt.hbm_bytes_per_s == 1e12



def test_half_bandwidth_sizes_are_optional_bytes():
    assert parse_hardware(MIN_HW, "x.yaml", "x").nvlink_half_bandwidth_per_rank_bytes == 0.0
    hw = parse_hardware({**MIN_HW, "nvlink_half_bandwidth_per_rank_MiB": 4,
                         "scaleout_half_bandwidth_per_rank": "2 MiB"}, "x.yaml", "x")
    assert hw.nvlink_half_bandwidth_per_rank_bytes == 4 * 2**20
    assert hw.scaleout_half_bandwidth_per_rank_bytes == 2 * 2**20
    with pytest.raises(SpecError, match="x.yaml: nvlink_half_bandwidth_per_rank: a bare number "
                                        "has no unit"):
        parse_hardware({**MIN_HW, "nvlink_half_bandwidth_per_rank": 4}, "x.yaml", "x")
    swept = apply_overrides(hw, {"nvlink_half_bandwidth_per_rank_MiB": 8}, "s.yaml")
    assert swept.nvlink_half_bandwidth_per_rank_bytes == 8 * 2**20


def test_sustained_gemm_fraction_is_optional_and_a_fraction():
    assert parse_hardware(MIN_HW, "x.yaml", "x").matrix_sustained_fraction == 0.0
    hw = parse_hardware({**MIN_HW, "matrix_sustained_fraction": 0.8}, "x.yaml", "x")
    assert hw.matrix_sustained_fraction == 0.8
    with pytest.raises(SpecError, match="x.yaml: matrix_sustained_fraction: expected a number "
                                        "in \\(0, 1\\]"):
        parse_hardware({**MIN_HW, "matrix_sustained_fraction": 1.3}, "x.yaml", "x")
    assert apply_overrides(hw, {"matrix_sustained_fraction": 0.7},
                           "s.yaml").matrix_sustained_fraction == 0.7
    # the /cases record holds the fraction the calibrated profile applies: the file's, or
    # its generation's when left out (1 without a generation), never the 0 that marks it
    assert hw.record()["matrix_sustained_fraction"] == 0.8
    blackwell = parse_hardware({**MIN_HW, "generation": "blackwell"}, "x.yaml", "x")
    assert blackwell.record()["matrix_sustained_fraction"] == \
        blackwell.sustained_fraction == calibrated.SUSTAINED_FRACTION["blackwell"] == 0.776
    assert parse_hardware(MIN_HW, "x.yaml", "x").record()["matrix_sustained_fraction"] == 1.0

@pytest.mark.parametrize("change, message", [
    ({"hbm_GBps": -5}, "x.yaml: hbm_GBps: expected a positive value"),
    ({"hbm_GBps": "fast"}, "x.yaml: hbm_GBps: expected a positive number"),
    ({"hbm_speed": 5}, "x.yaml: hbm_speed: unknown key; valid keys:"),
    ({"nvlink_efficiency": 1.5}, "x.yaml: nvlink_efficiency: expected a number in (0, 1]"),
    ({"nvlink_domain": 2.5}, "x.yaml: nvlink_domain: expected a positive integer"),
    ({"matrix_tflops": {"bf17": 3}}, "x.yaml: matrix_tflops.bf17: unknown precision"),
    ({"hbm_bandwidth": "1 TB"}, "x.yaml: hbm_bandwidth: unit 'TB' is not a unit of bytes_per_s"),
    ({"hbm_TBps": 1}, "x.yaml: hbm_TBps: hbm_bandwidth is given twice (hbm_GBps and hbm_TBps)"),
    ({"generation": "rubin"}, "x.yaml: generation: unknown generation 'rubin'; known: volta, "
                              "ampere, hopper, blackwell"),
    # what the cost models read must be there (a KeyError traceback before)
    ({"matrix_tflops": {"fp8": 200}}, "x.yaml: matrix_tflops: needs a bf16 or fp16 peak; has fp8"),
    ({"vector_tflops": {"bf16": 10}}, "x.yaml: vector_tflops: needs an fp32 peak; has bf16"),
    ({"vector_tflops": {"fp32": 10}}, "x.yaml: vector_tflops: needs a bf16 or fp16 peak"),
    # the calibrated profile's parameters: known names, inside their physical ranges
    ({"calibration": {"kernel_us": -50}}, ("x.yaml: calibration.kernel_us: -50 is outside its "
                                           "physical range [0, 60]")),
    ({"calibration": {"gemm_eff": 0}}, "x.yaml: calibration.gemm_eff: 0 is outside"),
    ({"calibration": {"typo_eff": 0.5}}, ("x.yaml: calibration.typo_eff: unknown parameter; "
                                          "valid: gemm_eff,")),
    ({"exp_per_s": 1e12, "matrix_flops_per_exp": "garbage"}, "x.yaml: matrix_flops_per_exp:"),
    ({"name": "a\nb"}, "x.yaml: name: expected at most 128 printable characters"),
    ({"name": ["a", "b"]}, "x.yaml: name: expected a non-empty name, got ['a', 'b']"),
])
def test_hardware_errors_name_file_and_key(change, message):
    raw = dict(MIN_HW)
    if "hbm_bandwidth" in change:
        del raw["hbm_GBps"]
    with pytest.raises(SpecError) as exc:
        parse_hardware({**raw, **change}, "x.yaml", "x")
    assert str(exc.value).startswith(message)


def test_missing_hardware_key():
    with pytest.raises(SpecError, match="x.yaml: hbm_capacity: missing"):
        parse_hardware({k: v for k, v in MIN_HW.items() if k != "hbm_GiB"}, "x.yaml", "x")


def test_overrides():
    a = load_hardware("nersc-A100")
    hw = apply_overrides(a, {"nvlink_domain": 64, "hbm_GBps": 3000, "matrix_tflops": 624},
                         "s.yaml")
    assert hw.nvlink_domain == 64 and hw.hbm_bytes_per_s == 3e12
    assert hw.matrix_peak("fp16") == pytest.approx(624e12)
    with pytest.raises(SpecError, match="s.yaml: grid.hbm_speed: unknown hardware parameter"):
        apply_overrides(a, {"hbm_speed": 1}, "s.yaml", {"hbm_speed": "grid.hbm_speed"})
    # exponential rates: a file's FLOPs per exponential (or its generation's) at its own
    # tensor peak; an override of the tensor peak keeps the rate
    b200, gb300 = load_hardware("B200"), load_hardware("GB300-NVL72")
    assert b200.exp_per_s == pytest.approx(2250e12 / 512)  # blackwell: 8192 / 16 per clock
    assert gb300.exp_per_s == pytest.approx(2500e12 / 256)  # the file: 8192 / 32
    assert apply_overrides(b200, {"matrix_tflops": 9000}, "s.yaml").exp_per_s == b200.exp_per_s


def test_job_defaults_and_errors():
    j = parse_job({"n_layers": 2, "hidden": 64, "ffn_hidden": 256, "n_heads": 4, "seq_len": 32,
                   "global_batch": 8}, "j.yaml", "j")
    assert j.n_kv_heads == 4 and j.head_dim == 16 and j.vocab == 0 and j.name == "j"
    with pytest.raises(SpecError, match="j.yaml: n_kv_heads: 3 does not divide n_heads = 4"):
        parse_job({"n_layers": 2, "hidden": 64, "ffn_hidden": 256, "n_heads": 4,
                   "n_kv_heads": 3, "seq_len": 32, "global_batch": 8}, "j.yaml", "j")
    with pytest.raises(SpecError, match="j.yaml: mlp: expected one of gelu, swiglu"):
        parse_job({"n_layers": 2, "hidden": 64, "ffn_hidden": 256, "n_heads": 4, "seq_len": 32,
                   "global_batch": 8, "mlp": "relu"}, "j.yaml", "j")
    with pytest.raises(SpecError, match="j.yaml: hidden: missing"):
        parse_job({"n_layers": 2}, "j.yaml", "j")


def test_shipped_catalogs_load_and_have_sources():
    hw_names = list_names("hardware")
    job_names = list_names("jobs")
    for required in ("nersc-A100", "nersc-H200", "nersc-B200", "nersc-B200-next", "V100",
                     "A100-40GB", "A100-80GB", "H100-SXM", "H200", "B200", "GB200-NVL72"):
        assert required in hw_names
    for required in ("gpt3", "gpt3_1T", "vit_era5", "gpt3_175b", "megatron_22b",
                     "megatron_530b", "megatron_1t", "llama2_7b", "llama2_13b", "llama2_70b",
                     "llama3_8b", "llama3_70b", "llama3_405b", "bert_large"):
        assert required in job_names
    for name in hw_names:
        assert load_hardware(name).source, name
    for name in job_names:
        assert load_job(name).source, name


def test_published_parameter_counts():
    """Blocks-only counts the NERSC study quotes, and public totals of real models."""
    assert load_job("gpt3_1T").n_layers * load_job("gpt3_1T").params_per_layer() \
        == pytest.approx(1006.7e9, rel=1e-3)
    assert load_job("llama3_8b").params_total() == pytest.approx(8.03e9, rel=0.01)
    # exactly the Hugging Face checkpoint's count (RMSNorm: one weight vector per norm)
    assert load_job("llama3_8b").params_total() == 8_030_261_248
    assert load_job("llama2_70b").params_total() == pytest.approx(68.98e9, rel=0.01)
    assert load_job("llama3_405b").params_total() == pytest.approx(405.9e9, rel=0.01)
    assert load_job("gpt3_175b").params_total() == pytest.approx(175e9, rel=0.01)


def test_generation_names_any_case():
    assert parse_hardware({**MIN_HW, "generation": "Hopper"}, "x.yaml", "x").generation == \
        "hopper"


def test_a_hardware_file_outside_the_catalog_is_calibrated_as_the_catalogs(tmp_path,
                                                                            monkeypatch):
    """A copy of a shipped hardware file elsewhere (by path, or on SWEEP_CATALOG_PATH) gets
    its generation's calibrated parameters from the shipped calibration file, as the
    original does; a calibration file beside it is its own; its own values override both."""
    import shutil

    from sweep.engine import catalog

    shipped = load_hardware("H100-SXM")
    assert shipped.calibration["gemm_eff"]  # (the fitted parameters)
    copy = tmp_path / "myh100.yaml"
    shutil.copy(catalog.REPO_ROOT / "hardware" / "H100-SXM.yaml", copy)
    assert load_hardware(str(copy)).calibration == shipped.calibration
    (tmp_path / "hardware").mkdir()
    shutil.copy(copy, tmp_path / "hardware" / "mine.yaml")
    monkeypatch.setenv("SWEEP_CATALOG_PATH", str(tmp_path))
    assert load_hardware("mine").calibration == shipped.calibration
    # a calibration file of one's own beside it, and the file's own values over it
    (tmp_path / "calibration.yaml").write_text("hopper: {gemm_eff: 0.5}\n")
    text = copy.read_text() + "calibration: {kernel_us: 3.0}\n"
    (tmp_path / "own.yaml").write_text(text)
    own = load_hardware(str(tmp_path / "own.yaml")).calibration
    assert own["gemm_eff"] == 0.5 and own["kernel_us"] == 3.0


def test_calibration_file_values_are_checked(tmp_path):
    from sweep.engine.catalog import load_calibration

    path = tmp_path / "calibration.yaml"
    path.write_text("hopper: {gemm_eff: 0.8, hbm_eff: 7}\n")
    with pytest.raises(SpecError, match="calibration.yaml: hopper.hbm_eff: 7 is outside its "
                                        "physical range"):
        load_calibration(path)
    path.write_text("hopper: {gemm_eff: 0.8}\nmemory: {reserve_GiB: 2}\n")
    assert load_calibration(path) == {"hopper": {"gemm_eff": 0.8},
                                      "memory": {"reserve_GiB": 2.0}}


def test_shipped_calibration_is_inside_the_bounds_files_are_held_to():
    from sweep.analysis.calibration import BOUNDS
    from sweep.engine.catalog import REPO_ROOT, load_calibration
    from sweep.model.hardware import CALIBRATION_BOUNDS

    assert BOUNDS == CALIBRATION_BOUNDS
    table = load_calibration(REPO_ROOT / "hardware" / "calibration.yaml")  # (checked there)
    assert {"hopper", "blackwell", "memory"} <= set(table)


def test_job_name_is_a_plain_name():
    base = {"n_layers": 2, "hidden": 64, "ffn_hidden": 256, "n_heads": 4, "seq_len": 32,
            "global_batch": 8}
    assert parse_job({**base, "name": "tiny-2.0_b"}, "j.yaml", "j").name == "tiny-2.0_b"
    for bad in ("a\nb", "x[seq_len=4]", "", ["a"]):
        with pytest.raises(SpecError, match="j.yaml: name: expected"):
            parse_job({**base, "name": bad}, "j.yaml", "j")


def test_a_catalog_job_is_named_as_its_file(tmp_path):
    """A catalog job is found by its file name and labels results by its name: the two
    must agree, or a label show prints could not be found again (an outside review). By
    path, a file may name its job as it likes."""
    (tmp_path / "jobs").mkdir()
    text = "name: other\nn_layers: 2\nhidden: 64\nffn_hidden: 256\nn_heads: 4\n" \
           "seq_len: 32\nglobal_batch: 8\n"
    (tmp_path / "jobs" / "tiny.yaml").write_text(text)
    with pytest.raises(SpecError, match=r"tiny.yaml: name: 'other' differs from the file's "
                                        r"name 'tiny'"):
        load_job("tiny", near=tmp_path)
    assert load_job(str(tmp_path / "jobs" / "tiny.yaml")).name == "other"
    (tmp_path / "jobs" / "same.yaml").write_text(text.replace("other", "same"))
    assert load_job("same", near=tmp_path).name == "same"
    # (a name with a dot is a name, not a path: llama3.1_8b)
    (tmp_path / "jobs" / "llama3.1_8b.yaml").write_text(text)
    with pytest.raises(SpecError, match="name: 'other' differs from the file's name"):
        load_job("llama3.1_8b", near=tmp_path)


@pytest.mark.parametrize("text, value", [("5e3", 5000.0), ("1.6e1", 16.0), ("-2E-3", -0.002),
                                         ("1e+3", 1000.0), (".5e2", 50.0), ("3", 3),
                                         ("1e", "1e"), ("e3", "e3")])
def test_exponent_numbers_read_as_numbers(tmp_path, text, value):
    """YAML 1.2 reads 5e3 as a number, PyYAML's 1.1 rules as a string: files and --set
    values read it as a number."""
    from sweep.engine.catalog import parse_value, read_yaml

    path = tmp_path / "x.yaml"
    path.write_text(f"x: {text}\n")
    assert read_yaml(path)["x"] == value and parse_value(text) == value
