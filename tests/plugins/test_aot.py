"""AOT PTX for the fused walk: real ``triton.compile`` builds (in a subprocess without the interpreter) and the
pure functions the export manifest and the TensorRT plugin are built on."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_trt.errors import DSparkTrtError
from dspark_trt.plugins import aot, ptx_isa
from dspark_trt.plugins.contract import INPUTS, OUTPUTS, UNION_INPUTS, UNION_OUTPUTS

pytestmark = pytest.mark.triton
REPO = Path(__file__).resolve().parents[2]


def build(out: Path, *args: str) -> dict:
    """``python -m dspark_trt.plugins.aot`` in a fresh process: triton.jit must see TRITON_INTERPRET unset."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "dspark_trt.plugins.aot", "--out", str(out), *args],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def small_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("ptx")
    args = ["--n", "3", "--k", "16", "--rank", "8", "--logit-scale", "0.5", "--dtypes", "bf16,fp32-fp16"]
    if aot.find_ptxas():
        args.append("--validate")
    return out, build(out, *args)


def test_build_writes_one_ptx_per_arch_and_dtype_pair(small_build):
    out, info = small_build
    files = sorted(p.name for p in out.glob("*.ptx"))
    assert files == sorted(k["file"] for k in info["kernels"]) and len(files) == 4  # 2 archs × 2 dtype pairs
    assert json.loads((out / aot.DESCRIPTION_FILE).read_text()) == info  # what gpu_check --ptx-dir reads
    assert {(k["compute_capability"], k["logits_dtype"], k["weights_dtype"]) for k in info["kernels"]} == {
        (a, t, w) for a in (80, 90) for t, w in (("bfloat16", "bfloat16"), ("float32", "float16"))}
    assert info["constexprs"] == {"N": 3, "K": 16, "R": 8, "BLOCK_K": 16, "BLOCK_R": 8, "LOGIT_SCALE": 0.5}
    assert [a["name"] for a in info["signature"]] == [c.name for c in INPUTS] + ["vocab", "draft_vocab"] + [
        c.name for c in OUTPUTS]
    json.dumps(info)  # JSON-able for the export manifest


def test_ptx_files_are_what_the_engine_needs(small_build):
    out, info = small_build
    for k in info["kernels"]:
        ptx = (out / k["file"]).read_text()
        assert hashlib.sha256(ptx.encode()).hexdigest() == k["sha256"]
        assert re.search(rf"\.visible \.entry {info['kernel_name']}\(", ptx)
        assert re.search(rf"^\.target {k['arch']}\b", ptx, re.MULTILINE)
        isa = aot.ptx_isa_version(ptx)
        assert isa == k["ptx_isa"] and ptx_isa.isa_number(isa) <= aot.DEFAULT_PTX_ISA  # a CUDA 13.0 driver JITs it
        # exactly TensorRT's AOT parameters: inputs, 2 int32 extras, outputs (Triton's unused scratch pointers,
        # which TensorRT would not pass, are stripped: 2 of them since Triton 3.5)
        assert k["params"] == len(INPUTS) + 2 + len(OUTPUTS) and k["trailing_params"] == 0
        assert k["stripped_params"] == (2 if triton_minor() >= 5 else 1 if triton_minor() >= 3 else 0)
        assert len(re.findall(r"\.param \.u32 ", ptx)) == 2
        assert len(re.findall(r"\.param \.u64 \.ptr", ptx)) == len(INPUTS) + len(OUTPUTS)
        assert k["launch"] == {"grid": ["B", 1, 1], "block": [k["num_warps"] * 32, 1, 1],
                               "shared_mem": k["launch"]["shared_mem"]}
        assert 0 <= k["launch"]["shared_mem"] <= aot.MAX_STATIC_SHARED_MEM  # the AOT launch cannot opt in to more
        assert k["ptx_isa_caps"]["requested"] == aot.DEFAULT_PTX_ISA  # the chosen ISA and its caps are recorded
        if aot.find_ptxas():  # the stripped PTX assembled by the CUDA toolkit's ptxas, as the driver's JIT would
            assert k["validated"]["spill_store_bytes"] == 0 and k["validated"]["registers"] > 0


