"""JIT linking (issue #13): cuLinkCreate / cuLinkAddFile / cuLinkAddData / cuLinkComplete link PTX
in the client (ptx/src/link.cpp); the linked module loads like any PTX image and its kernel, which
calls a function of another module and reads its variable, is computed on the sim executor.
Undefined references fail cuLinkComplete with the symbol named; SASS inputs are refused loudly."""
from conftest import TEST_BIN, assert_passed, checks, launch_outcomes


def test_jit_link_of_separately_compiled_modules(oriond):
    r = oriond.run("jit_link", TEST_BIN / "link_a.ptx", TEST_BIN / "link_b.fatbin", ORION_GMEM=256)
    assert_passed(r, expect_checks=6)
    c = checks(r.stdout)
    assert c["linked_kernel_computes"] == "ok" and c["undefined_reference_fails"] == "ok"
    applied = [e for k, e in launch_outcomes(oriond.launches()) if k == "apply"]
    assert applied and set(applied) == {"ran"}, oriond.launches()[-5:]
    assert "linking SASS inputs (cubins and objects; Orion links PTX) is not supported by Orion" in r.stderr
    assert "undefined reference to '_Z5scalei'" in r.stderr
    assert "protocol violation" not in oriond.session_logs()
