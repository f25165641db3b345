# Two commands do all set-up on a fresh machine (see README):
#   make serve   install what is needed and serve the course at http://127.0.0.1:8000
#   make test    install what is needed and run the whole test suite
#   make check   the fast tier (no processes started): unit tests, judges on recorded results
# torch is pinned: on a CPU-only machine pip takes a local/CPU wheel where one is provided,
# on a Linux machine with an NVIDIA GPU PyPI's default wheel is the CUDA build.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.vramlab-installed

.PHONY: install serve site chromium bubblewrap slurm test check lab bench bench-site calibrate clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/mkdocs serve -a 127.0.0.1:8000

site: $(STAMP)
	bash scripts/build_site.sh

# Browser tests need Debian's Chromium; install it when we may (root + apt), else they say why they skip.
# fonts-noto-cjk: without a CJK font, screenshots show boxes and layout is measured on the wrong glyphs.
chromium:
	@{ command -v chromium >/dev/null 2>&1 && fc-list :lang=zh 2>/dev/null | grep -q .; } || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-noto-cjk >/dev/null) || \
	  echo "chromium 或 fonts-noto-cjk 未安装：浏览器测试将跳过（CI 中会失败）"; }

# The grader runs learner code under bubblewrap (an OS sandbox); install it when we may (root + apt).
bubblewrap:
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null) || \
	  echo "bubblewrap 未安装：评分器只能在没有操作系统沙箱的情况下运行（沙箱测试将跳过；CI 中会失败）"; }

# The Slurm test (tests/test_slurm.py) starts a one-machine cluster from Debian's slurm-wlm and munge
# (scripts/slurm/single_node.sh); install them when we may (root + apt), else it says why it skips.
slurm:
	@{ { command -v slurmctld || [ -x /usr/sbin/slurmctld ]; } && { command -v munged || [ -x /usr/sbin/munged ]; }; } >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null) || \
	  echo "slurm-wlm 或 munge 未安装：Slurm 测试将跳过（CI 中会失败）"; }

# Two test processes (pytest-xdist, a file per process at a time): the graded children of one use
# the core the other's test process leaves idle.
TEST_JOBS ?= 2
test: $(STAMP) chromium bubblewrap slurm
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile --durations=15

# The daily loop: unit tests and the judges on recorded results; no test here may start a process.
check: $(STAMP)
	VRAMLAB_NO_CHILD_PROCESSES=1 $(BIN)/python -m pytest -q -m "not slow" -p no:cacheprovider

lab: $(STAMP) bubblewrap
	$(BIN)/jupyter lab exercises/

bench: $(STAMP)
	$(BIN)/vramlab bench

bench-site: $(STAMP)
	$(BIN)/python scripts/bench_site.py

calibrate: $(STAMP)
	$(BIN)/vramlab calibrate

clean:
	rm -rf site site-offline .pytest_cache