@pytest.fixture(scope="module")
def union_build(tmp_path_factory):
    """The union kernel (--markov-topm 5) into the same kind of directory: its own files and description."""
    out = tmp_path_factory.mktemp("ptx-union")
    args = ["--n", "3", "--k", "16", "--rank", "8", "--logit-scale", "0.5", "--dtypes", "fp32-bf16",
            "--markov-topm", "5"]
    if aot.find_ptxas():
        args.append("--validate")
    return out, build(out, *args)


def test_union_build_describes_the_union_op(union_build):
    out, info = union_build
    assert (info["op"], info["plugin"], info["markov_topm"]) == ("DSparkTopKMarkovUnion", "dspark::DSparkTopKMarkovUnion", 5)
    assert info["kernel_name"] == "dspark_topk_markov_walk_union"
    assert json.loads((out / aot.UNION_DESCRIPTION_FILE).read_text()) == info
    assert not (out / aot.DESCRIPTION_FILE).exists()  # the plain op's description is not overwritten
    assert info["constexprs"] == {"N": 3, "K": 16, "M": 5, "R": 8, "BLOCK_K": 16, "BLOCK_M": 16, "BLOCK_D": 16,
                                  "BLOCK_R": 8, "LOGIT_SCALE": 0.5}
    assert [a["name"] for a in info["signature"]] == [c.name for c in UNION_INPUTS] + ["vocab", "draft_vocab"] + [
        c.name for c in UNION_OUTPUTS]
    types = {a["name"]: a["type"] for a in info["signature"]}
    assert (types["union_table"], types["base_logits"], types["union_ids"]) == ("*i32", "*fp32", "*i32")
    assert sorted(p.name for p in out.glob("*.ptx")) == sorted(k["file"] for k in info["kernels"])
    assert {k["file"] for k in info["kernels"]} == {
        f"dspark_topk_markov_walk_union.{sm}.fp32-bf16.n3k16m5r8.ptx" for sm in ("sm_80", "sm_90a")}
    for k in info["kernels"]:
        ptx = (out / k["file"]).read_text()
        assert re.search(r"\.visible \.entry dspark_topk_markov_walk_union\(", ptx)
        # TensorRT's AOT parameters exactly: 13 inputs, 2 int32 extras, 4 outputs (scratch pointers stripped)
        assert k["params"] == len(UNION_INPUTS) + 2 + len(UNION_OUTPUTS) == 19 and k["trailing_params"] == 0
        assert len(re.findall(r"\.param \.u32 ", ptx)) == 2
        assert k["launch"]["grid"] == ["B", 1, 1] and k["launch"]["block"] == [k["num_warps"] * 32, 1, 1]
        assert 0 <= k["launch"]["shared_mem"] <= aot.MAX_STATIC_SHARED_MEM
        assert ptx_isa.isa_number(k["ptx_isa"]) <= aot.DEFAULT_PTX_ISA
        if aot.find_ptxas():
            assert k["validated"]["spill_store_bytes"] == 0 and k["validated"]["registers"] > 0


def test_select_export_kernel_matches_the_op_and_the_union_width(small_build, union_build):
    out, info = union_build
    spec = aot.WalkKernelSpec(3, 16, 8, 0.5, "float32", "bfloat16", arch=90, markov_topm=5)
    k = aot.select_export_kernel(info, out, spec)
    assert k["name"] == "dspark_topk_markov_walk_union" and k["entry"]["file"].endswith("n3k16m5r8.ptx")
    with pytest.raises(DSparkTrtError, match=r"built for N, k, r, M = \(3, 16, 8, 5\)"):
        aot.select_export_kernel(info, out, aot.WalkKernelSpec(3, 16, 8, 0.5, "float32", "bfloat16", arch=90,
                                                               markov_topm=6))
    with pytest.raises(DSparkTrtError, match="PTX is for DSparkTopKMarkovUnion, the graph's node is DSparkTopKMarkov;"):
        aot.select_export_kernel(info, out, aot.WalkKernelSpec(3, 16, 8, 0.5, "float32", "bfloat16", arch=90))
    plain_out, plain_info = small_build
    with pytest.raises(DSparkTrtError, match="PTX is for DSparkTopKMarkov, the graph's node is DSparkTopKMarkovUnion"):
        aot.select_export_kernel(plain_info, plain_out, spec)


