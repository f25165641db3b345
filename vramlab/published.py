"""publish(name, value): a tutorial hands one of its results, by name, to its chapter page.

    from vramlab.tutorials import publish
    publish("peak_b8_mib", peak / MiB, fmt="{:.0f}")

In the executed notebook (docs/chapters/chNN-tutorial.ipynb) this leaves one display_data output
whose only data is {"application/vnd.vramlab.published+json": {"name": ..., "value": "7924"}}:
JupyterLab and the site show nothing for it (no renderer for that type; the site's notebook
plugin drops outputs tagged "vramlab-published"). The chapter page writes `[[chNN.peak_b8_mib]]`
and the build puts "7924" there (docs/hooks/bound_numbers.py). The value travels inside the
notebook, so `vramlab tutorials check` (the notebook is not stale) covers it like any output.

This module is in every publishing tutorial's import closure (its hash makes their notebooks
stale when it changes): keep it small and free of other vramlab imports.
"""
from __future__ import annotations

import re

MIME = "application/vnd.vramlab.published+json"
TAG = "vramlab-published"
NAME = re.compile(r"[a-z0-9_]+")


def formatted(value, fmt: str | None = None) -> str:
    """The text the page shows: fmt.format(value) when given, else str() (floats: pass a fmt)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError(f"publish 的值只能是 str、int 或 float，收到的是 {type(value).__name__}")
    text = fmt.format(value) if fmt is not None else str(value)
    if not text.strip() or "\n" in text:
        raise ValueError(f"publish 的值格式化后应是非空的一行文字，得到的是 {text!r}")
    return text


def publish(name: str, value, fmt: str | None = None) -> None:
    """Publish `value` (formatted with `fmt`, e.g. "{:.1f}") under `name` ([a-z0-9_]+, unique per
    chapter: the build refuses a notebook that publishes a name twice). Returns None, so a call on
    a cell's last line shows nothing either."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"publish 的名字只能由小写字母、数字和下划线组成：{name!r}")
    text = formatted(value, fmt)
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:          # run as a plain script: there is no notebook to carry the value
        return None
    if get_ipython() is None:
        return None
    display({MIME: {"name": name, "value": text}}, raw=True, metadata={"tags": [TAG]})
    return None
