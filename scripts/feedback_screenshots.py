"""Screenshots of the grader's report for failed attempts, from a real Jupyter run (the learner guide's
evidence: docs/guide/learners.md, "怎样读评分报告").

For each attempt below: a notebook that defines the attempt's function and runs the exercise's check
cell (`vramlab.check(...)`, as in exercises/<id>/<id>.ipynb) is executed in a fresh Jupyter kernel
(nbclient), rendered to HTML (nbconvert, JupyterLab template) and the check cell's output is
photographed in headless Chromium (playwright driving the system's chromium; `make chromium`).

    .venv/bin/python scripts/feedback_screenshots.py [ch07 ch21 ch05]

Writes docs/assets/feedback/<name>.png and, next to each, the executed notebook's HTML (.html is not
committed: /tmp). The gradings run on the simulated device in the OS sandbox, like any check.
"""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "assets" / "feedback"

ATTEMPTS = {
    # checkpointing the whole model as one block: the forward saves nothing, the backward recomputes
    # every block at once and the peak comes back where it was
    "ch07": ("ch07-checkpoint", "第 7 章：把整个模型当作一个检查点", '''\
        import torch
        from torch.utils.checkpoint import checkpoint


        def train_step(model, optimizer, batch, device):
            """整个模型的前向当作一个检查点：前向什么都不存，反向时整个模型重算一遍。"""
            def run(ids):
                return model(input_ids=ids, labels=ids).loss
            loss = checkpoint(run, batch, use_reentrant=False)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss.item()
        '''),
    # one of the two leaks fixed (the entropy sum), the hook's left: fine on the visible card,
    # out of memory on the hidden one
    "ch21": ("ch21-leak", "第 21 章：只修好了一处泄漏", '''\
        import torch


        def train_step(model, optimizer, batch, device):
            """熵只留 Python 数（修好了）；MLP 激活值的钩子还连着计算图（没修）。"""
            mon = _monitor(model)
            out = model(input_ids=batch, labels=batch)
            with torch.no_grad():
                logp = torch.log_softmax(out.logits, dim=-1)
                entropy = -(logp.exp() * logp).sum(-1).mean()
            mon["entropy_sum"] += entropy.item()
            mon["steps"] += 1
            del logp, entropy
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return out.loss.item()


        def _monitor(model):
            if not hasattr(model, "_monitor"):
                mon = {"mlp_act": [], "entropy_sum": 0.0, "steps": 0}

                def record(module, args, output):
                    mon["mlp_act"].append(output.abs().mean())

                for block in model.transformer.h:
                    block.mlp.act.register_forward_hook(record)
                model._monitor = mon
            return model._monitor
        '''),
    # each chunk's mean loss divided by the number of chunks: the whole batch's mean only when every
    # chunk has as many rows (B divisible by the count)
    "ch05": ("ch05-accumulation", "第 5 章：每一块的损失除以块数", '''\
        import torch


        def train_step(model, optimizer, batch, device):
            """分成 4 块，每块的平均损失除以块数：只有各块一样大时才等于整批的平均损失。"""
            n_chunks = 4
            total = 0.0
            for chunk in batch.chunk(n_chunks):
                loss = model(input_ids=chunk, labels=chunk).loss / n_chunks
                loss.backward()
                total += loss.item()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return total
        '''),
}


def notebook(exercise: str, title: str, source: str):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell(f"# {title}\n\n一次没有通过的尝试，以及检查单元格打印的评分报告。"),
        nbformat.v4.new_code_cell("import vramlab"),
        nbformat.v4.new_code_cell(textwrap.dedent(source).strip()),
        nbformat.v4.new_code_cell("import contextlib, sys\nwith contextlib.redirect_stderr(sys.stdout):\n"
                                  f"    result = vramlab.check({exercise!r})"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def run(name: str) -> Path:
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    exercise, title, source = ATTEMPTS[name]
    nb = notebook(exercise, title, source)
    NotebookClient(nb, timeout=900, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    html, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    page = Path("/tmp") / f"vramlab-feedback-{name}.html"
    page.write_text(html, encoding="utf-8")
    nbformat.write(nb, str(page.with_suffix(".ipynb")))
    OUT.mkdir(parents=True, exist_ok=True)
    png = OUT / f"{name}-report.png"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        view = browser.new_page(viewport={"width": 1100, "height": 900}, device_scale_factor=1)
        view.goto(page.as_uri())
        view.wait_for_load_state("networkidle")
        # the check cell: its code and its output (the report, the figure, the AssertionError's first lines)
        cell = view.locator(".jp-Cell.jp-CodeCell").last
        cell.screenshot(path=str(png))
        browser.close()
    return png


def main(argv: list[str]) -> int:
    for name in argv or list(ATTEMPTS):
        print(f"{name}: {run(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