def test_union_kernel_arguments_follow_the_aot_calling_convention():
    from dspark_trt.plugins.union_kernel import dspark_topk_markov_walk_union

    spec = aot.WalkKernelSpec(7, 512, 256, 1.0, "float16", "bfloat16", 90, markov_topm=32)
    sig = aot.kernel_signature(spec)
    constexprs = aot.kernel_constexprs(spec)
    assert [n for n, _ in sig] + list(constexprs) == list(dspark_topk_markov_walk_union.arg_names)
    types = dict(sig)
    assert types["base_logits"] == types["cand_values"] == "*fp16" and types["markov_w2"] == "*bf16"
    assert types["union_table"] == types["union_ids"] == "*i32" and types["cand_logits"] == "*fp32"
    assert (constexprs["M"], constexprs["BLOCK_M"]) == (32, 32)
    assert spec.op_name == "DSparkTopKMarkovUnion" and spec.plugin_id == "dspark::DSparkTopKMarkovUnion"
    assert spec.file_name == "dspark_topk_markov_walk_union.sm_90a.fp16-bf16.n7k512m32r256.ptx"
    assert aot.description_file(32) == aot.UNION_DESCRIPTION_FILE and aot.description_file(0) == aot.DESCRIPTION_FILE
    plain = aot.WalkKernelSpec(7, 512, 256, 1.0, "float16", "bfloat16", 90)
    assert "M" not in aot.kernel_constexprs(plain) and plain.file_name.endswith(".n7k512r256.ptx")
    with pytest.raises(DSparkTrtError, match="markov_topm -1 is outside"):
        aot.WalkKernelSpec(7, 512, 256, 1.0, markov_topm=-1)


@pytest.mark.slow
def test_qwen3_8b_shapes_build_for_cuda_12_drivers(tmp_path):
    info = build(tmp_path, "--n", "7", "--k", "3840", "--rank", "1024", "--archs", "90")
    (k,) = info["kernels"]
    assert k["ptx_isa"] == "8.0" and k["arch"] == "sm_90a" and k["min_driver_cuda"] == "12.0"
    assert k["launch"]["shared_mem"] <= aot.MAX_STATIC_SHARED_MEM  # the largest tiles still fit the AOT launch


# --------------------------------------------------------------------- the export's PTX is what the engine embeds
def test_select_export_kernel_returns_the_checked_file(small_build):
    out, info = small_build
    spec = aot.WalkKernelSpec(3, 16, 8, 0.5, "float32", "float16", arch=90)
    k = aot.select_export_kernel(info, out, spec)
    assert k["name"] == info["kernel_name"] and k["entry"]["arch"] == "sm_90a"
    assert k["ptx"] == (out / k["entry"]["file"]).read_text() and k["launch"] == k["entry"]["launch"]
    sm80 = aot.WalkKernelSpec(3, 16, 8, 0.5, "float32", "float16", arch=80)
    assert aot.select_export_kernel(info, out, sm80, hardware_compatibility="ampere_plus")["entry"]["arch"] == "sm_80"


