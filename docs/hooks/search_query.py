"""MkDocs hook: the browser cuts search queries into the same words as the index.

The index is cut with jieba and docs/assets/jieba_user_dict.txt at build time (梯度检查点 is one
token). Material's search worker cuts a query's Chinese again, greedily against the index and
never including the run's last character, so 梯度检查点 was searched as "梯度* 检查*".

docs/assets/js/search-query.js fixes that inside the worker (see its header). This hook builds
the worker the pages use: that file, then Material's own worker, then a line handing it lunr, as
assets/javascripts/workers/search-segmented.<hash>.js (it must stay in workers/: Material finds
its lunr language files next to it when it runs in the iframe shim of the offline build), and
points every page's __config at it instead of Material's. The source file itself is not
published. Anything it cannot do (no Material worker, a page whose config does not name it)
is a warning, so that `mkdocs build --strict` fails rather than ship Material's cutting.

Two more things for ranking, both here because both concern what a query finds:
  - the glossary (docs/terms.md) gives the worker its English names -> Chinese terms, so that
    "KV cache" also finds 键值缓存 (`synonyms` below; the worker uses a term only when it is a
    word of the index);
  - tutorial notebooks get a lunr document boost below 1 (TUTORIAL_BOOST): on an equal match the
    chapter comes first, its tutorial next.
Titles and headings outweigh body text through Material's field boosts (mkdocs.yml, `search:
fields`). tests/test_search_browser.py is the benchmark for all of it.
"""
from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re

from mkdocs.plugins import event_priority

log = logging.getLogger("mkdocs.hooks.search_query")

SOURCE = "assets/js/search-query.js"
TERMS = "terms.md"          # the glossary: English names of the course's terms
# A tutorial notebook's sections weigh this much against a chapter's (lunr document boost): on an
# equal match the chapter that explains a term comes first, its tutorial right after it.
TUTORIAL_BOOST = 0.8
WORKERS = "assets/javascripts/workers"
_MATERIAL = re.compile(r"search\.[0-9a-f]+\.min\.js")

_material_name: str | None = None     # Material's worker, e.g. search.a7633da7.min.js
_name: str | None = None              # ours, e.g. search-segmented.0123abcd.js
_script: str | None = None


def synonyms(terms_md: str, separator: str) -> dict[str, list[str]]:
    """English names from the glossary's tables (docs/terms.md: | 中文 | English | 说明 |) -> their
    Chinese terms. "a; b" are two names; a parenthesis at the end is an abbreviation when it starts
    like the name ("out of memory (OOM)", "key-value cache (KV cache)", not "channel (NCCL)"), one
    inside is dropped ("Kullback-Leibler (KL) divergence"). Keys are the name's words, lower case,
    split like the index's text; names with "/" are left out (ambiguous: "online / offline ...")."""
    sep = re.compile(separator)
    table: dict[str, list[str]] = {}

    def key(name: str) -> str:
        return " ".join(w for w in sep.split(name.lower()) if w)

    for line in terms_md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not re.search(r"[\u4e00-\u9fff]", cells[0]) or cells[0] == "中文":
            continue
        chinese = [c.strip() for c in cells[0].split("/") if c.strip()]
        names = []
        for part in cells[1].replace("`", "").split(";"):
            part = part.strip()
            end = re.fullmatch(r"(.*?)\s*\(([^()]*)\)", part)
            if end and end.group(1) and end.group(2)[:1].lower() == end.group(1)[:1].lower():
                names += [end.group(1)] + [a for a in re.split(r"\s*/\s*", end.group(2))]
                continue
            part = re.sub(r"\s*\([^()]*\)\s*", " ", part).strip()
            if "/" not in part:
                names.append(part)
        for name in names:
            k = key(name)
            if k:
                table.setdefault(k, [])
                table[k] += [c for c in chinese if c not in table[k]]
    return table


def on_config(config):
    global _material_name, _name, _script
    _material_name = _name = _script = None
    search = config.plugins.get("material/search")
    if search is None:
        return config
    found = sorted({p for d in config.theme.dirs for p in glob.glob(os.path.join(d, WORKERS, "search.*.min.js"))
                    if _MATERIAL.fullmatch(os.path.basename(p))})
    source = os.path.join(config.docs_dir, SOURCE)
    if len(found) != 1 or not os.path.isfile(source):
        log.warning("search_query: expected one Material search worker and %s, found %s", SOURCE, found)
        return config
    with open(found[0], encoding="utf-8") as f:
        material = f.read()
    with open(source, encoding="utf-8") as f:
        ours = f.read()
    material = re.sub(r"\n//# sourceMappingURL=\S+\s*$", "\n", material)     # its map does not fit here
    terms = os.path.join(config.docs_dir, TERMS)
    table = {}
    if os.path.isfile(terms):           # a site without the glossary (a test's two-page site): none
        with open(terms, encoding="utf-8") as f:
            table = synonyms(f.read(), search.config.separator)
        if not table:
            log.warning("search_query: no English names found in the tables of %s", TERMS)
    prelude = "var vramlabSynonyms = " + json.dumps(table, sort_keys=True) + ";\n"
    _script = f"{prelude}{ours}\n;{material}\n;vramlabSearch.patchLunr(self.lunr);\n"
    _material_name = os.path.basename(found[0])
    _name = f"search-segmented.{hashlib.sha256(_script.encode()).hexdigest()[:8]}.js"
    return config


def on_files(files, config):
    source = files.get_file_from_path(SOURCE)
    if source is not None:
        files.remove(source)        # built into the worker, never loaded on its own
    return files


@event_priority(50)          # before the search plugin indexes the page (priority 0)
def on_page_context(context, page, config, nav):
    if page.file.src_uri.endswith(".ipynb"):
        search = page.meta.setdefault("search", {})
        if isinstance(search, dict):
            search.setdefault("boost", TUTORIAL_BOOST)
    return context


def _point_at_ours(output: str, where: str) -> str:
    if _name is None or '<script id="__config"' not in output:
        return output
    old = f'{WORKERS}/{_material_name}"'
    if output.count(old) != 1:
        log.warning("search_query: %s does not name Material's search worker %s once", where, _material_name)
        return output
    return output.replace(old, f'{WORKERS}/{_name}"')


def on_post_page(output, page, config):
    return _point_at_ours(output, page.file.src_uri)


def on_post_template(output, template_name, config):     # 404.html is a template, not a page
    return _point_at_ours(output, template_name)


def on_post_build(config):
    if _script is None:
        return
    path = os.path.join(config.site_dir, WORKERS, _name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(_script)
