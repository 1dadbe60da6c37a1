"""NVIDIA's math libraries, unmodified, on Orion's sim backend (issue #9): cuBLAS (GEMM in three
precisions at five sizes, strided-batched GEMM, dot), cuBLASLt, cuFFT, cuSPARSE, cuSOLVER, cuRAND
and cuDNN. Each program (tests/cuda/<name>.cu) checks its library's status codes and byte-exact
round trips of its inputs. Most of their kernels are SASS only, which the sim backend cannot
execute: by default such launches fail (test_compute.py checks cuBLAS's), so these tests run at
the API level (`oriond_api_level`: --sim-unexecutable skip, the kernels are accepted and NOT run)
and computed values are checked only on a GPU. cuFFT's kernels carry PTX the sim runs: its test
uses the default oriond.

Each library call is preceded by a marker launch (tests/cuda/lib_marks.h), so the sim launch log
shows which kernels each call launched: every call must have launched at least one. With
ORION_COVERAGE=1 the private driver tables the libraries used are listed, and none may be refused."""
import re

import pytest

from conftest import assert_passed, checks, launched

MARKER = "_Z10orion_markj"


def launches_by_mark(stdout, launch_log):
    """{mark name: [kernel names launched between that mark and the next]} from the program's
    "MARK <id> <name>" lines and the sim launch log."""
    names = {int(i): n for i, n in re.findall(r"^MARK (\d+) (\S+)$", stdout, re.M)}
    assert names, "program printed no MARK lines"
    out, current = {}, None
    for record in launched(launch_log):
        kernel, params = record["kernel"], record["params"]
        if kernel == MARKER:
            mark_id = int.from_bytes(bytes.fromhex(params[:8]), "little")
            current = names.get(mark_id)
            if current is not None:
                out.setdefault(current, [])
            continue
        if current is not None:
            out[current].append(kernel)
    missing = sorted(set(names.values()) - set(out))
    assert not missing, f"markers missing from the launch log: {missing}"
    return out


def assert_library_run(oriond, program, *args, expect_checks, kernel_re=None):
    r = oriond.run(program, *args, ORION_GMEM=2048, ORION_COVERAGE=1, timeout=300)
    assert_passed(r, expect_checks=expect_checks)
    # Inputs crossed Orion and came back byte for byte.
    intact = [k for k in checks(r.stdout) if k.endswith("_intact")]
    assert intact and all(checks(r.stdout)[k] == "ok" for k in intact), r.stdout[-3000:]
    # Every library call launched kernels of its own.
    by_mark = launches_by_mark(r.stdout, oriond.launches())
    empty = [m for m, ks in by_mark.items() if not ks]
    assert not empty, f"calls that launched no kernel: {empty}\n{by_mark}"
    if kernel_re:
        for m, ks in by_mark.items():
            assert any(re.search(kernel_re, k) for k in ks), f"{m}: no kernel matching {kernel_re}: {ks}"
    # The private tables the library used are listed as served, and nothing was refused.
    assert re.search(r"^orion-coverage: real table 6bd5fb6c \(cudart-interface\) slot 2 \d+$", r.stderr, re.M), r.stderr
    assert re.search(r"orion-coverage: \d+ entry points called, \d+ real, 0 not supported, \d declined", r.stderr), (
        r.stderr[-4000:])
    assert "is not supported by Orion" not in r.stderr, r.stderr[-4000:]
    return r, by_mark


def test_cublas_gemm_all_sizes_batched_and_dot_api_level(oriond_api_level):
    oriond = oriond_api_level  # --sim-unexecutable skip: SASS-only kernels are accepted and not run
    r, by_mark = assert_library_run(oriond, "blas", expect_checks=60)
    for t in "sdh":
        for n in (1, 7, 64, 256, 1024):
            assert checks(r.stdout)[f"{t}gemm_{n}"] == "ok"
            assert by_mark[f"{t}gemm_{n}"], f"{t}gemm_{n} launched nothing"
    assert checks(r.stdout)["sgemm_strided_batched"] == "ok" and checks(r.stdout)["sdot"] == "ok"
    assert any(re.search(r"gemm", k, re.I) for k in by_mark["sgemm_1024"]), by_mark["sgemm_1024"]
    assert any(re.search(r"dot", k, re.I) for k in by_mark["sdot"]), by_mark["sdot"]
    # cuBLAS resolved its stream through the tools-context table (slots 51 and 39) for real.
    for slot in (39, 51):
        assert re.search(rf"^orion-coverage: real table 21318c60 \(tools-context\) slot {slot} \d+$", r.stderr, re.M)


@pytest.mark.parametrize("case", ["sgemm_256", "sdot"])
def test_cublas_single_call_api_level(oriond_api_level, case):
    oriond = oriond_api_level  # --sim-unexecutable skip: SASS-only kernels are accepted and not run
    # The two calls that went through the missing tools-context slots, alone in a process.
    assert_library_run(oriond, "blas", case, expect_checks=4)


def test_cublaslt_matmul_api_level(oriond_api_level):
    oriond = oriond_api_level  # --sim-unexecutable skip: SASS-only kernels are accepted and not run
    assert_library_run(oriond, "blaslt", expect_checks=10, kernel_re=r"gemm|Gemm|xmma|cutlass")


def test_cufft_c2c_and_r2c(oriond):
    r, by_mark = assert_library_run(oriond, "fft", expect_checks=8)
    assert set(by_mark) == {"c2c_exec", "r2c_exec"}
    # cuFFT found its kernel through the tools-module table (a module's functions, iterated).
    assert re.search(r"^orion-coverage: real table 6e163fbe \(tools-module\) slot 7 \d+$", r.stderr, re.M), r.stderr


def test_cusparse_spmv_api_level(oriond_api_level):
    oriond = oriond_api_level  # --sim-unexecutable skip: SASS-only kernels are accepted and not run
    assert_library_run(oriond, "sparse", expect_checks=10, kernel_re=r"csrmv|spmv|SpMV")


def test_cusolver_lu_factor_and_solve_api_level(oriond_api_level):
    oriond = oriond_api_level  # --sim-unexecutable skip: SASS-only kernels are accepted and not run
    r, by_mark = assert_library_run(oriond, "solver", expect_checks=6)
    assert any("getrf" in k for k in by_mark["getrf"]), by_mark["getrf"]
    assert any("getrs" in k or "trsm" in k or "laswp" in k for k in by_mark["getrs"]), by_mark["getrs"]


def test_curand_generate_api_level(oriond_api_level):
    oriond = oriond_api_level  # --sim-unexecutable skip: SASS-only kernels are accepted and not run
    assert_library_run(oriond, "rand", expect_checks=5, kernel_re=r"[Pp]hilox")


def test_cudnn_activation_api_level(oriond_api_level):
    oriond = oriond_api_level  # --sim-unexecutable skip: SASS-only kernels are accepted and not run
    assert_library_run(oriond, "dnn", expect_checks=7)
