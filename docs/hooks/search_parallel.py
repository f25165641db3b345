"""MkDocs hook: build the search index on the other cores while the pages render.

MkDocs builds pages one after the other on one core. For each page Material's search plugin then
parses the page's HTML into sections and segments their Chinese with jieba
(material/plugins/search/plugin.py, `SearchIndex.add_entry_from_context`): about 40% of the
build. Nothing of that feeds back into the page, so here the plugin's index hands each page's
content, table of contents, URL and metadata, as they are at that moment, to worker processes
forked after the plugin's config (jieba's dictionaries already loaded), and collects their
entries, in page order, just before the plugin writes search_index.json. The entries are
exactly those the plugin would have made.

Only for `mkdocs build` on Linux: `mkdocs serve` has server threads (no fork there) and rebuilds
one page at a time; elsewhere fork is not safe. There the plugin indexes as it always does.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
import types
from concurrent.futures import ProcessPoolExecutor

_command = None


def _entries(config: dict, page: types.SimpleNamespace) -> list[dict]:
    from material.plugins.search.plugin import SearchIndex

    index = SearchIndex(**config)
    index.add_entry_from_context(page)
    return index.entries


# MkDocs loads a hook from its path under the name "docs/hooks/....py", which pickle cannot import;
# the pool's workers find `_entries` (pickled by module name + name) under a plain name instead.
_MODULE = "vramlab_docs_search_parallel"
_entries.__module__ = _MODULE
sys.modules[_MODULE] = types.ModuleType(_MODULE)
sys.modules[_MODULE]._entries = _entries


def _parallel_index(base):
    """A SearchIndex whose pages are indexed by a process pool (a subclass made at config time,
    so that Material is imported only when its search plugin is in use)."""

    class ParallelSearchIndex(base):
        def __init__(self, workers: int, **config):
            super().__init__(**config)
            self.workers, self.pool, self.pending = workers, None, []

        def add_entry_from_context(self, page):
            if self.pool is None:
                self.pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"))
            snapshot = types.SimpleNamespace(meta=dict(page.meta), content=page.content, toc=page.toc,
                                             url=page.url, title=page.title)
            self.pending.append(self.pool.submit(_entries, self.config, snapshot))

        def generate_search_index(self, prev):
            try:
                for future in self.pending:
                    self.entries.extend(future.result())
            finally:
                self.pending = []
                if self.pool is not None:
                    self.pool.shutdown()
                    self.pool = None
            return super().generate_search_index(prev)

    return ParallelSearchIndex


def on_startup(command, dirty):
    global _command
    _command = command


def on_config(config):
    search = config.plugins.get("material/search")
    if (search is None or _command != "build" or sys.platform != "linux"
            or not getattr(search.config, "enabled", True) or not hasattr(search, "search_index")):
        return config
    workers = max(1, min(4, os.cpu_count() or 2))   # they also run after the last page, while mkdocs waits
    index = search.search_index
    search.search_index = _parallel_index(type(index))(workers, **index.config)
    return config