def test_select_export_kernel_refuses_what_does_not_match(small_build, tmp_path):
    out, info = small_build
    spec = aot.WalkKernelSpec(3, 16, 8, 0.5, "float32", "float16", arch=90)
    with pytest.raises(DSparkTrtError, match="must embed sm_80 PTX, not sm_90a"):
        aot.select_export_kernel(info, out, spec, hardware_compatibility="ampere_plus")
    with pytest.raises(DSparkTrtError, match="driver JIT-compiles at most 7.8; update the driver to CUDA >= 12.0"):
        aot.select_export_kernel(info, out, spec, driver_cap=78)  # a CUDA 11.8 driver: no sm_90a PTX at all
    with pytest.raises(DSparkTrtError, match="driver JIT-compiles at most 7.8; re-export with --ptx-isa 7.8"):
        aot.select_export_kernel(info, out, aot.WalkKernelSpec(3, 16, 8, 0.5, "float32", "float16", arch=80),
                                 driver_cap=78)
    with pytest.raises(DSparkTrtError, match="built for N, k, r"):
        aot.select_export_kernel(info, out, aot.WalkKernelSpec(3, 32, 8, 0.5, "float32", "float16", arch=90))
    with pytest.raises(DSparkTrtError, match="no PTX for sm_90a float16-float16"):
        aot.select_export_kernel(info, out, aot.WalkKernelSpec(3, 16, 8, 0.5, "float16", "float16", arch=90))
    # a PTX file changed after the export checked it
    for f in out.glob("*.ptx"):
        (tmp_path / f.name).write_text(f.read_text().replace(".reqntid", "// .reqntid", 1) + "\n")
    with pytest.raises(DSparkTrtError, match="differs from the PTX the export checked"):
        aot.select_export_kernel(info, tmp_path, spec)


def test_logit_scale_compares_as_the_fp32_attribute(small_build):
    out, info = small_build
    import struct

    as_fp32 = struct.unpack("f", struct.pack("f", 0.5))[0]
    aot.select_export_kernel(info, out, aot.WalkKernelSpec(3, 16, 8, as_fp32, "float32", "float16", arch=80))
    with pytest.raises(DSparkTrtError, match="logit_scale"):
        aot.select_export_kernel(info, out, aot.WalkKernelSpec(3, 16, 8, 0.25, "float32", "float16", arch=80))


def triton_minor() -> int:
    import importlib.metadata

    major, minor = importlib.metadata.version("triton").split(".")[:2]
    return int(minor) if major == "3" else 99


PTX = """.version 9.0
.target sm_90a
.visible .entry k(
\t.param .u64 .ptr .global .align 1 k_param_0,
\t.param .u32 k_param_1,
\t.param .u64 .ptr .global .align 1 k_param_2,
\t.param .u64 .ptr .global .align 1 k_param_3
)
.reqntid 128
{
\t.reg .b64 %rd<3>;
\t.reg .b32 %r<2>;
\tld.param.u64 %rd1, [k_param_0];
\tld.param.u32 %r1, [k_param_1];
\tld.param.u64 %rd2, [k_param_2];
\tret;
}
"""


def test_unused_trailing_params_are_stripped_and_read_ones_are_not():
    stripped, n = aot.strip_unused_trailing_params(PTX, "k", 3)
    assert n == 1 and aot.ptx_param_count(stripped, "k") == 3 and "k_param_3" not in stripped
    assert stripped.count("k_param_2") == 2 and ".reqntid 128" in stripped  # the body is untouched
    assert aot.strip_unused_trailing_params(stripped, "k", 3) == (stripped, 0)
    with pytest.raises(DSparkTrtError, match="reads its trailing parameter k_param_2"):
        aot.strip_unused_trailing_params(PTX, "k", 2)
    with pytest.raises(DSparkTrtError, match="fewer than the 5"):
        aot.strip_unused_trailing_params(PTX, "k", 5)
    with pytest.raises(DSparkTrtError, match="no .entry other"):
        aot.strip_unused_trailing_params(PTX, "other", 3)


@pytest.mark.skipif(aot.find_ptxas() is None, reason="no CUDA toolkit ptxas")
def test_stripped_synthetic_ptx_assembles():
    stripped, _ = aot.strip_unused_trailing_params(PTX, "k", 3)
    assert aot.validate_ptx(stripped, "sm_90a", aot.find_ptxas())["spill_store_bytes"] == 0


