"""The command lines' shared parts, in Chinese: the argument parser, value types and error reporting.

A leaf module (it imports only vramlab.errors): every command line of vramlab (cli.py, the grader's
subcommands, the batch, notebooks, tutorials, evidence, plan) builds its parser from here.

    ChineseArgumentParser   argparse whose usage, help and errors are Chinese; `--json` also gets the
                            error as one JSON object on stdout; exit code 2
    CliError                a user-facing failure (Chinese message, exit code), printed without a traceback
    report_error            print one such failure (and its JSON object with --json)
    positive_int, non_negative_int, positive_seconds    argparse types with Chinese messages
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys

from .errors import EXIT_FAILED, EXIT_GRADER, EXIT_MEMORY, EXIT_UNREADABLE, EXIT_USAGE

ERROR_KINDS = {EXIT_FAILED: "failed", EXIT_USAGE: "bad_arguments", EXIT_UNREADABLE: "unreadable_submission",
               EXIT_GRADER: "grader_error", EXIT_MEMORY: "out_of_memory"}


class CliError(Exception):
    """A user-facing failure: printed in Chinese, no traceback; exit code `code` (default 2)."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


def report_error(message: str, code: int, as_json: bool = False, kind: str | None = None, **context) -> int:
    """Print a failure (Chinese, stderr; with `as_json` also one JSON object on stdout); returns `code`."""
    print(f"错误：{message}", file=sys.stderr)
    if as_json:
        doc = {"error": kind or ERROR_KINDS.get(code, "failed"), "message": message, "exit_code": code, **context}
        print(json.dumps(doc, ensure_ascii=False), flush=True)
    return code


class ChineseHelpFormatter(argparse.HelpFormatter):
    def add_usage(self, usage, actions, groups, prefix=None):
        super().add_usage(usage, actions, groups, "用法：" if prefix is None else prefix)


class ChineseArgumentParser(argparse.ArgumentParser):
    """argparse in Chinese: usage, section titles, -h and every error message; `--json` on the
    command line also gets the error as one JSON object on stdout. Exit code 2."""

    _PATTERNS = [
        (r"argument command: invalid choice: '?([^' ]*)'? \(choose from (.*)\)", "未知子命令 {0!r}，可选：{1}"),
        (r"argument (\S+): invalid choice: '?([^' ]*)'? \(choose from (.*)\)", "参数 {0} 的取值 {1!r} 无效，可选：{2}"),
        (r"argument (\S+): invalid (int|float) value: '(.*)'", "参数 {0} 需要{1}，收到 {2!r}"),
        (r"argument (\S+): invalid (\S+) value: '(.*)'", "参数 {0} 的取值 {2!r} 无效"),
        (r"argument (\S+): expected one argument", "参数 {0} 后面需要一个值"),
        (r"argument (\S+): expected at most one argument", "参数 {0} 最多接受一个值"),
        (r"argument (\S+): expected at least one argument", "参数 {0} 后面至少需要一个值"),
        (r"argument (\S+): expected (\d+) arguments?", "参数 {0} 后面需要 {1} 个值"),
        (r"argument (\S+): not allowed with argument (\S+)", "参数 {0} 不能和 {1} 同时使用"),
        (r"argument (\S+): ignored explicit argument '(.*)'", "参数 {0} 不接受值，收到 {1!r}"),
        (r"ambiguous option: (\S+) could match (.*)", "参数 {0} 不明确，可能是：{1}"),
        (r"one of the arguments (.*) is required", "需要以下参数之一：{0}"),
        (r"unrecognized arguments: (.*)", "无法识别的参数：{0}"),
        (r"the following arguments are required: (.*)", "缺少必需参数：{0}"),
        (r"argument (\S+): (.*)", "参数 {0}：{1}"),            # a type's own (Chinese) message
    ]

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", ChineseHelpFormatter)
        add_help = kwargs.pop("add_help", True)
        super().__init__(*args, add_help=False, **kwargs)
        self._positionals.title = "位置参数"
        self._optionals.title = "选项"
        if add_help:
            self.add_argument("-h", "--help", action="help", default=argparse.SUPPRESS, help="显示这段帮助并退出")

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    @classmethod
    def translate(cls, message: str) -> str:
        for pattern, zh in cls._PATTERNS:
            m = re.search(pattern, message)
            if m:
                groups = [{"int": "整数", "float": "数字"}.get(g, g) for g in m.groups()]
                return zh.format(*groups)
        return message

    def error(self, message):
        message = self.translate(message)
        self.print_usage(sys.stderr)
        print(f"错误：{message}（用 -h 查看帮助）", file=sys.stderr)
        if "--json" in getattr(self, "_argv", ()):
            print(json.dumps({"error": "bad_arguments", "message": message, "exit_code": EXIT_USAGE}, ensure_ascii=False))
        sys.exit(EXIT_USAGE)


def int_at_least(minimum: int, what: str):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"需要{what}，收到 {text!r}")
        return value
    return parse


positive_int = int_at_least(1, "正整数")
non_negative_int = int_at_least(0, "非负整数")


def positive_seconds(text):
    """A time limit: a finite number of seconds above 0 (0, negatives, nan and inf are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"需要秒数，收到 {text!r}")
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"时限必须是大于 0 的有限秒数，收到 {text!r}")
    return value
