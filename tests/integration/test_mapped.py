"""Mapped pinned memory from cuMemHostRegister(CU_MEMHOSTREGISTER_DEVICEMAP) (issue #13): on a
shared-memory transport the registered pages move into the data window (guest/src/client.cpp,
MapIntoWindow), so kernels read and write the program's own buffer with no copy; over TCP it is
refused with cudaErrorNotSupported."""
from conftest import assert_passed, checks
from test_tcp import run_tcp, tcp_oriond  # noqa: F401 (fixture)


def test_registered_memory_is_mapped_for_kernels(oriond):
    r = oriond.run("mapped_register", ORION_GMEM=256)
    assert_passed(r, expect_checks=11)
    c = checks(r.stdout)
    assert c["kernel_writes_seen_by_host"] == "ok" and c["host_writes_seen_by_kernel"] == "ok"
    assert any("triple_plus" in l and l.endswith((" exec=ran", " exec=deferred")) for l in oriond.launches())
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