def test_compiling_under_the_interpreter_is_refused():
    from dspark_trt.plugins.kernel import interpreting

    if not interpreting():
        pytest.skip("the interpreter is off in this process")
    with pytest.raises(DSparkTrtError, match="TRITON_INTERPRET"):
        aot.compile_walk_kernel(aot.WalkKernelSpec(3, 16, 8, 1.0))


def test_kernel_arguments_follow_the_aot_calling_convention():
    from dspark_trt.plugins.kernel import dspark_topk_markov_walk

    spec = aot.WalkKernelSpec(7, 512, 256, 1.0, "float16", "bfloat16", 90)
    sig = aot.kernel_signature(spec)
    constexprs = aot.kernel_constexprs(spec)
    assert [n for n, _ in sig] + list(constexprs) == list(dspark_topk_markov_walk.arg_names)
    types = dict(sig)
    assert types["cand_values"] == "*fp16" and types["markov_w1"] == types["markov_w2"] == "*bf16"
    assert types["cand_ids"] == types["draft_tokens"] == "*i32" and types["cand_logits"] == "*fp32"
    assert types["vocab"] == types["draft_vocab"] == "i32"


@pytest.mark.parametrize("cuda,isa", [("11.8", 78), ("12.0", 80), ("12.4", 84), ("12.6", 85), ("12.8", 87),
                                      ("12.9", 88), ("13.0", 90), ("13.2", 92), ("14.0", 100)])
def test_driver_isa_cap_follows_the_cuda_release_table(cuda, isa):
    assert ptx_isa.driver_max_ptx_isa(cuda) == isa


def test_driver_isa_cap_refuses_garbage_and_old_drivers():
    with pytest.raises(DSparkTrtError, match="MAJOR.MINOR"):
        ptx_isa.driver_max_ptx_isa("thirteen")
    with pytest.raises(DSparkTrtError, match="too old"):
        ptx_isa.driver_max_ptx_isa("10.2")


def test_the_default_isa_is_what_cuda_12_drivers_jit_compile(small_build, union_build):
    """Hosts with 550 (CUDA 12.4) and 570 (12.8) drivers build engines from the export's PTX: the default ISA is
    the lowest the kernel needs (sm_90a's 8.0), recorded with the oldest driver that JIT-compiles it."""
    for (out, info), m in ((small_build, 0), (union_build, 5)):
        spec = aot.WalkKernelSpec(3, 16, 8, 0.5, *(("float32", "float16") if not m else ("float32", "bfloat16")),
                                  arch=90, markov_topm=m)
        for cuda in ("12.0", "12.4", "12.8", "13.0"):  # a build host with this driver takes the export's PTX
            aot.select_export_kernel(info, out, spec, driver_cap=ptx_isa.driver_max_ptx_isa(cuda))
        for k in info["kernels"]:
            assert k["ptx_isa"] == "8.0" and k["min_driver_cuda"] == "12.0"
            assert k["ptx_isa_caps"]["arch_min"] == ptx_isa.min_ptx_isa(k["compute_capability"])
            assert aot.ptx_isa_version((out / k["file"]).read_text()) == "8.0"
    assert aot.DEFAULT_PTX_ISA == ptx_isa.min_ptx_isa(90) == 80 <= ptx_isa.driver_max_ptx_isa("12.4")


@pytest.mark.parametrize("isa,cuda", [("8.0", "12.0"), ("8.4", "12.4"), ("8.5", "12.5"), ("8.6", "12.8"),
                                      ("8.7", "12.8"), ("8.8", "12.9"), ("9.0", "13.0"), (78, "11.8"), (92, "13.2")])
def test_min_driver_cuda_inverts_the_release_table(isa, cuda):
    assert ptx_isa.min_driver_cuda(isa) == cuda
    assert ptx_isa.driver_max_ptx_isa(cuda) >= (isa if isinstance(isa, int) else ptx_isa.isa_number(isa))


