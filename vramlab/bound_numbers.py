"""Every measured number on a chapter page is its notebook's: references, includes and the check.

A tutorial publishes its results by name (vramlab/published.py); `vramlab tutorials run` leaves them
in docs/chapters/chNN-tutorial.ipynb as outputs, under the same freshness check as everything else
the notebook shows. A page (docs/**/*.md) then writes, and the build (docs/hooks/bound_numbers.py)
fills in:

    峰值是 [[ch01.peak_b8_mib]] MiB。                   -> the value published as "peak_b8_mib"
    <!-- nb-output ch01 tag=breakdown -->               -> ```text block: the text output of the
    <!-- nb-output ch01 tag=breakdown lines=1-4 -->        cell tagged "breakdown" (jupytext:
    <!-- nb-output ch01 tag=breakdown grep=^合计 -->        `# %% tags=["breakdown"]`), all of it,
                                                           lines A-B (1-based) or those matching
A name the notebook does not publish, an unknown tag, an empty selection or a malformed reference
fails the build with a message naming the page.

The check (`python -m vramlab.bound_numbers`, tests/test_bound_numbers.py) reads the pages'
Markdown source and counts, per chapter:

- quoted output lines: lines of a ```text / ```console block that no output of the chapter's
  notebook printed. A block that is not program output (a diagram, a template) says so on the
  line before: `<!-- not-output: 示意图 -->`.
- unbound figures: numbers with a measuring unit (MiB, GiB, GB, ms, s, %, ×, 倍, GB/s, …) or a
  loss ("损失 3.21") in prose that are none of: bound ([[…]]); inside math or code; in a sentence
  that cites (a footnote [^…], an external link, or a code span naming a source file:
  `c10/cuda/CUDACachingAllocator.cpp`, `scripts/probes/….py`, `vramlab/data/….md`); computed by hand (right after "=" or "≈",
  or in a clause that ends with "（算术…）", the style guide's marker, or inside a parenthesis
  that says 算术); listed in
  docs/hooks/unbound_figures.yml with a reason.

Not imported by tutorials (its changes make no notebook stale).
"""
from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .published import MIME

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CHAPTERS = DOCS / "chapters"
ALLOWLIST = DOCS / "hooks" / "unbound_figures.yml"

REF = re.compile(r"\[\[(ch\d\d)\.([a-z0-9_]+)\]\]")
REF_LIKE = re.compile(r"\[\[\s*ch\d[^\]\n]*\]\]?")           # anything the author meant as a reference
NB_OUTPUT = re.compile(r"^([ \t]*)<!--\s*nb-output\b(.*?)-->[ \t]*$")
NB_OUTPUT_ARGS = re.compile(r"\s*(ch\d\d)\s+tag=(\S+)(?:\s+lines=(\d+)(?:-(\d+))?)?(?:\s+grep=(.+?))?\s*$")
NOT_OUTPUT = re.compile(r"^\s*<!--\s*not-output:\s*\S.*-->\s*$")
FENCE = re.compile(r"^([ \t]*)(`{3,}|~{3,})\s*([\w+-]*)")
OUTPUT_LANGS = ("text", "console")


class BindingError(ValueError):
    """A reference or include that cannot be resolved (the build fails with this message)."""


# ---------------------------------------------------------------- notebooks

_cache: dict[str, tuple[int, dict]] = {}


def notebook_path(chapter: str, docs_dir: str | os.PathLike = DOCS) -> Path:
    return Path(docs_dir) / "chapters" / f"{chapter}-tutorial.ipynb"


def load(chapter: str, docs_dir: str | os.PathLike = DOCS) -> dict:
    """The chapter's executed notebook, parsed once per change."""
    path = notebook_path(chapter, docs_dir)
    try:
        mtime = path.stat().st_mtime_ns
    except FileNotFoundError:
        raise BindingError(f"docs/chapters/{path.name} 不存在（先运行 vramlab tutorials run --only {chapter}）") from None
    hit = _cache.get(str(path))
    if hit and hit[0] == mtime:
        return hit[1]
    nb = json.loads(path.read_text(encoding="utf-8"))
    _cache[str(path)] = (mtime, nb)
    return nb


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else (value or "")


