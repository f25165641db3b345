"""nbgrader notebooks generated from the exercise specs (one exercise = one spec = one assignment).

    python -m vramlab.notebooks                 # write solutions/<id>/<id>.ipynb for every spec
    python -m vramlab.notebooks --release       # ... then `nbgrader generate_assignment` -> exercises/
    python -m vramlab.notebooks --check         # regenerate both into a temp copy, diff against the repo

The SOURCE notebook (`solutions/<id>/<id>.ipynb`, nbgrader's source_directory) has:

1. a locked Chinese markdown intro: title, task, target, how grading works, hints;
2. a locked setup cell (imports only; nothing heavy is built in the learner's kernel);
3. the answer cell (`solution: true`): the spec's STARTER, then the spec's SOLUTION inside
   `### BEGIN SOLUTION` / `### END SOLUTION`. `nbgrader generate_assignment` replaces the marked region
   with `ClearSolutions.code_stub` (a one-line comment, see nbgrader_config.py), so the learner
   notebook keeps the runnable starter: correct, but over the memory target;
4. a locked, graded cell (`grade: true, locked: true, points`) that calls `vramlab.check("<id>")`
   under `contextlib.redirect_stderr(sys.stdout)`, followed by `### BEGIN HIDDEN TESTS` ... `### END HIDDEN TESTS`:
   the interface is unchanged and the result is consistent. Under autograde the kernel measures
   nothing: `grader/autograde.py` (TrustedRegrade, in the nbgrader process) grades the notebook
   and decides the cell's score, which nothing done inside the learner's kernel can influence.

Generation is deterministic (fixed cell ids, sorted JSON, no timestamps), so CI regenerates and diffs.
"""
from __future__ import annotations

import ast
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NBFORMAT_MINOR = 5
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
LANGUAGE_INFO = {"name": "python"}


# --------------------------------------------------------------------------------------------------
# In the learner's kernel
# --------------------------------------------------------------------------------------------------
def _make_stderr_preprocessor():
    from nbgrader import utils
    from nbgrader.preprocessors import NbGraderPreprocessor

    class StderrToStdout(NbGraderPreprocessor):
        """Autograde step (after Execute): in graded cells, relabel stderr streams as stdout, keeping
        the text with a "[stderr] " prefix, so that only an exception ("error" output) costs points."""

        def preprocess_cell(self, cell, resources, cell_index):
            if cell.cell_type == "code" and utils.is_grade(cell):
                for output in cell.get("outputs", []):
                    if output.get("output_type") == "stream" and output.get("name") == "stderr":
                        output["name"] = "stdout"
                        text = output.get("text", "")
                        output["text"] = "".join("[stderr] " + line for line in text.splitlines(True))
            return cell, resources

    return StderrToStdout


def __getattr__(name):         # nbgrader is imported only by the nbgrader process, never by the kernel
    if name == "StderrToStdout":
        cls = _make_stderr_preprocessor()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------------------------------
# Building the source notebook from a spec
# --------------------------------------------------------------------------------------------------
def _scale_zh(scale, kind: str) -> str:
    from .grader.kinds import traits
    from .grader.kinds.common import explicit

    text = traits(kind).scale_zh.format(model=scale.model, batch=scale.batch, seq=scale.seq, steps=scale.steps,
                                        warmup=scale.warmup)
    shown = {k: v for k, v in explicit(scale.settings).items() if k not in _GRADER_ONLY}
    if shown:
        text += "，其他设置 " + "、".join(f"`{k}={v!r}`" for k, v in sorted(shown.items()))
    return text


# hidden test cases and the harness's plumbing stay out of the learner's notebook
_GRADER_ONLY = {"cases", "visible", "case", "lengths", "allow_host", "cublas_workspace", "max_batch_allowed",
                "observer_slack_mib"}


def _how_graded(spec) -> list[str]:
    from .grader.kinds import traits

    return [line.format(id=spec.id) for line in traits(spec.kind).how_graded_zh]


