"""What the tutorials share: the environment banner, width-aware Chinese tables, a free port.

    from vramlab.display import banner, pad, mib
    ON_GPU = banner()          # prints Python / PyTorch / vramlab / backend; True on a CUDA machine

Tutorials import these instead of defining their own (tests/test_tutorials.py checks).
"""
from __future__ import annotations

import datetime
import platform

from .units import MiB


def banner(extra: str = "") -> bool:
    """Print the run's provenance (the style guide's rule for numbers) and return whether a GPU is used."""
    import torch

    from . import __version__

    on_gpu = torch.cuda.is_available()
    backend = torch.cuda.get_device_name(0) if on_gpu else "CPU 上的模拟设备（vramlab SimDevice）"
    print("Python      ", platform.python_version())
    print("PyTorch     ", torch.__version__)
    print("vramlab     ", __version__)
    print("后端        ", backend + (f"，{extra}" if extra else ""))
    print("日期        ", datetime.date.today().isoformat())
    return on_gpu


def mib(nbytes: float) -> float:
    return nbytes / MiB


def width(text: str) -> int:
    """Display width: a CJK character takes two columns."""
    return sum(2 if ord(ch) > 0x2E80 else 1 for ch in text)


def pad(text, cols: int) -> str:
    """Left-align `text` (any value, as str) in `cols` display columns, so mixed Chinese/English
    tables line up."""
    text = str(text)
    return text + " " * max(cols - width(text), 0)


def use_cjk_font() -> bool:
    """Make matplotlib draw Chinese with the first CJK font installed; False when there is none
    (then label figures in English rather than draw boxes)."""
    import matplotlib
    from matplotlib import font_manager

    wanted = ("Noto Sans CJK SC", "Noto Sans CJK", "Source Han Sans", "WenQuanYi", "SimHei", "Microsoft YaHei",
              "PingFang")
    names = [f.name for f in font_manager.fontManager.ttflist if any(k in f.name for k in wanted)]
    if names:
        matplotlib.rcParams["font.sans-serif"] = [names[0]] + matplotlib.rcParams["font.sans-serif"]
        matplotlib.rcParams["axes.unicode_minus"] = False
    return bool(names)


def free_port() -> int:
    """A free TCP port on localhost, for a tutorial's process group (MASTER_PORT)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
