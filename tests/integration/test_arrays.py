"""CUDA arrays, textures and surfaces (issue #13): arrays live in oriond and count against the
vGPU's quota; copies to and from them (2D, 3D, array to array, device and host sides); texture
objects on arrays and linear memory sampled by kernels (point, linear, wrap, normalized reads) and
surfaces read and written by kernels, all computed by the sim backend's PTX executor; handles
checked by oriond (guest/src/api_array.cpp, host/src/session.cpp)."""

from conftest import assert_passed, checks


def test_arrays_textures_and_surfaces(oriond):
    r = oriond.run("arrays", ORION_GMEM=512)
    assert_passed(r, expect_checks=25)
    c = checks(r.stdout)
    for k in ("tex2d_point", "tex2d_linear", "tex2d_normalized_wrap", "tex1dfetch_linear", "tex3d_point",
              "surf2d_read_write", "array_over_quota_refused"):
        assert c[k] == "ok", (k, c[k])
    # The kernels ran in the sim backend's executor (not skipped), and nothing was a violation.
    ran = [l["kernel"] for l in oriond.launches() if l["exec"] == "ran"]
    for k in ("read2d", "fetch1d", "read3d", "surf_square"):
        assert any(k in name for name in ran), (k, oriond.launches()[-10:])
    assert "protocol violation" not in oriond.session_logs()
    # What Orion does not serve is refused, and says so.
    assert "a texture-gather, sparse or deferred-mapping CUDA array is not supported by Orion" in r.stderr



def test_tensor_maps_are_encoded_and_checked(oriond):
    """cuTensorMapEncodeTiled, cuTensorMapEncodeIm2col and cuTensorMapReplaceAddress
    (tests/cuda/tensor_map.cu): maps of device memory are encoded by oriond, an address replaced and
    put back gives the same map; each violated requirement of the driver's is refused with
    CUDA_ERROR_INVALID_VALUE, and oriond's session log names why."""
    r = oriond.run("tensor_map", ORION_GMEM=256)
    assert_passed(r, expect_checks=18)
    assert "is not supported" not in r.stderr
    c = checks(r.stdout)
    for name in ("im2col_encode_4d_nhwc", "replace_address_round_trips", "replace_address_host_refused"):
        assert c[name] == "ok", name
    log = oriond.session_logs()
    # (rank 0 and 6 are refused by the client before any frame.)
    for why in ("the global address must be 16-byte aligned", "each global stride must be",
                "each box dimension must be 1..256", "the box's inner dimension must fit the swizzle span",
                "NaN OOB fill needs a floating-point", "the global address is not this session's device memory"):
        assert f"cuTensorMapEncodeTiled refused: {why}" in log, why
    # Issue #20: cuTensorMapEncodeIm2col's own requirements (rank 2 is refused by the client).
    for why in ("each pixel-box corner offset must be within the rank's range",
                "channels per pixel must be 1..256", "pixels per column must be 1..1024",
                "the channels of a pixel must fit the swizzle span"):
        assert f"cuTensorMapEncodeIm2col refused: {why}" in log, why
    assert "cuTensorMapReplaceAddress refused" in log


def test_layered_and_cubemap_arrays(oriond):
    """Issue #20: layered (1D, 2D) and cubemap (plain and layered) arrays, filled by 3D copies and
    read by tex.a1d / tex.a2d / tex.cube / tex.acube and written by sust.b.a2d in the sim's executor,
    every value checked against a reference (tests/cuda/arrays_layered.cu)."""
    r = oriond.run("arrays_layered", ORION_GMEM=256)
    assert_passed(r, expect_checks=8)
    c = checks(r.stdout)
    for k in ("tex2d_layered_point", "tex2d_layered_linear", "surf2d_layered_read_write", "tex1d_layered_point",
              "tex_cubemap_faces", "tex_cubemap_layered"):
        assert c[k] == "ok", (k, c[k])
    ran = [l["kernel"] for l in oriond.launches() if l["exec"] == "ran"]
    for k in ("read2d_layered", "read1d_layered", "read_cube", "write2d_layered"):
        assert any(k in name for name in ran), (k, oriond.launches()[-10:])
    assert "protocol violation" not in oriond.session_logs()