def intro_markdown(spec) -> str:
    from .exercises.spec import criteria_zh

    lines = [
        f"# 第 {spec.chapter} 章练习：{spec.title}",
        "",
        f"练习编号 `{spec.id}` · 满分 {spec.points} 分 · 要写的函数：`{spec.signature.rstrip(':')}`",
        "",
        "## 任务",
        "",
        spec.task.strip(),
        "",
        "## 目标",
        "",
        *criteria_zh(spec),
    ]
    lines += [
        "",
        "## 怎么评分",
        "",
        *_how_graded(spec),
        f"   - 默认（模拟设备，CI 规模，没有 GPU 也能评）：{_scale_zh(spec.ci, spec.kind)}；",
        f"   - 在真卡上（`--backend cuda --scale gpu`）：{_scale_zh(spec.gpu, spec.kind)}。",
        "4. 也可以在终端里评分（先保存 notebook）：`vramlab grade " + spec.id
        + f" exercises/{spec.id}/{spec.id}.ipynb`。",
        "5. 提交后，教师用 nbgrader 自动评分：得分由评分器在你的 kernel 之外、从你提交的 notebook "
        "重新评一次决定；另有隐藏测试（接口不变）。",
    ]
    for i, hint in enumerate(spec.hints, 1):      # folded one by one: each comes nearer to the answer
        if i == 1:
            lines += ["", "## 提示", "", "卡住了再展开，一次一条：越往后越接近答案。"]
        label = "先想一想" if i == 1 else ("最后一条：直接说做法" if i == len(spec.hints) else "再具体一点")
        lines += ["", f"<details><summary>提示 {i}（{label}）</summary>", "", hint, "", "</details>"]
    return "\n".join(lines)


def setup_source(spec) -> str:
    return "\n".join([
        "# 准备：只做导入。模型和数据由评分器在独立子进程里构建，这里不占内存。",
        "import torch",
        "",
        "import vramlab",
        "",
        f"print(\"PyTorch\", torch.__version__, \"| CUDA 可用：\", torch.cuda.is_available())",
    ])


def answer_source(spec) -> str:
    from .grader.kinds import traits

    return "\n".join([
        f"# 起始代码：{traits(spec.kind).starter_problem_zh}。"
        f"修改 `{spec.function}`，保持函数名和参数不变。",
        spec.starter.strip(),
        "",
        "### BEGIN SOLUTION",
        "# ---- 参考答案（生成学员版时，nbgrader 会删除从 BEGIN 到 END 的这一段）----",
        spec.solution.strip(),
        "### END SOLUTION",
    ])


def check_source(spec) -> str:
    from .grader.submission import parameters

    params = parameters(spec.signature)
    visible = [
        "# 评分单元格（只读）：先运行上面所有单元格。",
        "# PyTorch 的警告会写到 stderr，而 nbgrader 把评分单元格里的 stderr 当成失败：这里把它们改写到 stdout。",
        "import contextlib, sys",
        "with contextlib.redirect_stderr(sys.stdout):",
        f"    result = vramlab.check({spec.id!r})",
    ]
    hidden = [
        "### BEGIN HIDDEN TESTS",
        "# 隐藏测试 1：接口不变（题目的参数在前；可以再加带默认值的参数）。",
        "import inspect",
        f"_params = inspect.signature({spec.function}).parameters",
        f"assert list(_params)[:{len(params)}] == {params!r} and all(p.default is not p.empty for p in list(_params.values())[{len(params)}:]), \\",
        f"    \"{spec.function} 的参数必须是 {', '.join(params)}\"",
        "# 隐藏测试 2：check() 的结果自洽。自动评分时 kernel 不测量（deferred），",
        "# 得分由评分器在 kernel 之外从提交的 notebook 复评决定（vramlab/grader/autograde.py）。",
        f"assert result.get(\"deferred\") or (result[\"passed\"] and result[\"correct\"] and result[\"ratio\"] <= {spec.target_ratio!r}), result",
        "### END HIDDEN TESTS",
    ]
    return "\n".join(visible + hidden)


def _cell(kind: str, cell_id: str, source: str, nbgrader: dict | None = None, **meta):
    import nbformat

    make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
    cell = make(source=source)
    cell["id"] = cell_id
    metadata = dict(meta)
    if nbgrader is not None:
        metadata["nbgrader"] = {"grade": False, "locked": False, "schema_version": 3, "solution": False,
                                "task": False, **nbgrader}
    cell["metadata"] = metadata
    return cell


