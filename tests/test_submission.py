"""Reading notebook submissions (vramlab.grader.submission) and building the module that
`vramlab.check()` sends (vramlab.grader.notebook_check): static only, no child process, no grading."""
from __future__ import annotations

import json
import textwrap
import types

import pytest

from vramlab import notebooks
from vramlab.exercises import EXERCISES, get_exercise
from vramlab.grader.submission import SubmissionError, notebook_source
from vramlab.grader.notebook_check import function_source

SETUP = "import torch\n\nimport vramlab\n"


def _notebook(*code: str) -> str:
    cells = [{"cell_type": "markdown", "metadata": {}, "source": "# 题目"}]
    cells += [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
               "source": textwrap.dedent(c)} for c in code]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def _answer(module_code: str, body: str = "return 1.0") -> str:
    return textwrap.dedent(module_code) + f"\n\ndef train_step(model, optimizer, batch, device):\n    {body}\n"


def _reason(*code: str) -> str:
    with pytest.raises(SubmissionError) as e:
        notebook_source(_notebook(*code), "train_step")
    assert e.value.category == "invalid_submission"
    return e.value.reason


def test_module_level_cache_is_kept():
    src = notebook_source(_notebook(SETUP, _answer("_cache = {}", "return _cache.setdefault('loss', 1.0)")), "train_step")
    assert "_cache = {}" in src and "def train_step" in src


@pytest.mark.parametrize("statement", [
    "SIZES = [1, 2]",
    "K = 2 ** 10",
    "x: dict = {}",
    "_seen = set()",
    "DTYPE = torch.bfloat16",
    "import collections\n_c = collections.OrderedDict()",
    "from collections import defaultdict\n_d = defaultdict(list)",
    "import functools\ndef _scale(a, b):\n    return a * b\ndouble = functools.partial(_scale, 2)",
    "try:\n    import apex\nexcept ImportError:\n    apex = None",
])
def test_simple_module_level_statements_are_kept(statement):
    src = notebook_source(_notebook(SETUP, _answer(statement)), "train_step")
    assert textwrap.dedent(statement).splitlines()[-1] in src


def test_decorators_stay_with_their_function():
    src = notebook_source(_notebook(SETUP, "@torch.no_grad()\n" + _answer("").lstrip()), "train_step")
    assert "@torch.no_grad()\ndef train_step" in src


def test_dropped_global_is_named_with_its_cell_and_line():
    reason = _reason(SETUP, _answer("def build():\n    return {}\n_cache = build()", "return _cache['loss']"))
    assert "`_cache`" in reason and "第 2 个代码单元第 3 行" in reason and "`_cache = build()`" in reason
    assert "简单赋值" in reason and "函数内部" in reason


def test_global_read_through_a_helper_is_followed():
    helper = "def _lookup(key):\n    return TABLE[key]\nTABLE = dict(zip('ab', [1, 2]))"
    reason = _reason(SETUP, _answer(helper, "return _lookup('a')"))
    assert "`_lookup` 用到的全局变量 `TABLE`" in reason


def test_dropped_code_the_function_does_not_read_is_fine():
    demo = "model = torch.nn.Linear(2, 2)\nprint(model)"
    src = notebook_source(_notebook(SETUP, _answer(""), demo), "train_step")
    assert "Linear" not in src and "print(" not in src


def test_undefined_name_is_reported():
    reason = _reason(SETUP, _answer("", "return _tabel['loss']"))
    assert "没有定义的名字 `_tabel`" in reason


def test_syntax_error_in_the_answer_cell():
    reason = _reason(SETUP, "def train_step(model, optimizer, batch, device:\n    return 1.0\n")
    assert "定义 train_step 的代码单元有语法错误" in reason and "第 1 行" in reason


def test_check_cell_is_dropped():
    spec = get_exercise("ch05-accumulation")
    nb = _notebook(notebooks.setup_source(spec), notebooks.answer_source(spec), notebooks.check_source(spec))
    src = notebook_source(nb, spec.function)
    assert "vramlab.check(" not in src and "_sp.run" not in src and "assert " not in src


def test_magics_and_shell_lines_are_dropped():
    magics = "%matplotlib inline\n!pip install tqdm\nfiles = !ls\n"
    src = notebook_source(_notebook(magics + SETUP, _answer("")), "train_step")
    assert "%matplotlib" not in src.replace("# %", "") and "!pip" not in src.replace("# !", "") and "def train_step" in src
    assert "`files = !ls`" in _reason(magics + SETUP, _answer("", "return files"))


@pytest.mark.parametrize("exercise_id", list(EXERCISES))
def test_every_course_notebook_reads_cleanly(exercise_id):
    spec = get_exercise(exercise_id)
    nb = _notebook(notebooks.setup_source(spec), notebooks.answer_source(spec), notebooks.check_source(spec))
    assert f"def {spec.function}" in notebook_source(nb, spec.function)


# ---- vramlab.check(): the module built from the live function ------------------------------------
_TABLE = {"sizes": [1, 2], "seen": set(), "inf": float("inf")}


def reads_table(model, optimizer, batch, device):
    return _TABLE["sizes"]


def test_function_source_carries_a_dict_global():
    src = function_source(reads_table, "train_step")
    assert "_TABLE = {'sizes': [1, 2], 'seen': set(), 'inf': float('inf')}" in src
    assert "train_step = reads_table" in src
    compile(src, "<check>", "exec")


def test_function_source_refuses_a_tensor_global():
    torch = pytest.importorskip("torch")
    # the same function, but its `_TABLE` global is a tensor, as a notebook cell might leave it
    func = types.FunctionType(reads_table.__code__, {"_TABLE": torch.zeros(2), "__name__": "__main__"})
    with pytest.raises(AssertionError, match="全局变量 `_TABLE`（Tensor 对象）"):
        function_source(func, "train_step")
