"""Mapped pinned memory from cuMemHostRegister(CU_MEMHOSTREGISTER_DEVICEMAP) (issue #13): on a
shared-memory transport the registered pages move into the data window (guest/src/client.cpp,
MapIntoWindow), so kernels read and write the program's own buffer with no copy; over TCP it is
refused with cudaErrorNotSupported."""
from conftest import assert_passed, checks, launch_outcomes, outcomes_of, run_tcp


def test_registered_memory_is_mapped_for_kernels(oriond):
    r = oriond.run("mapped_register", ORION_GMEM=256)
    assert_passed(r, expect_checks=11)
    c = checks(r.stdout)
    assert c["kernel_writes_seen_by_host"] == "ok" and c["host_writes_seen_by_kernel"] == "ok"
    tripled = outcomes_of(oriond.launches(), "triple_plus")
    assert tripled and set(tripled) == {"ran"}, oriond.launches()[-5:]
    assert "protocol violation" not in oriond.session_logs()


def test_mapped_registration_is_refused_over_tcp(tcp_oriond):
    r = run_tcp(tcp_oriond, "mapped_register", "expect-refused", ORION_GMEM=256)
    assert_passed(r, expect_checks=3)
    assert "CU_MEMHOSTREGISTER_DEVICEMAP needs a shared-memory transport" in r.stderr


def test_pinned_memory_stands_for_its_device_address(oriond):
    """Unified addressing in copies and memsets (tests/cuda/pinned_as_device.cu): a cudaHostAlloc
    pointer passed to cuMemsetD32Async, cuMemcpyDtoDAsync, cuMemcpyDtoHAsync and cuMemcpyHtoD as a
    device address is its device mapping (what XLA's autotuner does with its redzone buffers), in
    stream order after a kernel; pageable memory and a range past the buffer are refused."""
    r = oriond.run("pinned_as_device", ORION_GMEM=256)
    assert_passed(r, expect_checks=6)
    c = checks(r.stdout)
    assert c["pinned_as_device_in_stream_order"] == "ok" and c["pinned_memset_wrote_host_memory"] == "ok"
    assert "protocol violation" not in oriond.session_logs()


def test_pinned_memory_is_no_device_address_over_tcp(tcp_oriond):
    r = run_tcp(tcp_oriond, "pinned_as_device", "expect-refused", ORION_GMEM=256)
    assert_passed(r, expect_checks=1)


def test_managed_memory_and_pinned_pointers_in_kernels(oriond):
    """Issue #20: unified addressing for pinned memory and managed memory on a shared-memory
    channel (tests/cuda/managed.cu). oriond's sim maps the channel's pinned heap at the program's
    own addresses, so a cudaHostAlloc or cudaHostRegister(Mapped) pointer is its own device
    pointer, in kernels too, and cudaMallocManaged memory (carved from that heap) is read and
    written by the host and by kernels with one pointer. Each value is computed by the executor and
    checked element by element."""
    r = oriond.run("managed", ORION_GMEM=256)
    assert_passed(r, expect_checks=14)
    c = checks(r.stdout)
    for name in ("managed_written_on_host_read_by_kernel", "managed_prefetched_in_stream_order",
                 "range_attributes_read_back_the_advice", "range_attributes_are_per_page",
                 "pinned_host_pointer_in_a_kernel", "registered_host_pointer_in_a_kernel",
                 "pinned_memory_reused_maps_afresh"):
        assert c[name] == "ok", name
    # managed.cu's six launches (one on a stream: deferred, then run) all ran. (The text log counted
    # the deferred one twice, as its launch line and its ran line.)
    outcomes = [e for _, e in launch_outcomes(oriond.launches())]
    assert outcomes == ["ran"] * 6, oriond.launches()
    assert "protocol violation" not in oriond.session_logs()


def test_managed_memory_is_refused_over_tcp(tcp_oriond):
    """Over TCP nothing is addressed by both ends: the device reports MANAGED_MEMORY,
    CAN_MAP_HOST_MEMORY and CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM as 0 and cudaMallocManaged
    fails with cudaErrorNotSupported."""
    r = run_tcp(tcp_oriond, "managed", "expect-unsupported", ORION_GMEM=256)
    assert_passed(r, expect_checks=2)
    assert "cuMemAllocManaged: managed memory needs a shared-memory channel" in r.stderr
