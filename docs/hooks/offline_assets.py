"""MkDocs hook: keep notebook pages free of CDN requests.

mkdocs-jupyter renders each tutorial notebook with nbconvert's "lab" template, which adds
  * <script src="https://cdnjs.cloudflare.com/.../mathjax/...">  plus a text/x-mathjax-config block,
  * a <script type="module"> that imports mermaid from cdnjs when a page has a mermaid diagram,
  * optionally require.js from a CDN (switched off with include_requirejs: false).
The course site renders math with the vendored KaTeX (assets/js/katex-init.js also scans the
notebook cells), so these blocks are removed from every page that came from an .ipynb file.
Any other <script src="http..."> in a notebook page is removed too, and reported as a warning
so that `mkdocs build --strict` fails and someone looks at it.

It also resolves links to Markdown pages inside notebooks (`[第 1 章](ch01.md)`): MkDocs rewrites
such links in .md pages only, so a notebook would otherwise link to a file that is not published.
"""
from __future__ import annotations

import logging
import posixpath
import re

log = logging.getLogger("mkdocs.hooks.offline_assets")

_MATHJAX_CONFIG = re.compile(r'<script type="text/x-mathjax-config">.*?</script>', re.S)
# with custom_mathjax_url unset, nbconvert writes an empty <script src=""> plus comments
_EMPTY_SCRIPT = re.compile(r'<script src="\s*">\s*</script>')
_MATHJAX_COMMENTS = re.compile(r'<!--\s*(?:Load mathjax|MathJax configuration|End of mathjax configuration)\s*-->', re.I)
_MODULE_WITH_CDN = re.compile(r'<script type="module">(?:(?!</script>).)*?https?://(?:(?!</script>).)*?</script>', re.S)
_EXTERNAL_SCRIPT = re.compile(r'<script\b[^>]*\bsrc="(https?://[^"]*)"[^>]*>\s*</script>', re.S)
_MD_LINK = re.compile(r'href="([^":#?"]+\.md)(#[^"]*)?"')
_files = None
_KNOWN_CDN = ("cdnjs.cloudflare.com/ajax/libs/mathjax/", "cdnjs.cloudflare.com/ajax/libs/require.js/")


def on_files(files, config):
    global _files
    _files = files
    return files


def _resolve_md_links(output: str, page) -> str:
    base = posixpath.dirname(page.file.src_uri)

    def resolve(m: re.Match) -> str:
        target = _files.get_file_from_path(posixpath.normpath(posixpath.join(base, m.group(1))))
        if target is None:
            return m.group(0)
        return f'href="{target.url_relative_to(page.file)}{m.group(2) or ""}"'
    return _MD_LINK.sub(resolve, output)


def on_post_page(output: str, page, config) -> str:
    if not page.file.src_uri.endswith(".ipynb"):
        return output
    output = _resolve_md_links(output, page)
    output = _MATHJAX_CONFIG.sub("", output)
    output = _MODULE_WITH_CDN.sub("", output)
    output = _EMPTY_SCRIPT.sub("", output)
    output = _MATHJAX_COMMENTS.sub("", output)

    def drop(match: re.Match) -> str:
        url = match.group(1)
        if not url.startswith(tuple("https://" + c for c in _KNOWN_CDN)):
            log.warning("removed an unexpected external script from %s: %s", page.file.src_uri, url)
        return ""

    return _EXTERNAL_SCRIPT.sub(drop, output)
