"""Docs that cannot break silently: no control characters in the pages or the tutorials' Markdown,
and every formula parses with the site's KaTeX.

A LaTeX escape written through a string that interprets backslashes turns `\\tanh` into a TAB and
"anh", `\\frac` into a form feed: KaTeX still renders something (a TAB is a space to it), so only
a look at the characters catches it. A formula KaTeX cannot parse shows as red source text in the
browser (katex-init.js: throwOnError false); scripts/katex_check.js renders each with
throwOnError and the test reports file:line.
"""
import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from site_build import node_or_skip

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts and "overrides" not in p.parts)
NOTEBOOKS = sorted((DOCS / "chapters").glob("ch[0-9][0-9]-tutorial.ipynb"))
TUTORIALS = sorted((ROOT / "tutorials").glob("ch[0-9][0-9].py"))
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")      # anything but \t and \n
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")


def _read(path: Path) -> str:
    """The file's text with its line endings as they are (read_text would turn a CR into a newline)."""
    with open(path, encoding="utf-8", newline="") as fh:
        return fh.read()


def control_characters(text: str) -> list[tuple[int, str]]:
    """(line, repr of the character) for every control character, and every TAB outside fenced
    code (a TAB in prose or math is a damaged \\t escape, not indentation)."""
    found, fence = [], None
    for no, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
        elif m:
            fence = m.group(1)
        for ch in CONTROL.findall(line):
            found.append((no, repr(ch)))
        if "\t" in line and not fence and not m:
            found.append((no, repr("\t")))
    return found


def _markdown_cells(nb_path: Path):
    nb = json.loads(_read(nb_path))
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown":
            yield i, "".join(cell["source"])


def test_no_control_characters_in_pages():
    bad = [f"{p.relative_to(ROOT)}:{no}: {ch}" for p in PAGES for no, ch in control_characters(_read(p))]
    assert not bad, "页面里有控制字符（多半是被转义坏了的 \\t、\\f、\\r）：\n" + "\n".join(bad)


def test_no_control_characters_in_tutorial_markdown():
    bad = [f"{nb.relative_to(ROOT)} 第 {i} 个单元格第 {no} 行: {ch}"
           for nb in NOTEBOOKS for i, src in _markdown_cells(nb) for no, ch in control_characters(src)]
    # the sources the notebooks come from: a control character in a tutorial's code is as wrong
    bad += [f"{p.relative_to(ROOT)}:{no}: {ch}" for p in TUTORIALS
            for no, ch in control_characters(_read(p)) if ch != repr("\t")]
    assert not bad, "教程的 Markdown 里有控制字符：\n" + "\n".join(bad)


def test_the_detector_sees_a_damaged_escape():
    assert control_characters("$c \\cdot \tanh(x)$") == [(1, repr("\t"))]
    assert control_characters("$\x0crac{a}{b}$") == [(1, repr("\x0c"))]
    assert control_characters("```python\n\tx = 1\n```\n") == []


# ---------------------------------------------------------------- formulas

def _page_markdown():
    import markdown

    return markdown.Markdown(
        extensions=["admonition", "attr_list", "footnotes", "md_in_html", "tables", "pymdownx.arithmatex",
                    "pymdownx.details", "pymdownx.superfences", "pymdownx.tabbed"],
        extension_configs={"pymdownx.arithmatex": {"generic": True}, "pymdownx.tabbed": {"alternate_style": True}})


_ARITHMATEX = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _line_of(source: str, tex: str) -> int:
    """The source line a formula starts on (first occurrence of its first characters)."""
    for n in (40, 12, 4):
        i = source.find(tex.strip()[:n])
        if i >= 0:
            return source.count("\n", 0, i) + 1
    return 0


