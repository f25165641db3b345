"""README is for users: short, the two commands, links that resolve, no measured timings (those
live in vramlab/data/perf/history.jsonl and the performance page, which must render)."""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_is_short_and_gives_the_two_commands():
    assert len(README.encode("utf-8")) <= 8 * 1024
    assert "make serve" in README and "make test" in README


def test_readme_links_resolve():
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_readme_carries_no_dated_measurements():
    assert not re.search(r"20\d\d-\d\d-\d\d", README), "dates belong with measurements, on the performance page"
    assert not re.search(r"\d+(\.\d+)?\s*(秒|分钟|分 \d+ 秒|MiB|GiB|倍)", README)


def test_performance_history_renders_every_benchmark_the_page_asks_for():
    import importlib.util
    spec = importlib.util.spec_from_file_location("performance_hook", ROOT / "docs" / "hooks" / "performance.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (ROOT / "docs" / "dev" / "performance.md").read_text(encoding="utf-8")
    rendered = hook.on_page_markdown(page, None, None, None)
    assert "perf-history" not in rendered and rendered.count("| 日期 |") == len(hook.MARK.findall(page))
    for line in (ROOT / "vramlab" / "data" / "perf" / "history.jsonl").read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        assert entry["command"] and entry["figures"] and entry["date"] and entry["benchmark"]


# -- every `vramlab ...` command the docs show is one the command line accepts ---------------------

DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


def documented_commands() -> list[tuple[str, str]]:
    """(file, command) for each `vramlab ...` in inline code or a shell block. Left out: a bare
    subcommand name in prose (`vramlab grade`) and usage synopses ([--option ...])."""
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        lines = [m.group(1) for m in re.finditer(r"`((?:\.venv/bin/)?vramlab [^`\n]+)`", text)]
        for block in re.findall(r"```(?:bash|sh|shell|console)?\n(.*?)```", text, re.S):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                line = re.split(r"\s+#", line.strip().removeprefix("$ "))[0].strip()
                if re.match(r"(\.venv/bin/)?vramlab ", line):
                    lines.append(line)
        for line in lines:
            if len(line.split()) > 2 and "[-" not in line:
                found.append((str(path.relative_to(ROOT)), line))
    return sorted(set(found))


def _refusal(command: str) -> str | None:
    """None if the command line accepts `command`, else its (Chinese) complaint. Placeholders
    (<编号>, a lone N or M) stand for a value."""
    import contextlib
    import io
    import shlex

    from vramlab.cli import parser_for

    argv = shlex.split(re.sub(r"(?<=\s)[NM](?=\s|$)", "1", re.sub(r"<[^>]+>", "x", command)))[1:]
    parser, rest = parser_for(argv)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(rest)
    except SystemExit as e:
        if e.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1]
    return None


def test_every_documented_command_parses():
    commands = documented_commands()
    assert len(commands) >= 30, commands          # fewer means the extraction broke
    refused = [f"{where}: {command}: {why}" for where, command in commands if (why := _refusal(command))]
    assert not refused, "the docs show commands the command line refuses:\n" + "\n".join(refused)


def test_the_command_check_refuses_a_wrong_command():
    assert _refusal("vramlab tutorials run ch07") is not None          # chapters go in --only
    assert _refusal("vramlab grade-class --slurm --tasks 0") is not None
    assert _refusal("vramlab tutorials run --only ch07") is None
    assert _refusal("vramlab grade-class --slurm --tasks 2 --mem 4G") is None