def test_an_isa_below_the_arch_minimum_is_refused_in_one_line(tmp_path):
    """LLVM aborts the whole process on sm_90a below ISA 8.0: the choice is refused before any compile."""
    ptx_isa.check_isa_for_arch(78, 80)  # sm_80 takes ISA 7.0 and newer
    ptx_isa.check_isa_for_arch(None, 90)  # Triton's default
    with pytest.raises(DSparkTrtError, match=r"driver JIT-compiles at most 7.8; update the driver to CUDA >= 12.0"):
        ptx_isa.check_isa_for_arch(78, 90, driver_cap=78)
    with pytest.raises(DSparkTrtError, match=r"--ptx-isa 7.8 is below the 8.0 that sm_90a PTX needs"):
        ptx_isa.check_isa_for_arch(78, 90)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "dspark_trt.plugins.aot", "--out", str(tmp_path), "--n", "2", "--k",
                           "16", "--rank", "8", "--archs", "90", "--ptx-isa", "7.8"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == ["error: --ptx-isa 7.8 is below the 8.0 that sm_90a PTX needs; use "
                                                "--ptx-isa 8.0 or higher"]


def test_isa_choice_is_the_lowest_known_cap():
    assert ptx_isa.choose_ptx_isa(90, 94, None) == 90  # CPU export host: requested cap vs Triton's ptxas
    assert ptx_isa.choose_ptx_isa(90, 94, 87) == 87  # a CUDA 12.8 driver on the build host
    assert ptx_isa.choose_ptx_isa(None, 87, None) == 87
    assert ptx_isa.choose_ptx_isa(None, None, None) is None


@pytest.mark.parametrize("hw,cap,want", [("ampere_plus", 90, 80), ("ampere_plus", None, 80), ("none", 90, 90),
                                         ("same_compute_capability", 90, 90), ("none", 80, 80), ("none", 89, 80),
                                         ("none", 100, 80), ("none", None, 80)])
def test_plugin_arch(hw, cap, want):
    assert aot.plugin_arch(hw, cap) == want


def test_sm90a_ptx_runs_only_on_capability_9_0():
    assert aot.ptx_runs_on("sm_90a", 90)
    assert not aot.ptx_runs_on("sm_90a", 100) and not aot.ptx_runs_on("sm_90a", 89)
    assert aot.ptx_runs_on("sm_80", 80) and aot.ptx_runs_on("sm_80", 90) and aot.ptx_runs_on("sm_80", 120)
    assert not aot.ptx_runs_on("sm_80", 75)
    with pytest.raises(DSparkTrtError):
        aot.ptx_runs_on("compute_90", 90)


def test_shared_memory_above_48_kib_is_refused():
    aot.check_shared_mem(48 * 1024)
    with pytest.raises(DSparkTrtError, match="more than the 49152"):
        aot.check_shared_mem(48 * 1024 + 1)


def test_launch_params_and_extra_args():
    assert aot.launch_params(8, 128) == {"grid": ["B", 1, 1], "block": [256, 1, 1], "shared_mem": 128}
    assert aot.launch_params(4, 0, batch=5)["grid"] == [5, 1, 1]
    assert aot.extra_arg_values({"markov_w1": (151936, 256), "markov_w2": (32000, 256)}) == [151936, 32000]


@pytest.mark.parametrize("change, message", [
    (dict(topk=3841), "3840"),
    (dict(rank=0), "rank"),
    (dict(num_draft_tokens=0), "num_draft_tokens"),
    (dict(logits_dtype="float64"), "logits_dtype"),
    (dict(arch=75), "below 80"),
])
def test_spec_rejects_what_the_kernel_cannot_build(change, message):
    base = dict(num_draft_tokens=7, topk=512, rank=256, logit_scale=1.0)
    with pytest.raises(DSparkTrtError, match=message):
        aot.WalkKernelSpec(**{**base, **change})


def test_file_names_encode_every_build_input():
    a = aot.WalkKernelSpec(7, 512, 256, 1.0, "bfloat16", "bfloat16", 90)
    assert a.file_name == "dspark_topk_markov_walk.sm_90a.bf16-bf16.n7k512r256.ptx"
    assert aot.WalkKernelSpec(7, 512, 256, 1.0, "float32", "bfloat16", 80).file_name.startswith(
        "dspark_topk_markov_walk.sm_80.fp32-bf16.")


