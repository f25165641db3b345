"""MkDocs hook: headings that read well in the table of contents and in search results.

1. Formulas in plain text. A heading such as "Chen 等人的 $\\sqrt{n}$ 分段" is typeset by KaTeX on
   the page, but its table-of-contents entry and the search index hold the TeX source
   ("\\(\\sqrt{n}\\)"). Here TOC entries, and every title and text of the search index, get the
   formula as Unicode text ("√n", "4h²", "α/r"): `tex_to_text` below. A heading formula this
   converter does not know is a warning (the strict build fails); in body text an unknown
   command is kept as its name.

2. Tutorial notebooks with a working table of contents. mkdocs-jupyter builds a notebook page's
   TOC from a Markdown copy of the notebook, with other ids than nbconvert gives the headings
   (ASCII-only, often "" or "2", and the same id twice on one page): links that go nowhere,
   inline code dropped from the entries, "¶" in search titles. Here a notebook page's headings
   get ids from the site's own slugify (as Markdown pages, so Chinese headings keep their words),
   made unique on the page; the "¶" link becomes Material's `headerlink` (which search skips);
   and the TOC is rebuilt from the rendered headings themselves, so every entry points at an id
   on the page.
"""
from __future__ import annotations

import html
import json
import logging
import os
import re

from mkdocs.plugins import event_priority
from mkdocs.structure.toc import get_toc

log = logging.getLogger("mkdocs.hooks.headings")

# --------------------------------------------------------------------------- TeX -> text

_GREEK = {n: chr(c) for n, c in [
    ("alpha", 0x3b1), ("beta", 0x3b2), ("gamma", 0x3b3), ("delta", 0x3b4), ("epsilon", 0x3b5),
    ("varepsilon", 0x3b5), ("zeta", 0x3b6), ("eta", 0x3b7), ("theta", 0x3b8), ("vartheta", 0x3d1),
    ("iota", 0x3b9), ("kappa", 0x3ba), ("lambda", 0x3bb), ("mu", 0x3bc), ("nu", 0x3bd), ("xi", 0x3be),
    ("pi", 0x3c0), ("rho", 0x3c1), ("sigma", 0x3c3), ("tau", 0x3c4), ("upsilon", 0x3c5), ("phi", 0x3c6),
    ("varphi", 0x3c6), ("chi", 0x3c7), ("psi", 0x3c8), ("omega", 0x3c9), ("Gamma", 0x393),
    ("Delta", 0x394), ("Theta", 0x398), ("Lambda", 0x39b), ("Xi", 0x39e), ("Pi", 0x3a0),
    ("Sigma", 0x3a3), ("Phi", 0x3a6), ("Psi", 0x3a8), ("Omega", 0x3a9)]}
_SYMBOLS = {
    "times": "×", "cdot": "·", "cdotp": "·", "div": "÷", "pm": "±", "mp": "∓", "approx": "≈", "sim": "∼",
    "simeq": "≃", "equiv": "≡", "neq": "≠", "ne": "≠", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥",
    "ll": "≪", "gg": "≫", "in": "∈", "notin": "∉", "subset": "⊂", "subseteq": "⊆", "cup": "∪", "cap": "∩",
    "to": "→", "rightarrow": "→", "leftarrow": "←", "gets": "←", "Rightarrow": "⇒", "Leftarrow": "⇐",
    "leftrightarrow": "↔", "Leftrightarrow": "⇔", "mapsto": "↦", "infty": "∞", "partial": "∂",
    "nabla": "∇", "sum": "∑", "prod": "∏", "int": "∫", "odot": "⊙", "otimes": "⊗", "oplus": "⊕",
    "circ": "∘", "ell": "ℓ", "top": "ᵀ", "dots": "…", "ldots": "…", "cdots": "⋯", "vdots": "⋮",
    "propto": "∝", "forall": "∀", "exists": "∃", "lceil": "⌈", "rceil": "⌉", "lfloor": "⌊",
    "rfloor": "⌋", "langle": "⟨", "rangle": "⟩", "|": "‖", "lVert": "‖", "rVert": "‖", "Vert": "‖",
    "lvert": "|", "rvert": "|", "vert": "|", "mid": "|", "prime": "′", "star": "⋆", "ast": "∗",
    "bullet": "•", "emptyset": "∅", "neg": "¬", "land": "∧", "lor": "∨", "colon": ":", "lbrace": "{",
    "rbrace": "}", "backslash": "\\", "%": "%", "_": "_", "{": "{", "}": "}", "&": "&", "#": "#", "$": "$",
    ",": " ", ";": " ", ":": " ", " ": " ", "quad": " ", "qquad": " ", "!": "", "\\": "; ",
}
_NAMES = {"log", "ln", "exp", "max", "min", "sin", "cos", "tan", "tanh", "arg", "det", "dim", "sup",
          "inf", "lim", "mod", "bmod", "softmax", "argmax", "argmin"}
_DROP = {"left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "biggl", "biggr",
         "displaystyle", "textstyle", "scriptstyle", "limits", "nolimits", "middle"}
