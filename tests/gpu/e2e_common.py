"""Helpers shared by the Python checks of scripts/gpu-e2e.sh."""


def loaded_libcuda():
    """The libcuda.so this process loaded (from /proc/self/maps), or "none": tells a native run from
    one through Orion."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                i = line.find("/")
                if i >= 0 and "/libcuda.so" in line[i:]:
                    return line[i:].strip()
    except OSError:
        pass
    return "none"