def published(nb: dict, chapter: str = "") -> dict[str, str]:
    """name -> formatted value, from the notebook's publish() outputs; a name published twice fails."""
    values: dict[str, str] = {}
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            record = out.get("data", {}).get(MIME)
            if record is None:
                continue
            name = record.get("name", "")
            if name in values:
                raise BindingError(f"{chapter or '这份'}教程发布了两次 {name!r}：名字在一章里必须唯一")
            values[name] = str(record.get("value", ""))
    return values


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def cell_output(cell: dict) -> str:
    """What a code cell printed as text: stdout, stderr and the text/plain of its results, in order
    (publish() records and images left out), plus the message of an error."""
    parts = []
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "stream":
            parts.append(_text(out.get("text")))
        elif kind in ("execute_result", "display_data"):
            data = out.get("data", {})
            if MIME not in data and "text/plain" in data and not any(k.startswith("image/") for k in data):
                parts.append(_text(data["text/plain"]) + "\n")
        elif kind == "error":
            parts.append(f"{out.get('ename')}: {out.get('evalue')}\n")
    return _ANSI.sub("", "".join(parts))


def tagged_cell(nb: dict, tag: str, chapter: str) -> dict:
    cells = [c for c in nb.get("cells", []) if c.get("cell_type") == "code" and tag in c.get("metadata", {}).get("tags", [])]
    if not cells:
        known = sorted({t for c in nb.get("cells", []) for t in c.get("metadata", {}).get("tags", [])})
        raise BindingError(f"{chapter} 的教程里没有标签为 {tag!r} 的代码单元"
                           f"（jupytext 写法：# %% tags=[\"{tag}\"]；现有标签：{', '.join(known) or '无'}）")
    if len(cells) > 1:
        raise BindingError(f"{chapter} 的教程里有 {len(cells)} 个代码单元带标签 {tag!r}：nb-output 要唯一的一个")
    return cells[0]


def normalize(line: str) -> str:
    """A line as the check compares it: runs of spaces collapsed (a page may re-align columns)."""
    return " ".join(line.split())


def output_lines(nb: dict) -> set[str]:
    """Every non-blank line any code cell of the notebook printed, normalized."""
    lines = set()
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            lines.update(n for n in map(normalize, cell_output(cell).splitlines()) if n)
    return lines


# ---------------------------------------------------------------- expansion (the build)

def _fenced(lines: list[str]):
    """(index, line, inside_fence) for each line; fence lines themselves count as inside."""
    fence = None
    for i, line in enumerate(lines):
        m = FENCE.match(line)
        if fence:
            if m and m.group(2)[0] == fence[0] and len(m.group(2)) >= len(fence) and not m.group(3):
                yield i, line, True
                fence = None
                continue
            yield i, line, True
        elif m:
            fence = m.group(2)
            yield i, line, True
        else:
            yield i, line, False


def include(args: str, page: str, docs_dir) -> list[str]:
    """The lines an nb-output marker stands for (without the fence)."""
    m = NB_OUTPUT_ARGS.fullmatch(args)
    if not m:
        raise BindingError(f"{page}: 无法解析 nb-output 标记（应为 <!-- nb-output chNN tag=标签 [lines=A-B | grep=正则] -->）：{args.strip()}")
    chapter, tag, first, last, grep = m.groups()
    text = cell_output(tagged_cell(load(chapter, docs_dir), tag, chapter)).rstrip("\n")
    lines = [ln.rstrip() for ln in text.splitlines()]
    if not text.strip():
        raise BindingError(f"{page}: {chapter} 标签 {tag!r} 的单元格没有文字输出")
    if first:
        a, b = int(first), int(last or first)
        if not 1 <= a <= b <= len(lines):
            raise BindingError(f"{page}: nb-output {chapter} tag={tag} lines={a}-{b} 超出范围（输出共 {len(lines)} 行）")
        lines = lines[a - 1:b]
    if grep:
        try:
            pattern = re.compile(grep)
        except re.error as e:
            raise BindingError(f"{page}: nb-output 的 grep 不是合法的正则表达式：{grep}（{e}）") from None
        lines = [ln for ln in lines if pattern.search(ln)]
        if not lines:
            raise BindingError(f"{page}: nb-output {chapter} tag={tag} grep={grep} 没有匹配任何输出行")
    return lines


