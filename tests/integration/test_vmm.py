"""Virtual memory management and stream-ordered memory pools (issue #9: PyTorch's expandable
segments and cudaMallocAsync backend; issue #13: the families programs check and skip)."""
import re

from conftest import assert_passed, checks


def test_vmm_mappings_pools_and_quota(oriond):
    # tests/cuda/vmm.cu: reserve, create, map side by side, set access, copies and a computed
    # kernel across mappings, aliasing, retain/release, refusals, quota; pools with counters.
    r = oriond.run("vmm", ORION_GMEM=256)
    assert_passed(r, expect_checks=35)
    c = checks(r.stdout)
    assert c["kernel_across_mappings"] == "ok" and c["create_past_quota_refused"] == "ok"
    assert c["reserve_at_free_fixed_address"] == "ok"  # the sim honours a free fixed address
    # The quota refusal names cuMemCreate in Orion's words; nothing else went wrong.
    assert re.search(r"op=MemCreate cuMemCreate\(\): memory \d+ MB exceeds <vgpu \d+, pgpu \d+> quota \(256 MB\)",
                     oriond.session_logs()), oriond.session_logs()[-2000:]
    assert "protocol violation" not in oriond.session_logs()
    assert "cuMemExportToShareableHandle is not supported by Orion" in r.stderr
