"""The user docs hold together: every relative link in README.md and docs/ points at a file (and heading) that
exists, every `make finetune` / `make print-config` line they show composes and validates, and every `make
benchmark*` line composes and passes the benchmark's check, so no page shows a key, an option or a value the
config does not accept."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.helpers import ROOT, command_lines, compose_config, shared

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         *sorted((ROOT / "docs" / "benchmarks").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(page: Path) -> str:
    """The page without its fenced code blocks (a command there is not a link)."""
    return FENCE.sub("", page.read_text())


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(page).splitlines():
        if m := re.match(r"#{1,6}\s+(.*)", line):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
        elif anchor and dest.is_dir() and anchor not in _anchors(dest / "README.md"):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}/README.md")
    assert not broken, broken


def _make_lines() -> list[list[str]]:
    """The words after `make finetune` / `make print-config` of every such line in a page's code blocks, the
    make-only variables translated as the Makefile does (nproc=N is distributed.num_processes, dry_run
    dropped)."""
    out = []
    for page in PAGES:
        for block in FENCE.findall(page.read_text()):
            for text in command_lines(block.splitlines()[1:-1]):
                if not re.match(r"([A-Z_]+=\S+ )*make (finetune|print-config)\b", text):
                    continue
                words = shlex.split(text.split("  #")[0])
                while words and re.match(r"[A-Z_]+=", words[0]):  # WANDB_MODE=offline make ...
                    words = words[1:]
                if words[:2] in (["make", "finetune"], ["make", "print-config"]):
                    out.append([f"distributed.num_processes={w[6:]}" if w.startswith("nproc=") else w
                                for w in words[2:] if not w.startswith("dry_run=")])
    return out


def _names_a_path(word: str) -> bool:
    """A data file or checkpoint that stands for the user's own (tests/data/test_glue_files.py loads the GLUE,
    CoNLL and SQuAD ones with real files in their place)."""
    key, _, value = word.partition("=")
    return key.endswith("_file") or key == "task.extra_validation_splits" or (key == "checkpoint.resume"
                                                                              and value != "latest")


def test_documented_make_finetune_lines_compose_and_validate():
    """A misspelt key or option, or a value out of range, in a documented command would fail here, as it fails
    for the user (exit 2); lines that name no file of the user's also pass validate()."""
    from ampft.validation import validate

    lines = _make_lines()
    assert len(lines) >= 30
    for words in {tuple(x): x for x in lines}.values():
        cfg = compose_config("finetune", words)
        if not any(_names_a_path(w) for w in words):
            validate(cfg)


BENCHMARK_TARGETS = {"benchmark": [], "benchmark-gpu": ["benchmark=bert-large-seq384"],
                     "benchmark-peer": ["benchmark=peer-sst2-minilm"]}  # what the Makefile adds


def test_documented_make_benchmark_lines_compose_and_check():
    """Every arm of every documented benchmark command composes and validates (`benchmark.check`), with random
    weights where a Hub model is not here (bert-large)."""
    from ampft.benchmark import check

    shared("sst2")  # the comparisons train on SST-2
    lines = []
    for page in PAGES:
        for block in FENCE.findall(page.read_text()):
            for text in command_lines(block.splitlines()[1:-1]):
                if re.match(r"make benchmark", text) and (words := shlex.split(text, comments=True))[1] in \
                        BENCHMARK_TARGETS:
                    lines.append(words)
    assert len(lines) >= 8
    for words in lines:
        b = compose_config("benchmark_recipe", [*BENCHMARK_TARGETS[words[1]], *words[2:]]).benchmark
        if "bert-large" in [b.model, *(o.split("=")[-1] for a in b.arms for o in a.overrides)]:
            b.extra = [*b.extra, "model.pretrained=false"]
        check(b)