def build_source_notebook(spec):
    """The nbgrader source notebook of one exercise (an `nbformat.NotebookNode`)."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb["nbformat_minor"] = NBFORMAT_MINOR
    sid = spec.id
    nb["cells"] = [
        _cell("markdown", f"{sid}-intro", intro_markdown(spec),
              {"grade_id": f"{sid}-intro", "locked": True}, deletable=False, editable=False),
        _cell("code", f"{sid}-setup", setup_source(spec),
              {"grade_id": f"{sid}-setup", "locked": True}, deletable=False, editable=False),
        _cell("markdown", f"{sid}-answer-title",
              f"## 你的代码\n\n修改下面的 `{spec.function}`。可以增删辅助函数，但函数名和参数要保持不变；"
              "评分器只取这个函数（以及它用到的导入和辅助函数），在独立进程里调用它。"),
        _cell("code", f"{sid}-answer", answer_source(spec),
              {"grade_id": f"{sid}-answer", "solution": True}),
        _cell("markdown", f"{sid}-check-title",
              "## 检查\n\n运行下面的单元格：它打印峰值显存、与起始代码的比例和是否通过；"
              "没通过时会抛出 `AssertionError` 并给出提示。"),
        _cell("code", f"{sid}-check", check_source(spec),
              {"grade_id": f"{sid}-check", "grade": True, "locked": True, "points": spec.points},
              deletable=False, editable=False),
    ]
    nb["metadata"] = {"kernelspec": dict(KERNELSPEC), "language_info": dict(LANGUAGE_INFO)}
    return nb


def dumps(nb) -> str:
    import nbformat

    nbformat.validate(nb)
    return nbformat.writes(nb) + ("" if nbformat.writes(nb).endswith("\n") else "\n")


def normalize_notebook_text(text: str) -> str:
    """The JSON of a notebook with volatile metadata removed (outputs, execution counts, the
    notebook-level language_info that a kernel run fills in), sorted and indented."""
    nb = json.loads(text)
    nb.get("metadata", {}).pop("language_info", None)
    nb.get("metadata", {}).pop("widgets", None)
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        cell.get("metadata", {}).pop("execution", None)
        cell.get("metadata", {}).pop("collapsed", None)
        cell.get("metadata", {}).pop("scrolled", None)
    return json.dumps(nb, ensure_ascii=False, indent=1, sort_keys=True) + "\n"


# --------------------------------------------------------------------------------------------------
# Writing the course tree
# --------------------------------------------------------------------------------------------------
def course_root() -> Path:
    """The repository root (the folder with nbgrader_config.py), from this file's location."""
    return Path(__file__).resolve().parent.parent


def exercise_ids(ids=None) -> list[str]:
    from .exercises import EXERCISES

    ids = list(ids) if ids else list(EXERCISES)
    for i in ids:
        if i not in EXERCISES:
            raise SystemExit(f"未知练习 {i!r}；可选：{'、'.join(EXERCISES)}")
    return ids


def write_sources(root: Path, ids=None) -> list[Path]:
    """Write solutions/<id>/<id>.ipynb (and, in a copy of the course, the solution.py it is built
    from, so that the copy's release is what the repo's would be); returns the paths whose content changed."""
    from .exercises import get_exercise

    changed = []
    for i in exercise_ids(ids):
        spec = get_exercise(i)
        folder = Path(root) / "solutions" / i
        for path, text in ((folder / "solution.py", spec.solution), (folder / f"{i}.ipynb", dumps(build_source_notebook(spec)))):
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
                changed.append(path)
    return changed