_STYLE = {"text", "textrm", "textit", "textbf", "texttt", "textsf", "mathrm", "mathit", "mathbf", "mathsf",
          "mathtt", "mathcal", "mathbb", "mathfrak", "mathscr", "boldsymbol", "bm", "mbox", "operatorname",
          "mathrel", "mathbin", "mathop", "mathord", "hbox", "emph"}
_ACCENT = {"hat": "\u0302", "widehat": "\u0302", "bar": "\u0304", "overline": "\u0304", "tilde": "\u0303",
           "widetilde": "\u0303", "vec": "\u20d7", "dot": "\u0307", "ddot": "\u0308"}
_SUP = dict(zip("0123456789+-=()nixTtk", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿⁱˣᵀᵗᵏ"))
_SUB = dict(zip("0123456789+-=()aeoxhklmnpstijruv", "₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎ₐₑₒₓₕₖₗₘₙₚₛₜᵢⱼᵣᵤᵥ"))
_TOKEN = re.compile(r"\\(?:[A-Za-z]+|.)|[{}^_&~]|\s+|[^\\{}^_&~\s]")


class _Tex:
    """A small recursive reader of inline TeX; `unknown` collects commands it has no rule for."""

    def __init__(self, src: str):
        self.toks = _TOKEN.findall(src)
        self.i = 0
        self.unknown: set[str] = set()

    def _next(self):
        tok = self.toks[self.i] if self.i < len(self.toks) else None
        self.i += 1
        return tok

    def _peek_nonspace(self):
        j = self.i
        while j < len(self.toks) and self.toks[j].isspace():
            j += 1
        return j

    def group(self, until: str | None = None) -> str:
        out = []
        while self.i < len(self.toks):
            if self.toks[self.i] == until:
                self.i += 1
                break
            out.append(self.atom())
        return "".join(out)

    def arg(self) -> str:
        """One argument: {group}, \\command or a single character."""
        self.i = self._peek_nonspace()
        tok = self._next()
        if tok is None or tok == "}":
            return ""
        if tok == "{":
            return self.group("}")
        self.i -= 1
        return self.atom()

    def optional(self) -> str | None:
        j = self._peek_nonspace()
        if j < len(self.toks) and self.toks[j] == "[":
            self.i = j + 1
            out = []
            while self.i < len(self.toks) and self.toks[self.i] != "]":
                out.append(self.atom())
            self.i += 1
            return "".join(out)
        return None

    def atom(self) -> str:
        tok = self._next()
        if tok is None:
            return ""
        if tok == "{":
            return self.group("}")
        if tok == "}":
            return ""
        if tok.isspace():
            return " "
        if tok == "~":
            return " "
        if tok == "&":
            return " "
        if tok in ("^", "_"):
            return _script(self.arg(), _SUP if tok == "^" else _SUB, tok)
        if not tok.startswith("\\"):
            return tok
        name = tok[1:]
        if name in _GREEK:
            return _GREEK[name]
        if name in _SYMBOLS:
            return _SYMBOLS[name]
        if name in _NAMES:
            return name
        if name in _DROP:
            return ""
        if name in _STYLE:
            return self.arg()
        if name in _ACCENT:
            base = self.arg()
            return base + _ACCENT[name] if len(base) == 1 else base
        if name in ("frac", "dfrac", "tfrac", "cfrac"):
            a, b = self.arg(), self.arg()
            return f"{_wrap(a)}/{_wrap(b)}"
        if name == "sqrt":
            n = self.optional()
            x = self.arg()
            return (_script(n, _SUP, "^") if n else "") + "√" + _wrap(x)
        if name in ("underbrace", "overbrace", "underset", "overset", "stackrel"):
            if name in ("underset", "overset", "stackrel"):
                self.arg()                        # the annotation
                return self.arg()
            x = self.arg()
            j = self._peek_nonspace()
            if j < len(self.toks) and self.toks[j] in ("_", "^"):
                self.i = j + 1
                self.arg()                        # the brace's label
            return x
        if name in ("begin", "end"):
            self.arg()
            return " "
        self.unknown.add(tok)
        return name


def _wrap(s: str) -> str:
    s = s.strip()
    if len(s) <= 1 or re.fullmatch(r"[\w.·²³⁰¹⁴-⁹ᵀ√′\u0300-\u036f]+", s):
        return s
    if s.startswith("(") and s.endswith(")") and s.count("(") == 1:
        return s
    return f"({s})"


def _script(s: str, table: dict, mark: str) -> str:
    s = s.strip()
    if s and all(c in table for c in s):
        return "".join(table[c] for c in s)
    if s == "ᵀ":                                   # ^\top
        return s
    return f"{mark}{_wrap(s)}" if s else ""


def tex_to_text(src: str) -> tuple[str, set[str]]:
    """Unicode text for an inline TeX formula, and the commands it did not know."""
    tex = _Tex(src)
    text = tex.group()
    return re.sub(r" ;", ";", re.sub(r"[ \t\n]+", " ", text)).strip(), tex.unknown


_MATH_MD = re.compile(r"\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S)           # pymdownx.arithmatex (generic)
_MATH_NB = re.compile(r"\$\$(.+?)\$\$|(?<![\\$])\$(?=\S)([^$\n]+?)(?<=[^\s\\])\$(?!\$)", re.S)  # notebook cells
_CODE = re.compile(r"(<(code|pre)\b[^>]*>.*?</\2>)", re.S)


def math_to_text(text: str, dollars: bool, unknown: set[str] | None = None) -> str:
    """`text` (HTML or plain) with each formula outside <code>/<pre> written as Unicode text."""
    def plain(m: re.Match) -> str:
        src = html.unescape(next(g for g in m.groups() if g is not None))
        out, missing = tex_to_text(src)
        if unknown is not None:
            unknown.update(missing)
        return html.escape(out, quote=False)

    parts = _CODE.split(text)
    for k in range(0, len(parts), 3):                 # split() yields text, code, tag-name, text, ...
        parts[k] = _MATH_MD.sub(plain, parts[k])
        if dollars:
            parts[k] = _MATH_NB.sub(plain, parts[k])
    return "".join(p for k, p in enumerate(parts) if k % 3 != 2)


# --------------------------------------------------------------------------- pages

_HEADING = re.compile(r'<h([1-6])\b([^>]*?)\bid="([^"]*)"([^>]*)>(.*?)</h\1>', re.S)
_ANCHOR = re.compile(r'<a class="anchor-link" href="#[^"]*">(.*?)</a>', re.S)
_IDS = re.compile(r'\bid="([^"]*)"')
_TAG = re.compile(r"<[^>]+>")


def _is_notebook(page) -> bool:
    return page.file.src_uri.endswith(".ipynb")


def _heading_text(inner: str, where: str, dollars: bool) -> str:
    """A heading's inner HTML as TOC text: formulas as text, tags dropped, still HTML-escaped.
    `dollars`: $...$ is a formula (notebook Markdown; in Markdown pages arithmatex has already
    turned formulas into \\(...\\), and a $ left there is a dollar sign)."""
    unknown: set[str] = set()
    text = _TAG.sub("", math_to_text(inner, dollars=dollars, unknown=unknown))
    if unknown:
        log.warning("headings: %s: a heading formula uses %s, which tex_to_text does not know",
                    where, ", ".join(sorted(unknown)))
    return re.sub(r"\s+", " ", text).strip()


def _unique(base: str, used: set[str]) -> str:
    """Python-Markdown's rule (toc.unique): base, base_1, base_2, ..."""
    new, n = base, 0
    while new in used or not new:
        n += 1
        new = f"{base}_{n}" if base else f"_{n}"
    used.add(new)
    return new


def _notebook_headings(html_: str, page, slugify) -> str:
    headings = list(_HEADING.finditer(html_))
    old_ids = {m.group(3) for m in headings}
    used = {i for i in _IDS.findall(html_)} - old_ids     # ids of everything else on the page
    tokens, stack, out, last = [], [], [], 0
    for m in headings:
        level, before, after, inner = int(m.group(1)), m.group(2), m.group(4), m.group(5)
        label = _ANCHOR.sub("", inner)
        text = _heading_text(label, page.file.src_uri, dollars=True)
        new_id = _unique(slugify(html.unescape(text), "-"), used)
        link = f'<a class="headerlink" href="#{new_id}" title="Permanent link">¶</a>'
        out.append(html_[last:m.start()])
        out.append(f'<h{level}{before}id="{new_id}"{after}>{label}{link}</h{level}>')
        last = m.end()
        token = {"level": level, "id": new_id, "name": text, "children": []}
        while stack and stack[-1]["level"] >= level:
            stack.pop()
        (stack[-1]["children"] if stack else tokens).append(token)
        stack.append(token)
    out.append(html_[last:])
    page.toc = get_toc(tokens)
    return "".join(out)


def _plain_toc(items, where: str) -> None:
    for item in items:
        if "\\(" in item.title or "\\[" in item.title:
            item.title = _heading_text(item.title, where, dollars=False)
        _plain_toc(item.children, where)


@event_priority(-50)     # after the other hooks have finished the page's HTML
def on_page_content(html_: str, page, config, files) -> str:
    if _is_notebook(page):
        slugify = config["mdx_configs"].get("toc", {}).get("slugify")
        if slugify is None:
            from markdown.extensions.toc import slugify
        html_ = _notebook_headings(html_, page, slugify)
    _plain_toc(page.toc, page.file.src_uri)
    return html_


# --------------------------------------------------------------------------- search index

@event_priority(-50)     # after the search plugin wrote search_index.json, before offline inlines it
def on_post_build(config) -> None:
    path = os.path.join(config["site_dir"], "search", "search_index.json")
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        index = json.load(f)
    notebooks = {f.url for f in _files if f.src_uri.endswith(".ipynb")} if _files else set()
    for doc in index["docs"]:
        page = doc["location"].split("#")[0]
        dollars = page in notebooks
        for field in ("title", "text"):
            if field in doc:
                doc[field] = math_to_text(doc[field], dollars)
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(index, separators=(",", ":"), default=str))   # as Material writes it


_files = None


def on_files(files, config):
    global _files
    _files = files
    return files