def value(chapter: str, name: str, page: str, docs_dir) -> str:
    values = published(load(chapter, docs_dir), chapter)
    if name not in values:
        near = sorted(values)
        raise BindingError(f"{page}: [[{chapter}.{name}]] 不存在：{chapter} 的教程没有 publish({name!r}, …)"
                           f"（它发布的名字：{', '.join(near) or '无'}；改了教程要重新运行 vramlab tutorials run --only {chapter}）")
    return values[name]


_CODE_SPAN = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)")


def _code_spans(line: str):
    """(piece, is_inline_code) over a line."""
    last = 0
    for m in _CODE_SPAN.finditer(line):
        yield line[last:m.start()], False
        yield m.group(), True
        last = m.end()
    yield line[last:], False


def _substitute(text: str, page: str, docs_dir) -> str:
    for bad in REF_LIKE.finditer(text):
        if not REF.fullmatch(bad.group()):
            raise BindingError(f"{page}: 无法识别的引用 {bad.group()}（写法：[[chNN.名字]]，名字只含小写字母、数字、下划线）")
    return REF.sub(lambda r: value(r.group(1), r.group(2), page, docs_dir), text)


def expand(markdown: str, page: str, docs_dir=DOCS) -> str:
    """The page with every [[chNN.name]] replaced by its value and every nb-output marker by a
    ```text block; code (fenced or inline) is left as written (a page may show the syntax there)."""
    if "[[" not in markdown and "nb-output" not in markdown:
        return markdown
    lines = markdown.split("\n")
    out = []
    for _, line, fenced in _fenced(lines):
        if fenced:
            out.append(line)
            continue
        m = NB_OUTPUT.match(line)
        if m:
            indent = m.group(1)
            body = include(m.group(2), page, docs_dir)
            ticks = "`" * max(3, 1 + max((len(t) for ln in body for t in re.findall(r"`+", ln)), default=0))
            out += [f"{indent}{ticks}text"] + [f"{indent}{ln}" if ln else "" for ln in body] + [f"{indent}{ticks}"]
            continue
        if "nb-output" in line and re.match(r"\s*<!--\s*nb-output\b", line):
            raise BindingError(f"{page}: nb-output 标记要独占一行并在同一行里写完（以 --> 结尾）：{line.strip()[:80]}")
        if "[[" in line:
            line = "".join(piece if code else _substitute(piece, page, docs_dir)
                           for piece, code in _code_spans(line))
        out.append(line)
    return "\n".join(out)


# ---------------------------------------------------------------- the check

UNITS = r"(?:[KMGT]i?B/s|[KMGT]b/s|GT/s|TFLOPS|[KMGT]iB|[KMGT]B|ms|µs|us|ns|s|%|倍)(?![A-Za-z0-9])"
RATIO = r"(?:×|x)(?!\s*[0-9A-Za-z$(（\\])"       # 1.8× / 4x, but not the product "4 × 4"
NUM = r"\d[\d,]*(?:\.\d+)?"
FIGURE = re.compile(
    rf"(?<![\w.\\^/-])(?:{NUM}(?:\s*(?:–|-|~|～|至|到)\s*{NUM})?)\s*(?:{UNITS}|{RATIO})"
    rf"|(?:loss|损失|困惑度|perplexity)\s*(?:值)?\s*(?:为|是|=|:|：|从|降到|约)?\s*\d+\.\d+", re.I)
CITE = "\u2060CITE\u2060"           # what a footnote reference or an external link becomes
BOUND = "\u2060REF\u2060"


@dataclass
class Figure:
    line: int
    text: str
    sentence: str


@dataclass
class PageReport:
    page: str
    quoted_not_in_notebook: list[tuple[int, str]] = field(default_factory=list)
    unbound: list[Figure] = field(default_factory=list)


def _blank(text: str) -> str:
    """Same length and newlines, no content (keeps offsets and line numbers)."""
    return re.sub(r"[^\n]", " ", text)