def test_ptx_text_helpers():
    ptx = ".version 9.0\n.target sm_90a\n.visible .entry f(\n\t.param .u64 a,\n\t.param .u32 b\n)\n{ ret; }\n"
    assert aot.ptx_isa_version(ptx) == "9.0"
    assert aot.ptx_param_count(ptx, "f") == 2
    with pytest.raises(DSparkTrtError):
        aot.ptx_param_count(ptx, "g")
    with pytest.raises(DSparkTrtError):
        aot.ptx_isa_version("no version here")


# --------------------------------------------------------------------- the gated and RNN heads' kernels
@pytest.fixture(scope="module", params=["gated", "rnn"])
def head_build(request, tmp_path_factory):
    """A head kernel (--markov-head-type) into its own directory, fp32 logits and bf16 weights, sm_80 and sm_90a."""
    out = tmp_path_factory.mktemp(f"ptx-{request.param}")
    args = ["--n", "3", "--k", "16", "--rank", "40", "--logit-scale", "0.5", "--dtypes", "fp32-bf16",
            "--markov-head-type", request.param]
    if aot.find_ptxas():
        args.append("--validate")
    return request.param, out, build(out, *args)


def test_head_build_describes_the_head_op(head_build):
    from dspark_trt.plugins.contract import GATED_INPUTS, HEAD_OPS, RNN_INPUTS

    head, out, info = head_build
    op, inputs = HEAD_OPS[head]
    assert inputs == {"gated": GATED_INPUTS, "rnn": RNN_INPUTS}[head]
    assert (info["op"], info["plugin"], info["markov_head_type"]) == (op, f"dspark::{op}", head)
    assert info["kernel_name"] == f"dspark_topk_markov_walk_{head}" and "markov_topm" not in info
    assert json.loads((out / aot.description_file(0, head)).read_text()) == info
    assert not (out / aot.DESCRIPTION_FILE).exists()  # the vanilla op's description is not overwritten
    # r = 40: the whole rank padded to 64 in registers; mat-vec tiles of 64 × 64
    assert info["constexprs"] == {"N": 3, "K": 16, "R": 40, "BLOCK_K": 16, "BLOCK_R": 64, "BLOCK_M": 64,
                                  "LOGIT_SCALE": 0.5}
    assert [a["name"] for a in info["signature"]] == [c.name for c in inputs] + ["vocab", "draft_vocab"] + [
        c.name for c in OUTPUTS]
    types = {a["name"]: a["type"] for a in info["signature"]}
    weight, hidden = ("gate_w", "gate_hidden") if head == "gated" else ("joint_w", "joint_hidden")
    assert (types[weight], types[hidden], types["markov_w2"], types["cand_values"]) == ("*bf16", "*fp32", "*bf16",
                                                                                         "*fp32")
    assert {k["file"] for k in info["kernels"]} == {
        f"dspark_topk_markov_walk_{head}.{sm}.fp32-bf16.n3k16r40.ptx" for sm in ("sm_80", "sm_90a")}


def test_head_ptx_files_are_what_the_engine_needs(head_build):
    head, out, info = head_build
    n_inputs = 13 if head == "gated" else 14
    for k in info["kernels"]:
        ptx = (out / k["file"]).read_text()
        assert hashlib.sha256(ptx.encode()).hexdigest() == k["sha256"]
        assert re.search(rf"\.visible \.entry dspark_topk_markov_walk_{head}\(", ptx)
        assert re.search(rf"^\.target {k['arch']}\b", ptx, re.MULTILINE)
        # TensorRT's AOT parameters exactly: the inputs, 2 int32 extras, 3 outputs (scratch pointers stripped)
        assert k["params"] == n_inputs + 2 + len(OUTPUTS) and k["trailing_params"] == 0
        assert len(re.findall(r"\.param \.u32 ", ptx)) == 2
        assert len(re.findall(r"\.param \.u64 \.ptr", ptx)) == n_inputs + len(OUTPUTS)
        assert k["launch"]["grid"] == ["B", 1, 1] and k["launch"]["block"] == [k["num_warps"] * 32, 1, 1]
        assert 0 <= k["launch"]["shared_mem"] <= aot.MAX_STATIC_SHARED_MEM
        assert k["ptx_isa"] == "8.0" and k["min_driver_cuda"] == "12.0"  # every CUDA 12.x / 13.x driver JITs it
        if aot.find_ptxas():  # the CUDA toolkit's ptxas assembles the stripped PTX, as the driver's JIT would
            assert k["validated"]["spill_store_bytes"] == 0 and k["validated"]["registers"] > 0


