"""Byte sizes: parse "2 GiB", print MiB, round like the CUDA caching allocator."""
import re

KiB, MiB, GiB = 1024, 1024**2, 1024**3
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": KiB, "m": 1000**2, "mb": 1000**2, "mib": MiB,
          "g": 1000**3, "gb": 1000**3, "gib": GiB, "t": 1000**4, "tb": 1000**4, "tib": 1024**4}

# The caching allocator hands out blocks in multiples of 512 bytes (kMinBlockSize in
# c10/cuda/CUDACachingAllocator.cpp), so a 4-byte tensor occupies 512 bytes.
BLOCK_ROUND = 512


def round_block(nbytes: int) -> int:
    """Size the CUDA caching allocator charges for a request of `nbytes` (0 stays 0)."""
    if nbytes <= 0:
        return 0
    return -(-nbytes // BLOCK_ROUND) * BLOCK_ROUND


def parse_bytes(text) -> int:
    """'2 GiB' -> 2147483648. Numbers pass through. Raises ValueError with a Chinese message."""
    if isinstance(text, (int, float)):
        if text <= 0:
            raise ValueError(f"显存预算必须大于 0，收到 {text}")
        return int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"无法识别的显存大小：{text!r}（示例：'2 GiB'、'512MiB'、'24GB'）")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value <= 0:
        raise ValueError(f"显存预算必须大于 0，收到 {text!r}")
    return int(value)


def mib(nbytes: float) -> float:
    return nbytes / MiB


def fmt_bytes(nbytes: float) -> str:
    """Human figure in binary units, the way nvidia-smi and PyTorch print memory."""
    n = float(nbytes)
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