def venv_env(extra: dict | None = None) -> dict:
    """os.environ with this interpreter's bin/ first on PATH: nbgrader runs `alembic` (gradebook
    migrations) and `jupyter` from PATH, so a venv that is not activated would not be found."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.update(extra or {})
    return env


def nbgrader_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("nbgrader")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "nbgrader"]


def release(root: Path, ids=None, quiet: bool = True) -> None:
    """`nbgrader generate_assignment <id> --force` for each id, run in `root` (one nbgrader process
    for all of them: starting nbgrader costs seconds), then normalise the released notebooks in
    place (the release of each id is exercises/<id>/<id>.ipynb)."""
    root = Path(root)
    ids = exercise_ids(ids)
    code = f"from vramlab.notebooks import _generate_here; _generate_here({ids!r}, {quiet!r})"
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, env=venv_env())
    if proc.returncode != 0:
        raise RuntimeError(f"nbgrader generate_assignment 失败：\n{proc.stdout}\n{proc.stderr}")
    for i in ids:
        out = root / "exercises" / i / f"{i}.ipynb"
        out.write_text(normalize_notebook_text(out.read_text(encoding="utf-8")), encoding="utf-8")


def _generate_here(ids, quiet: bool = True) -> None:
    """In the course folder (cwd): nbgrader's own API, with the course's nbgrader_config.py."""
    import logging

    from nbgrader.apps import NbGraderAPI
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=os.getcwd()).load_config()
    config.CourseDirectory.root = os.getcwd()
    api = NbGraderAPI(config=config)
    if quiet:
        api.log.setLevel(logging.WARN)
    for i in ids:
        r = api.generate_assignment(i, force=True, create=True)
        if not r["success"]:
            print(r.get("log", ""), r.get("error", ""), file=sys.stderr)
            raise SystemExit(f"generate_assignment {i}")


def copy_course(dest: Path) -> Path:
    """Copy what nbgrader needs (config + solutions) into `dest`; returns `dest`."""
    root = course_root()
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(root / "nbgrader_config.py", dest / "nbgrader_config.py")
    if (root / "solutions").exists():
        shutil.copytree(root / "solutions", dest / "solutions", dirs_exist_ok=True)
    return dest


def diff_trees(a: Path, b: Path) -> list[str]:
    """Relative paths of files that differ (or exist on one side only) between two trees: notebooks,
    and any other file (a solutions/<id>/solution.py that nbgrader copied into the release shows here)."""
    a, b = Path(a), Path(b)

    def files(root):
        return {p.relative_to(root) for p in root.rglob("*") if p.is_file()
                and not {".ipynb_checkpoints", "__pycache__", ".vramlab"} & set(p.parts)}
    names = files(a) | files(b)
    bad = []
    for n in sorted(names):
        pa, pb = a / n, b / n
        if not (pa.exists() and pb.exists()) or not filecmp.cmp(pa, pb, shallow=False):
            bad.append(str(n))
    return bad


def check(ids=None) -> list[str]:
    """Regenerate solutions/ and exercises/ in a temp copy of the course; list what differs from the repo."""
    root = course_root()
    with tempfile.TemporaryDirectory(prefix="vramlab-nb-") as tmp:
        tmp = Path(tmp)
        shutil.copy2(root / "nbgrader_config.py", tmp / "nbgrader_config.py")
        write_sources(tmp, ids)
        release(tmp, ids)
        bad = []
        for tree in ("solutions", "exercises"):
            for i in (exercise_ids(ids) if ids else [""]):       # only the named exercises' folders
                bad += [f"{tree}/{Path(i) / p}" for p in diff_trees(tmp / tree / i, root / tree / i)]
    return bad


def main(argv=None) -> int:
    from .args import ChineseArgumentParser

    parser = ChineseArgumentParser(prog="python -m vramlab.notebooks",
                                     description="从练习规格生成 nbgrader 源 notebook（solutions/）和学员 notebook（exercises/）")
    parser.add_argument("ids", nargs="*", help="练习编号（默认全部）")
    parser.add_argument("--release", action="store_true", help="再运行 nbgrader generate_assignment，更新 exercises/")
    parser.add_argument("--check", action="store_true", help="只检查：在临时目录重新生成并与仓库比较，有差异时退出码 1")
    args = parser.parse_args(argv)
    if args.check:
        bad = check(args.ids)
        if bad:
            print("以下文件与规格生成的结果不一致（运行 scripts/generate_exercises.sh 重新生成）：")
            for p in bad:
                print("  " + p)
            return 1
        print("solutions/ 与 exercises/ 与规格一致。")
        return 0
    root = course_root()
    for p in write_sources(root, args.ids):
        print(f"已写入 {p.relative_to(root)}")
    if args.release:
        release(root, args.ids)
        print("已更新 exercises/（nbgrader generate_assignment）")
    return 0


if __name__ == "__main__":
    sys.exit(main())