def test_select_export_kernel_matches_the_head(head_build, small_build):
    head, out, info = head_build
    spec = aot.WalkKernelSpec(3, 16, 40, 0.5, "float32", "bfloat16", arch=90, markov_head_type=head)
    assert aot.select_export_kernel(info, out, spec)["name"] == f"dspark_topk_markov_walk_{head}"
    other = "rnn" if head == "gated" else "gated"
    with pytest.raises(DSparkTrtError, match=f"PTX is for {info['op']}, the graph's node is DSparkTopKMarkov"):
        aot.select_export_kernel(info, out, aot.WalkKernelSpec(3, 16, 40, 0.5, "float32", "bfloat16", arch=90,
                                                               markov_head_type=other))
    plain_out, plain_info = small_build
    with pytest.raises(DSparkTrtError, match=f"PTX is for DSparkTopKMarkov, the graph's node is {info['op']}"):
        aot.select_export_kernel(plain_info, plain_out, spec)


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_head_kernel_arguments_follow_the_aot_calling_convention(head):
    from dspark_trt.plugins.head_kernels import head_kernel

    spec = aot.WalkKernelSpec(7, 512, 256, 1.0, "float16", "bfloat16", 90, markov_head_type=head)
    sig = aot.kernel_signature(spec)
    constexprs = aot.kernel_constexprs(spec)
    assert [n for n, _ in sig] + list(constexprs) == list(head_kernel(head).arg_names)
    assert spec.op_name == f"DSparkTopKMarkov{'Gated' if head == 'gated' else 'RNN'}"
    assert spec.plugin_id == f"dspark::{spec.op_name}" and spec.head and not spec.union
    assert spec.file_name == f"dspark_topk_markov_walk_{head}.sm_90a.fp16-bf16.n7k512r256.ptx"
    types = dict(sig)
    if head == "rnn":
        assert (types["joint_hidden"], types["joint_w"], types["rnn_state0"]) == ("*fp32", "*bf16", "*fp32")
    else:
        assert (types["gate_hidden"], types["gate_w"]) == ("*fp32", "*bf16")
    with pytest.raises(DSparkTrtError, match="vanilla Markov head only, not " + head):
        aot.WalkKernelSpec(7, 512, 256, 1.0, markov_topm=4, markov_head_type=head)
    with pytest.raises(DSparkTrtError, match="markov_head_type 'lstm' is not one of vanilla, gated, rnn"):
        aot.WalkKernelSpec(7, 512, 256, 1.0, markov_head_type="lstm")


@pytest.mark.slow
@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_head_kernels_at_the_largest_shapes_build_without_spills(tmp_path, head):
    """k = 3840, r = 1024 (the whole rank in registers, the smallest tiles): no spills, shared memory within the
    AOT launch's 48 KiB."""
    args = ["--n", "7", "--k", "3840", "--rank", "1024", "--archs", "80,90", "--markov-head-type", head]
    info = build(tmp_path, *args, *(["--validate"] if aot.find_ptxas() else []))
    for k in info["kernels"]:
        assert k["launch"]["shared_mem"] <= aot.MAX_STATIC_SHARED_MEM
        if aot.find_ptxas():
            assert k["validated"]["spill_store_bytes"] == 0
