"""MkDocs hook: segment each distinct Chinese run once per build.

Material's search plugin cuts every run of Han characters of every section with `jieba.cut`
(material/plugins/search/plugin.py, `_segment_chinese`): tens of thousands of calls per build, most
of them on runs seen before (标题、术语、“模拟设备”…), and the largest part of the build's time.
jieba's cut is a pure function of its input and the loaded dictionaries, so remembering its words
per input string changes nothing in the index. The memory is emptied at each build's config
(`mkdocs serve` reloads the user dictionary then).
"""
from __future__ import annotations

import functools

try:
    import jieba
except ImportError:                      # no jieba: Material does not segment, nothing to speed up
    jieba = None


@functools.lru_cache(maxsize=None)
def _words(cut, sentence, cut_all, HMM, use_paddle):
    return tuple(cut(sentence, cut_all=cut_all, HMM=HMM, use_paddle=use_paddle))


def on_config(config):
    _words.cache_clear()
    if jieba is not None and not getattr(jieba.cut, "_vramlab_memo", False):
        cut = jieba.cut

        def memo_cut(sentence, cut_all=False, HMM=True, use_paddle=False):
            return iter(_words(cut, sentence, cut_all, HMM, use_paddle))

        memo_cut._vramlab_memo = True
        jieba.cut = memo_cut
    return config