def prose(markdown: str) -> str:
    """The page with everything the figure check does not read blanked out (line numbers kept):
    fenced code, HTML comments and tags, footnote definitions, math, inline code, link targets;
    references become BOUND and citations CITE."""
    lines = markdown.split("\n")
    for i, line, fenced in _fenced(lines):
        if fenced:
            lines[i] = ""
    text = "\n".join(lines)
    text = re.sub(r"<!--.*?-->", lambda m: _blank(m.group()), text, flags=re.S)
    # footnote definitions (and their indented continuation lines) are the citations themselves
    text = re.sub(r"^\[\^[^\]]+\]:.*(?:\n(?:[ \t]+.*|[ \t]*(?=\n[ \t]+\S)))*", lambda m: _blank(m.group()), text, flags=re.M)
    text = re.sub(r"\$\$.*?\$\$|\\\[.*?\\\]", lambda m: _blank(m.group()), text, flags=re.S)
    text = re.sub(r"(?<![\\$])\$(?!\s)(?:\\.|[^$\\\n])+?(?<!\s)\$|\\\(.*?\\\)", lambda m: _blank(m.group()), text)
    # a code span naming a source file (PyTorch's, the project's probe scripts and data files) cites it
    text = re.sub(r"`[\w.-]+(?:/[\w.-]+)+\.(?:py|cpp|h|cu|md|json|jsonl|txt)`", lambda m: CITE.ljust(len(m.group())), text)
    text = re.sub(r"(`+)(?!`).+?(?<!`)\1(?!`)", lambda m: _blank(m.group()), text)
    text = REF.sub(lambda m: BOUND.ljust(len(m.group())), text)
    text = re.sub(r"\[\^[^\]\s]+\]", lambda m: CITE.ljust(len(m.group())), text)
    text = re.sub(r"\]\((?:https?:)?//[^)\s]*\)", lambda m: "]" + CITE.ljust(len(m.group()) - 1), text)
    text = re.sub(r"\]\([^)\s]*\)", lambda m: "]" + " " * (len(m.group()) - 1), text)
    text = re.sub(r"<https?://[^>\s]+>", lambda m: CITE.ljust(len(m.group())), text)
    text = re.sub(r"</?[A-Za-z][^>\n]*>", lambda m: _blank(m.group()), text)
    return text


_SENTENCE_END = re.compile(r"[。！？]|\n|(?<=[.!?])\s")
_BY_HAND_BEFORE = re.compile(r"(?:[=≈]|约等于|等于)\s*(?:约\s*)?$")
BY_HAND_MARK = re.compile(r"[（(]\s*算术")
BY_HAND_NOTE = re.compile(r"[（(][^（）()]*算术[^（）()]*[）)]")
_CLAUSE_BREAK = re.compile(r"[，；：,;]")


def sentences(text: str):
    """(start offset, sentence) pieces of the prose; a table row or list item is its own piece."""
    start = 0
    for m in _SENTENCE_END.finditer(text):
        yield start, text[start:m.end()]
        start = m.end()
    yield start, text[start:]


def load_allowlist(path: Path = ALLOWLIST) -> list[dict]:
    import yaml

    if not path.exists():
        return []
    entries = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    for e in entries:
        if not e.get("reason", "").strip() or not (e.get("figure") or e.get("pattern")) or not e.get("page"):
            raise ValueError(f"{path.name}: 每一条都要有 page、figure（或 pattern）和非空的 reason：{e}")
    return entries


def _allowed(page: str, figure: str, allowlist: list[dict]) -> bool:
    from fnmatch import fnmatch

    for e in allowlist:
        if fnmatch(page, e["page"]) or fnmatch(Path(page).stem, e["page"]):
            if e.get("figure") == figure or (e.get("pattern") and re.fullmatch(e["pattern"], figure)):
                return True
    return False


