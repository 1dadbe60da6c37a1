"""CUDA graphs (issue #13; PyTorch's torch.cuda.graph, issue #9): stream capture, explicit
construction, instantiate, update and launch. Graph nodes are the frames their work sends, kept
in the client and sent at each launch (guest/src/graph.cpp); oriond validates each as any frame."""
import re

from conftest import assert_passed, checks


def test_capture_explicit_update_and_refusals(oriond):
    r = oriond.run("graphs", ORION_GMEM=256)
    assert_passed(r, expect_checks=34)
    # Results computed by kernels that ran from graph launches (the PTX executor): checked by value.
    c = checks(r.stdout)
    for name in ("launch3_x", "launch3_z", "launch3_w", "updated_graph_adds_10", "explicit_child_copy",
                 "exec_kernel_params", "add_node_memset_then_kernel", "add_node_mem_alloc_refused",
                 "host_copies_captured", "captured_host_copies_per_launch", "explicit_host_copy_nodes",
                 "host_copy_node_out_of_bounds_refused"):
        assert c[name] == "ok", name
    # Every kernel of a graph launch reached oriond as an ordinary launch and ran.
    ran = [l for l in oriond.launches() if " launch _Z3addPiii " in l]
    assert len(ran) >= 3 * 2 + 2 + 2 and all(l.endswith((" exec=ran", " exec=deferred")) for l in ran), ran[-4:]
    # The refusals are named, once each.
    assert "a synchronizing call is not permitted while a stream is captured (CUDA)" in r.stderr
    assert "protocol violation" not in oriond.session_logs()