def _bound(source: str, page: str) -> str:
    """The page with its [[chNN.name]] references filled in, as the build does before arithmatex runs
    (docs/hooks/bound_numbers.py; a reference may sit inside a formula). Line numbers are kept."""
    from vramlab import bound_numbers as bn

    # the same substitution as the build (outside code); output includes left out, so lines stay put
    kept = source.replace("<!-- nb-output", "<!-- kept-include")
    return bn.expand(kept, page).replace("<!-- kept-include", "<!-- nb-output")


def page_formulas(path: Path) -> list[dict]:
    """The formulas pymdownx.arithmatex finds in a page (what the site hands to KaTeX)."""
    source = _bound(_read(path), _rel(path))
    out = []
    for kind, body in _ARITHMATEX.findall(_page_markdown().convert(source)):
        body = html.unescape(body).strip()
        display = body.startswith("\\[")
        tex = body[2:-2] if body[:2] in ("\\(", "\\[") else body
        out.append({"where": f"{_rel(path)}:{_line_of(source, tex)}", "tex": tex, "display": display})
    return out


_NB_MATH = re.compile(r"\$\$(.+?)\$\$|(?<![\\$])\$(?!\s)((?:\\.|[^$\\\n])+?)(?<!\s)\$", re.S)


def notebook_formulas(path: Path) -> list[dict]:
    """$$…$$ and $…$ of the notebook's Markdown cells, code spans and fences left out (the site's
    auto-render looks at the rendered Markdown, where code is <code>)."""
    out = []
    for i, src in _markdown_cells(path):
        text = re.sub(r"^(\s*)(`{3,}|~{3,}).*?^\s*\2", lambda m: re.sub(r"[^\n]", " ", m.group()), src, flags=re.S | re.M)
        text = re.sub(r"`[^`\n]+`", lambda m: " " * len(m.group()), text)
        for m in _NB_MATH.finditer(text):
            tex = m.group(1) if m.group(1) is not None else m.group(2)
            line = text.count("\n", 0, m.start()) + 1
            out.append({"where": f"{path.relative_to(ROOT)} 第 {i} 个单元格第 {line} 行", "tex": tex,
                        "display": m.group(1) is not None})
    return out


def test_formula_extraction_finds_what_the_site_renders(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("行内 $a^2$ 与\n\n$$\n\\frac{1}{2}\n$$\n\n`$不是公式$` 和 5 $ 与 6 $\n", encoding="utf-8")
    found = [(f["tex"].strip(), f["display"]) for f in page_formulas(page)]
    assert found == [("a^2", False), ("\\frac{1}{2}", True)]


@pytest.mark.slow
def test_every_formula_parses_with_katex():
    node = node_or_skip("用站点自带的 KaTeX 检查每个公式")
    formulas = [f for p in PAGES for f in page_formulas(p)] + [f for nb in NOTEBOOKS for f in notebook_formulas(nb)]
    assert len(formulas) > 500            # the chapters have many: an empty list means extraction broke
    run = subprocess.run([node, str(ROOT / "scripts" / "katex_check.js")], input=json.dumps(formulas),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["rendered"] == len(formulas)
    print(f"KaTeX: {len(formulas)} 个公式（{len(PAGES)} 个页面、{len(NOTEBOOKS)} 份教程 notebook），{len(result['errors'])} 个解析错误")
    assert not result["errors"], "KaTeX 解析不了这些公式：\n" + "\n".join(
        f"{e['where']}: {e['tex'][:80]!r}: {e['error']}" for e in result["errors"])


@pytest.mark.slow
def test_the_katex_check_reports_a_bad_formula():
    node = shutil.which("node")
    if node is None:
        pytest.skip("没有 node")
    bad = [{"where": "x.md:3", "tex": "\\frac{a}{", "display": False}, {"where": "x.md:4", "tex": "a^2", "display": True}]
    run = subprocess.run([node, str(ROOT / "scripts" / "katex_check.js")], input=json.dumps(bad),
                         capture_output=True, text=True, timeout=60)
    errors = json.loads(run.stdout)["errors"]
    assert [e["where"] for e in errors] == ["x.md:3"]
