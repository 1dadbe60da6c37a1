"""CUDA graphs (issue #13; PyTorch's torch.cuda.graph, issue #9): stream capture, explicit
construction, instantiate, update and launch. Graph nodes are the frames their work sends, kept
in the client and sent at each launch (guest/src/graph.cpp); oriond validates each as any frame."""

from conftest import assert_passed, checks, outcomes_of


def test_capture_explicit_update_and_refusals(oriond):
    r = oriond.run("graphs", ORION_GMEM=256)
    assert_passed(r, expect_checks=35)
    # Results computed by kernels that ran from graph launches (the PTX executor): checked by value.
    c = checks(r.stdout)
    for name in ("launch3_x", "launch3_z", "launch3_w", "updated_graph_adds_10", "explicit_child_copy",
                 "exec_kernel_params", "add_node_memset_then_kernel", "add_node_mem_alloc",
                 "add_node_semaphore_signal_refused",
                 "host_copies_captured", "captured_host_copies_per_launch", "explicit_host_copy_nodes",
                 "host_copy_node_out_of_bounds_refused"):
        assert c[name] == "ok", name
    # Every kernel of a graph launch reached oriond as an ordinary launch and ran.
    ran = outcomes_of(oriond.launches(), "_Z3addPiii")
    assert len(ran) >= 3 * 2 + 2 + 2 and set(ran) == {"ran"}, ran
    # The refusals are named, once each.
    assert "a synchronizing call is not permitted while a stream is captured (CUDA)" in r.stderr
    assert "protocol violation" not in oriond.session_logs()


def test_graph_memory_nodes(oriond):
    # Issue #20: memory-allocation and free nodes (explicit and captured), their fixed addresses,
    # the relaunch rules, CUDA's restrictions on such graphs and the quota charge (tests/cuda/graph_mem.cu).
    r = oriond.run("graph_mem", ORION_GMEM=256)
    assert_passed(r, expect_checks=25)
    c = checks(r.stdout)
    for name in ("alloc_memset_kernel_copy_free_three_launches", "allocation_readable_after_the_launch",
                 "same_address_next_launch", "auto_free_on_launch_relaunches", "captured_memory_nodes_two_launches",
                 "alloc_node_is_charged_to_the_quota", "memory_back_when_no_graph_holds_it",
                 "relaunch_before_the_free_refused", "second_instantiation_refused"):
        assert c[name] == "ok", name
    assert "protocol violation" not in oriond.session_logs()
