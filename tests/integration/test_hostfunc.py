"""Host functions in stream order (issue #13): cudaLaunchHostFunc and cudaStreamAddCallback run in
the client process, on Orion's host-function thread, after the work before them on their stream;
work after them waits until they return (guest/src/hostfunc.cpp)."""
from conftest import assert_passed, checks, outcomes_of


def test_host_functions_follow_stream_order(oriond):
    r = oriond.run("hostfunc", ORION_GMEM=256)
    assert_passed(r, expect_checks=12)
    c = checks(r.stdout)
    assert c["host_func_sees_prior_copy"] == "ok" and c["later_work_waits_for_host_func"] == "ok"
    assert c["captured_host_nodes_run_in_order"] == "ok"
    assert "a stream callback (cuStreamAddCallback) in stream capture is not supported by Orion" in r.stderr
    # The kernels around the functions ran on oriond, and nothing was refused as a violation.
    added = outcomes_of(oriond.launches(), "_Z3addPiii")
    assert added and set(added) == {"ran"}, oriond.launches()[-5:]
    assert "protocol violation" not in oriond.session_logs()