def unbound_figures(markdown: str, page: str = "", allowlist: list[dict] | None = None) -> list[Figure]:
    """Measured-looking figures of the page's prose that nothing accounts for (see the module doc)."""
    allowlist = allowlist if allowlist is not None else []
    text = prose(markdown)
    found = []
    for start, sentence in sentences(text):
        if CITE in sentence:
            continue
        marks = [m.start() for m in BY_HAND_MARK.finditer(sentence)]
        notes = [m.span() for m in BY_HAND_NOTE.finditer(sentence)]
        for m in FIGURE.finditer(sentence):
            figure = " ".join(m.group().split())
            # "（算术）" covers the figures of its own clause, before it, and a parenthesis that
            # says "算术" the figures inside it
            if any(m.start() < mark and not _CLAUSE_BREAK.search(sentence, m.end(), mark) for mark in marks):
                continue
            if any(a < m.start() and m.end() < b for a, b in notes):
                continue
            if _BY_HAND_BEFORE.search(sentence[:m.start()]):
                continue
            if _allowed(page, figure, allowlist):
                continue
            line = text.count("\n", 0, start + m.start()) + 1
            found.append(Figure(line, figure, " ".join(sentence.split())))
    return found


def output_blocks(markdown: str):
    """(line, language, [(line, text)], marked_not_output) for each ```text / ```console block."""
    lines = markdown.split("\n")
    block = None
    for i, line, fenced in _fenced(lines):
        m = FENCE.match(line)
        if block is None and fenced and m:
            lang = m.group(3).lower()
            marked = i > 0 and bool(NOT_OUTPUT.match(lines[i - 1]))
            block = (i + 1, lang, [], marked, m.group(2))
        elif block is not None and fenced and m and m.group(2)[0] == block[4][0] and not m.group(3) \
                and len(m.group(2)) >= len(block[4]):
            if block[1] in OUTPUT_LANGS:
                yield block[:4]
            block = None
        elif block is not None:
            block[2].append((i + 1, line))


_ELLIPSIS = re.compile(r"^(?:\.{3}|…+|⋮|\[\.\.\.\])$")


def quoted_not_in_notebook(markdown: str, nb_lines: set[str]) -> list[tuple[int, str]]:
    """Lines of the page's output blocks that the notebook never printed."""
    missing = []
    for _, _, body, marked in output_blocks(markdown):
        if marked:
            continue
        for line_no, line in body:
            n = normalize(line)
            if not n or _ELLIPSIS.match(n):
                continue
            core = n.strip(".… ")
            if n in nb_lines or (len(core) >= 12 and any(core in o for o in nb_lines)):
                continue
            missing.append((line_no, line.strip()))
    return missing


def chapter_pages() -> list[Path]:
    return sorted(CHAPTERS.glob("ch[0-9][0-9].md"))


def check_page(path: Path, allowlist: list[dict] | None = None) -> PageReport:
    page = path.relative_to(DOCS).as_posix()
    markdown = path.read_text(encoding="utf-8")
    report = PageReport(page)
    chapter = path.stem
    try:
        nb_lines = output_lines(load(chapter))
    except BindingError:
        nb_lines = set()
    report.quoted_not_in_notebook = quoted_not_in_notebook(markdown, nb_lines)
    report.unbound = unbound_figures(markdown, page, load_allowlist() if allowlist is None else allowlist)
    return report


def main(argv=None) -> int:
    """Print the per-chapter counts (and with -v, each line and figure)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m vramlab.bound_numbers",
                                description="统计各章正文里没有出自 notebook 的输出行和没有绑定的实测数字")
    p.add_argument("chapters", nargs="*", help="只看这些章节，如 ch01 ch08")
    p.add_argument("-v", "--verbose", action="store_true", help="列出每一行、每个数字")
    args = p.parse_args(argv)
    allowlist = load_allowlist()
    total_q = total_f = 0
    print(f"{'章节':<6}{'输出行不在notebook':>20}{'未绑定的数字':>14}")
    for path in chapter_pages():
        if args.chapters and path.stem not in args.chapters:
            continue
        r = check_page(path, allowlist)
        total_q += len(r.quoted_not_in_notebook)
        total_f += len(r.unbound)
        print(f"{path.stem:<8}{len(r.quoted_not_in_notebook):>20}{len(r.unbound):>18}")
        if args.verbose:
            for line, text in r.quoted_not_in_notebook:
                print(f"    {r.page}:{line}: 输出行不在 notebook 里：{text}")
            for f in r.unbound:
                print(f"    {r.page}:{f.line}: 未绑定 {f.text!r}  ← {f.sentence[:90]}")
    print(f"{'合计':<6}{total_q:>20}{total_f:>18}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
