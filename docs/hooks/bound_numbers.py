"""MkDocs hook: numbers and output blocks on a page come from the tutorials' executed notebooks.

    峰值是 [[ch01.peak_b8_mib]] MiB。            the value the ch01 tutorial published under that name
    <!-- nb-output ch01 tag=breakdown -->        a ```text block: what the cell tagged "breakdown" printed
    <!-- nb-output ch01 tag=breakdown lines=2-5 -->   (only lines 2-5, 1-based)
    <!-- nb-output ch01 tag=breakdown grep=^合计 -->   (only the lines matching the regex)

A tutorial publishes with `from vramlab.tutorials import publish; publish("name", value, fmt="{:.0f}")`
and tags a cell with `# %% tags=["breakdown"]` (jupytext); `vramlab tutorials run --only chNN` puts
both into docs/chapters/chNN-tutorial.ipynb, whose freshness `vramlab tutorials check` guards. So a
re-run updates the page without a hand edit, and a name or tag the notebook lacks fails the build
(the message names the page). Inside code, fenced or inline, nothing is replaced (a page may
show the syntax there).

The logic lives in vramlab/bound_numbers.py, shared with the check that counts figures and output
lines a chapter shows without taking them from its notebook (tests/test_bound_numbers.py).
"""
from __future__ import annotations

from mkdocs.exceptions import PluginError


def on_page_markdown(markdown: str, page, config, files) -> str:
    if "[[" not in markdown and "nb-output" not in markdown:
        return markdown
    from vramlab.bound_numbers import BindingError, expand

    try:
        return expand(markdown, page.file.src_uri, config["docs_dir"])
    except BindingError as e:
        raise PluginError(str(e)) from None
