"""The docs' shown outputs, generated from real runs: cog runs the calls written in the pages through these.

    python scripts/docgen.py write [PAGE ...]   run every command and snippet of the pages, write their output
    python scripts/docgen.py check [PAGE ...]   run them again; fail when a page shows something the code no
                                                longer prints (machine-dependent numbers masked), when a shown
                                                `blocklab` command line does not parse, or a Python block is
                                                not run
    python scripts/docgen.py record [NAME ...]  re-run the long runs (RECORDED) into benchmarks/results/

`make docs` is `write` then the strict site build; `make docs-check` (CI) is `check` then the strict build;
`make results` re-runs the long runs. A generated block in a page (cog's markers sit in HTML comments, so
neither GitHub nor mkdocs shows them):

    <!-- [[[cog sh("blocklab params --preset gpt2") ]]] -->
    ```console
    $ blocklab params --preset gpt2
    ...what the command printed...
    ```
    <!-- [[[end]]] (sum: ...) -->

Commands run in one scratch folder per session (so `runs/listops` in a page is a real run made earlier in the
same session, see `setup`), with a fixed terminal width and no colour. Numbers that depend on the machine
(MACHINE_DEPENDENT: times, rates, load average, free memory) are shown as measured by the last `write`, with a
caption naming the machine; `check` compares everything else exactly.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
BIN = Path(sys.executable).parent  # the venv's bin: `blocklab` and `python` of the pages resolve there
# Pages in the order they are generated; every page also works alone (setup() makes what it needs).
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]

# What depends on the machine, not on the code: masked before `check` compares a page with a fresh run.
MACHINE_DEPENDENT: dict[str, str] = {
    "durations (12.3 s, 450 ms, 2 min, 0:00:37)":
        r"\b\d+(?:[.,]\d+)?(?:-\d+(?:\.\d+)?)? ?(?:h|min|s|ms|us|µs)\b|\b\d+:\d\d:\d\d\b",
    "rates (tokens/s, tok/s, GFLOP/s, it/s)":
        r"\b[\d,]+(?:\.\d+)? ?(?:tokens/s|tok/s|[GT]FLOP/s|it/s)",
    "load average": r"load average:? [\d.]+(?:, [\d.]+)*",
    "free memory (the memory guard's 'X GB is available')": r"[\d.]+ [KMGT]?B is available",
    "the caption naming the machine": r"(?m:^\*Machine-dependent numbers.*$)",
    # a run of a second draws its last frame when the timer does: 75/1000 may show as 2.5 cells or 3
    "how far a progress bar's last frame drew": r"[━╸╺]+ *(?= ?\d+/\d+)",
}
_MASK = re.compile("|".join(f"(?:{p})" for p in MACHINE_DEPENDENT.values()))

__all__ = ["MACHINE_DEPENDENT", "api_reference", "cli_reference", "emit", "explore_shots", "fields_table",
           "head", "kernels", "lines_matching", "listed", "machine", "mask_table", "py_above", "recorded",
           "render", "results_json", "run", "same_kernels", "setup", "sh"]

MODE = os.environ.get("DOCGEN_MODE", "write")  # "write", "check" or "record"; set by main()
# write --keep-measured: where a block's fresh output differs from the shown one only in machine-dependent
# numbers, keep the shown one (as check does): a page written on a busy machine keeps its measured numbers
KEEP_MEASURED = os.environ.get("DOCGEN_KEEP_MEASURED") == "1"
_work: Path | None = None
_outputs: dict[tuple[str, int], str] = {}
_running: list[subprocess.Popen] = []  # the command under way, stopped with its group if docgen is stopped


def _stop(*_: object) -> None:
    for proc in _running:
        os.killpg(proc.pid, signal.SIGKILL)
    sys.exit(143)


# ---- running things --------------------------------------------------------------------------------


def work_dir() -> Path:
    """The session's scratch folder (made on first use, removed at exit): where every command runs."""
    global _work
    if _work is None:
        _work = Path(tempfile.mkdtemp(prefix="blocklab-docs-"))
        atexit.register(shutil.rmtree, _work, ignore_errors=True)
        # `python benchmarks/x.py` works there as in the checkout
        (_work / "benchmarks").symlink_to(ROOT / "benchmarks")
    return _work


# ATen runs AVX-512 kernels where the CPU has them, and their float rounding differs from the AVX2 kernels':
# a training run then takes another path (the default `blocklab train` reached its target at step 125 with
# AVX-512 and 150 with AVX2, on the same code). Pages are written and checked with the AVX2 kernels, so every
# x86-64 machine with AVX2 prints the same numbers (ATen caps the setting at what the CPU has; other
# architectures ignore it). Long recorded runs (`record`) measure speed and keep the machine's best kernels.
SAME_KERNELS_EVERYWHERE = {"ATEN_CPU_CAPABILITY": "avx2"}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CLICOLOR_FORCE")}
    env.update(COLUMNS="100", LINES="40", NO_COLOR="1", PYTHONHASHSEED="0", PYTHONUNBUFFERED="1",
               PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    if MODE != "record":
        env.update(SAME_KERNELS_EVERYWHERE)
    return env


def _normalise(text: str) -> str:
    """Paths of this machine out of the text (the scratch folder, the checkout, site-packages), trailing
    spaces and blank lines off."""
    work = str(work_dir())
    # site-packages first: a virtual environment inside the checkout (CI's .venv) would otherwise
    # lose its absolute prefix to the checkout rule and keep a relative ".venv/lib/..." the rule
    # below no longer matches.
    text = re.sub(r"(?:/[^\s/'\"]+)+/site-packages/", ".../site-packages/", text)
    text = text.replace(work + "/", "").replace(work, ".")
    text = text.replace(str(ROOT) + "/", "").replace(str(ROOT), ".")
    text = "\n".join(line.rstrip() for line in text.splitlines())
    return text.strip("\n")


def run(command: str, status: int = 0, timeout: float = 1200) -> str:
    """Run one shell command in the scratch folder; its stdout and stderr, merged in the order printed.
    A command already run in this session is not run again (pages share runs/listops and the like)."""
    if (command, status) in _outputs:
        return _outputs[command, status]
    started = time.monotonic()
    returncode, stdout = _bash(command, _env(), timeout, f"`{command}`")
    output = _normalise(stdout)
    print(f"docgen: {time.monotonic() - started:5.1f} s  {command.splitlines()[0][:90]}", file=sys.stderr)
    if returncode != status:
        raise RuntimeError(f"`{command}` exited with status {returncode}, the page expects {status}:\n"
                           f"{output}")
    _outputs[command, status] = output
    return output


def _bash(script: str, env: dict[str, str], timeout: float, what: str) -> tuple[int, str]:
    """(status, stdout and stderr) of ``script`` run by bash in the scratch folder. Its own process group,
    so a timeout also stops what it started (worker processes): a RuntimeError naming ``what``."""
    proc = subprocess.Popen(["bash", "-c", script], cwd=work_dir(), env=env, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    _running.append(proc)
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RuntimeError(f"{what} took more than {timeout:.0f} s") from None
    finally:
        _running.remove(proc)
    return proc.returncode, stdout


_MARK = "\x1fdocgen-status"  # ends each command's output in a typed session


def run_typed(commands: list[str], status: int = 0, timeout: float = 2400) -> list[str]:
    """Run commands as a newcomer types them after ``make train``: one after another in one bash session
    (so ``source .venv/bin/activate`` lasts), in a folder where ``.venv`` is the environment make made,
    with the PATH they have (the venv's bin taken out of it): a page that shows ``blocklab`` without
    saying how to reach it fails here. Each command's output, as ``run`` gives it (and caches it)."""
    venv = work_dir() / ".venv"
    if not venv.exists():
        venv.symlink_to(BIN.parent)
    env = _env()
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                  if p and Path(p).resolve() != BIN.resolve())
    env.pop("VIRTUAL_ENV", None)
    script = "".join(f"{command}\nprintf '\\n{_MARK} %s\\n' $?\n" for command in commands)
    started = time.monotonic()
    _, stdout = _bash(script, env, timeout, f"the typed session `{commands[0]}` ...")
    print(f"docgen: {time.monotonic() - started:5.1f} s  (typed) {' ; '.join(commands)[:80]}",
          file=sys.stderr)
    pieces = re.split(rf"\n?{_MARK} (\d+)\n", stdout)
    outputs = []
    for command, text, code in zip(commands, pieces[0::2], pieces[1::2], strict=False):
        output = _normalise(text)
        if int(code) != status:
            raise RuntimeError(f"`{command}`, typed as the page shows it, exited with status {code}, the "
                               f"page expects {status}:\n{output}")
        _outputs[command, status] = output
        outputs.append(output)
    if len(outputs) != len(commands):
        raise RuntimeError(f"the typed session stopped after {len(outputs)} of {len(commands)} commands")
    return outputs


def setup(*commands: str) -> None:
    """Run commands a page relies on (a training run its later commands open), once per session."""
    for command in commands:
        run(command)


# ---- what a block shows ----------------------------------------------------------------------------


def head(n: int) -> Callable[[str], str]:
    """Keep the first n lines of an output."""
    return lambda text: "\n".join(text.splitlines()[:n] + ["..."])


def lines_matching(*patterns: str) -> Callable[[str], str]:
    """Keep the lines matching any of the regexes; '...' where lines were left out."""
    def keep(text: str) -> str:
        out: list[str] = []
        for line in text.splitlines():
            if any(re.search(p, line) for p in patterns):
                out.append(line)
            elif out[-1:] != ["..."]:
                out.append("...")
        return "\n".join(out)
    return keep


def machine() -> str:
    """The machine a measurement ran on, in words, with the CPU kernels its commands ran."""
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in _read_lines("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor() or platform.machine())
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{os.cpu_count()} CPUs ({cpu}, {platform.machine()}), {platform.system()}, "
            f"torch {torch.__version__}, ATen CPU kernels {kernels()}, load average {load:.2f}")


def kernels() -> str:
    """The ATen CPU kernels the pages' commands run, as torch reports them under their environment (AVX2
    where SAME_KERNELS_EVERYWHERE applies; a recorded run's are the machine's best)."""
    return run('python -c "import torch; print(torch.backends.cpu.get_cpu_capability())"')


def same_kernels() -> None:
    """The sentence saying which kernels produced a page's numbers and how to reproduce them."""
    setting = " ".join(f"{name}={value}" for name, value in SAME_KERNELS_EVERYWHERE.items())
    emit(f"Every output on these pages was produced with ATen's {kernels()} CPU kernels (`{setting}`, "
         f"which the docs' generator sets): on a CPU with AVX-512, `export {setting}` first to see the same "
         "digits; without it a 4th digit and the step a training run stops at can differ.\n", exact=True)


def _read_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def _masked(text: str) -> str:
    text = _MASK.sub("#", text)
    return re.sub(r"[ \t─━]+", " ", text)  # column widths and bar lengths follow the masked numbers


def _fence(lang: str, body: str) -> str:
    ticks = "````" if "```" in body else "```"
    return f"{ticks}{lang}\n{body}\n{ticks}\n"


def _caption(body: str) -> str:
    """Under an output with machine-dependent numbers: the machine they were measured on."""
    if not _MASK.search(body):
        return ""
    link = _link_to("contributing.md") + "#machine-dependent-numbers"
    return f"*Machine-dependent numbers ([which]({link})) measured on {machine()}.*\n"


def _link_to(page: str) -> str:
    """A link from the page being written to a docs page (README links into docs/, pages side by side)."""
    current = Path(_cog().inFile).resolve()
    return page if current.parent == ROOT / "docs" else f"docs/{page}"


def _cog():  # cog's module object, present while cog runs a page
    return sys.modules["cog"]


def emit(text: str, exact: bool = False) -> None:
    """Write a block's output. In check mode a fresh output that differs from the shown one only in
    machine-dependent numbers keeps the shown one, so the page stays as measured on its stated machine."""
    cog = _cog()
    previous = getattr(cog, "previous", "")
    if (MODE == "check" or KEEP_MEASURED) and not exact and previous and _masked(previous) == _masked(text):
        text = previous
    cog.out(text)


# ---- the helpers pages call ----------------------------------------------------------------------


def sh(*commands: str | tuple[str, Callable[[str], str]], status: int = 0,
       keep: Callable[[str], str] | None = None, show: str | None = None, typed: bool = False) -> None:
    """Run shell commands; show each as `$ command` followed by what it printed, in one block.

    A command may be a (command, filter) pair to show an excerpt of its output (head, lines_matching);
    keep: the filter for all of them; status: the exit status every command must have (2 for the
    error examples); show: the command as shown, when the one run differs only in a way the reader does
    not need; typed: run them as a newcomer types them (``run_typed``: one shell, their PATH)."""
    parts = []
    items = [item if isinstance(item, tuple) else (item, keep) for item in commands]
    typed_outputs = run_typed([command for command, _ in items], status) if typed else None
    for index, (command, own_keep) in enumerate(items):
        output = typed_outputs[index] if typed_outputs is not None else run(command, status)
        if own_keep is not None:
            output = own_keep(output)
        shown = show if show is not None else command
        parts.append(f"$ {shown}" + (f"\n{output}" if output else ""))
    body = "\n".join(parts)
    emit(_fence("console", body) + _caption(body))


def py_above(status: int = 0, keep: Callable[[str], str] | None = None) -> None:
    """Run the ```python block just above this cog block in a fresh interpreter, in the scratch folder;
    show what it printed (nothing when it printed nothing)."""
    code = fence_above(_cog().inFile, _cog().firstLineNum)
    script = work_dir() / f"snippet_{hashlib.sha1(code.encode()).hexdigest()[:12]}.py"  # one per snippet
    script.write_text(code)
    output = run(f"python {shlex.quote(script.name)}", status)
    if keep is not None:
        output = keep(output)
    emit(_fence("text", output) + _caption(output) if output else "")


def fence_above(path: str, line_number: int) -> str:
    """The body of the ```python block that ends right above line `line_number` (1-based) of a page."""
    lines = Path(path).read_text().splitlines()
    i = line_number - 2
    while i >= 0 and not lines[i].strip():
        i -= 1
    if i < 0 or lines[i].strip() != "```":
        raise RuntimeError(f"{path}:{line_number}: py_above() needs a ```python block right above it")
    end = i
    while i > 0 and not lines[i - 1].startswith("```"):
        i -= 1
    if i == 0 or lines[i - 1].strip() != "```python":
        raise RuntimeError(f"{path}:{line_number}: the block above is not a ```python block")
    return "\n".join(lines[i:end]) + "\n"


def results_json(name: str) -> dict:
    """A committed long run's results, benchmarks/results/NAME."""
    return json.loads((RESULTS / name).read_text())


def listed(python: str) -> None:
    """A line of prose that a table in the code holds (the families blocklab loads, ...): what the Python
    expression ``python`` gives, read from the code on every run, so the page's list is never typed."""
    emit(run(f"python -c {shlex.quote(f'print({python})')}") + "\n", exact=True)


def render(python: str, source: str, markdown: bool = False) -> None:
    """Show what a library renderer prints for a committed results file (`source`, under benchmarks/results);
    markdown: the renderer prints Markdown (a table), shown as is. The check compares it exactly, since
    nothing is re-measured."""
    if not (RESULTS / source).is_file():
        raise RuntimeError(f"benchmarks/results/{source} is missing: run `make results`")
    output = run(f"python -c {shlex.quote(python)}")
    emit(output + "\n" if markdown else _fence("text", output), exact=True)


# The long runs whose printed output the pages show from a record (benchmarks/results/NAME.txt) instead of
# re-running it: name -> the command, run in a scratch folder by `docgen.py record NAME` (make results).
RECORDED: dict[str, str] = {
    "train-loop": "python benchmarks/train_loop.py",
    "hooks-overhead": "python benchmarks/hooks_overhead.py --rounds 300",
    "cache-memory": "python benchmarks/cache_memory.py",
    "generate": "python benchmarks/generate.py",
    "norm-cost": "python benchmarks/norm_cost.py",
    "train-step": "python benchmarks/train_step.py",
    "gpu-check-cpu": "python benchmarks/gpu_check.py --device cpu --quick --out gpu-check",
    "time-to-target": "python benchmarks/time_to_target.py --seeds 0-9",
    "trainer-costs": "python benchmarks/time_to_target.py --costs",
    "optimizer-bits": "python benchmarks/optimizer_bits.py",
    "page-faults": "python benchmarks/page_faults.py",
    "explore-latency": "python benchmarks/explore_latency.py",
    "ablate-demo": "blocklab ablate --task listops --vary norm_position=post,pre --vary n_layers=2,6 "
                   "--seeds 2 --steps 300 --jobs 2 --out runs/ablate-demo",
}


def recorded(name: str) -> None:
    """Show a long run's record (benchmarks/results/NAME.txt, written by `make results`): the command, what it
    printed, and the machine it ran on. The check compares it exactly with the record."""
    text = (RESULTS / f"{name}.txt").read_text().rstrip("\n")
    header, _, output = text.partition("\n")
    command = RECORDED[name]
    if header != f"$ {command}":
        raise RuntimeError(f"benchmarks/results/{name}.txt records `{header[2:]}`, RECORDED says "
                           f"`{command}`: run `make results`")
    body, _, where = output.rpartition("\n")
    emit(_fence("console", f"$ {command}\n{body}") + f"*{where}*\n", exact=True)


def record(name: str) -> None:
    """Run a long command and keep what it printed as benchmarks/results/NAME.txt."""
    before = machine()
    output = run(RECORDED[name], timeout=4 * 3600)
    where = f"Recorded by `make results` on {time.strftime('%Y-%m-%d')}: {before} at the start."
    (RESULTS / f"{name}.txt").write_text(f"$ {RECORDED[name]}\n{output}\n{where}\n")


# ---- screenshots of the live page (docs/explore.md) ----------------------------------------------------


def _drawn_after(before: str) -> str:
    """A JavaScript test: the page has drawn a trace (its data-rendered serial) other than ``before``."""
    return ("(function () { var r = document.documentElement.dataset.rendered; "
            f"return !!r && r !== 'error' && r !== {json.dumps(before)}; }})()")


def explore_shots(command: str, shots: list[dict]) -> None:
    """Start `command` (`blocklab explore ... --port 0`) in the scratch folder, drive Debian's headless
    Chromium through Playwright over each shot, and show the command, the line it printed (with the default
    port), then each screenshot under what the page showed in words (read from the page: `check` compares it).

    A shot: `png` (its file under docs/images/), `alt`, `query` (the page's URL query: model, compare,
    group), `fill` ({selector: text}), `click` ([(selector, selector to wait for, or None: the next trace)]),
    `element` (a selector: the shot is of that element only), `hover` ((a heatmap canvas's selector, row,
    column): the mouse on that cell, its tooltip shown), `read` (a JavaScript expression whose text is shown
    above the image). `write` saves the PNGs; `check` takes them in a scratch folder (the page must
    still work) and compares the words.
    """
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise RuntimeError("explore_shots needs Playwright (the test extra: pip install -e '.[test]')") \
            from None
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise RuntimeError("explore_shots needs chromium: bash scripts/ensure-chromium.sh")
    proc = subprocess.Popen(["bash", "-c", command], cwd=work_dir(), env=_env(), text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    _running.append(proc)
    try:
        line = proc.stdout.readline().strip()
        found = re.search(r"http://[\w.\[\]:]+:(\d+)/", line)
        if found is None:
            raise RuntimeError(f"`{command}` printed no URL: {line}")
        url, shown_line = found.group(0), line.replace(f":{found.group(1)}/", ":8000/")
        parts = [_fence("console", f"$ {command.replace(' --port 0', '')}\n{shown_line}")]
        with sync_playwright() as p, tempfile.TemporaryDirectory() as scratch:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            parts += [_shoot(browser, url, shot, Path(scratch)) for shot in shots]
            browser.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        _running.remove(proc)
    emit("\n".join(parts))


def _shoot(browser: object, url: str, shot: dict, scratch: Path) -> str:
    """One screenshot of the page (see explore_shots); the words read from it, and the image's Markdown."""
    page = browser.new_page(viewport={"width": 1400, "height": shot.get("height", 900)})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url + shot.get("query", ""))
    page.wait_for_function(_drawn_after(""), timeout=120_000)
    for selector, text in shot.get("fill", {}).items():
        before = page.evaluate("document.documentElement.dataset.rendered")
        page.fill(selector, text)
        page.wait_for_function(_drawn_after(before), timeout=120_000)
    for selector, wait in shot.get("click", []):
        before = page.evaluate("document.documentElement.dataset.rendered")
        page.click(selector)
        if wait:
            page.wait_for_selector(wait, timeout=120_000)
        else:
            page.wait_for_function(_drawn_after(before), timeout=120_000)
    if shot.get("hover"):
        canvas, row, column = shot["hover"]
        page.locator(canvas).scroll_into_view_if_needed()
        box, cell = page.locator(canvas).bounding_box(), page.eval_on_selector(canvas, "c => c.cell")
        page.mouse.move(box["x"] + cell["left"] + (column + 0.5) * cell["cw"],
                        box["y"] + cell["top"] + (row + 0.5) * cell["ch"])
        page.wait_for_selector("#tip:not([hidden])")
    words = str(page.evaluate(shot["read"])) if shot.get("read") else ""
    target = (ROOT / "docs" / "images" if MODE == "write" else scratch) / shot["png"]
    target.parent.mkdir(parents=True, exist_ok=True)
    (page.locator(shot["element"]).first if shot.get("element") else page).screenshot(path=str(target))
    page.close()
    if errors:
        raise RuntimeError(f"the page logged errors for {shot['png']}: {errors}")
    return (f"{words}\n\n" if words else "") + f"![{shot['alt']}](images/{shot['png']})\n"


def fields_table(dotted: str, meanings: dict[str, str]) -> None:
    """A config dataclass's fields and defaults, read from the code, beside the meaning the page gives each.
    A field the page does not explain, or an explanation of a field the code does not have, stops the run."""
    import dataclasses
    import importlib

    module, _, name = dotted.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    fields = [f for f in dataclasses.fields(cls) if f.init]  # what a user can set (not derived bookkeeping)
    names = [f.name for f in fields]
    missing, unknown = [n for n in names if n not in meanings], [n for n in meanings if n not in names]
    if missing or unknown:
        raise RuntimeError(f"fields_table({dotted}): explain {missing} in the page; {unknown} are not fields")
    rows = "\n".join(f"| `{f.name}` | `{f.default!r}` | {meanings[f.name]} |" for f in fields)
    emit(f"| field | default | meaning |\n|---|---|---|\n{rows}\n", exact=True)


def mask_table() -> None:
    """The masked patterns, for the contributor page."""
    rows = "\n".join(f"| {what} | `{pattern.replace('|', chr(92) + '|')}` |"
                     for what, pattern in MACHINE_DEPENDENT.items())
    emit(f"| what | regular expression |\n|---|---|\n{rows}\n", exact=True)


# ---- the CLI reference, from the parsers ---------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    import importlib

    for module in ("blocklab.cli", "blocklab.cli.main"):
        build = getattr(importlib.import_module(module), "build_parser", None)
        if build is not None:
            return build()
    raise RuntimeError("no build_parser in blocklab.cli")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.ArgumentParser]]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help or "" for a in action._choices_actions}
    return {name: (helps.get(name, ""), p) for name, p in action.choices.items()}


def _slug(heading: str) -> str:
    """The anchor mkdocs (and GitHub) give a heading."""
    return re.sub(r"[\s-]+", "-", re.sub(r"[^\w\s-]", "", heading.lower())).strip("-")


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _option_rows(parser: argparse.ArgumentParser, group: argparse._ArgumentGroup) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in group._group_actions:
        if action.help == argparse.SUPPRESS:
            continue
        names = ", ".join(f"`{n}`" for n in action.option_strings) or f"`{action.dest}`"
        if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
            value = " ".join(f"`{c}`" for c in action.choices).replace("|", "\\|")
        elif action.nargs == 0:
            value = ""
        else:
            value = f"`{formatter._metavar_formatter(action, action.dest.upper())(1)[0]}`".replace("|", "\\|")
            if action.nargs in ("?", "*"):
                value = f"[{value}]"
        default = action.default
        hidden = default in (None, argparse.SUPPRESS, False) or action.nargs == 0
        shown_default = "" if hidden else f"`{default}`"
        help_text = formatter._expand_help(action) if action.help else ""
        rows.append(f"| {names} | {value} | {_cell(shown_default)} | {_cell(help_text)} |")
    return rows


def cli_reference() -> None:
    """One section per subcommand: what it does and a table of its flags, read from the argparse parsers.
    A group of flags shared by several commands is listed in full once and linked from the others."""
    parser = _parser()
    out = ["Generated from the argparse parsers (`blocklab COMMAND --help` prints the same).\n",
           "| command | what it does |", "|---|---|"]
    commands = _subcommands(parser)
    out += [f"| [`{name}`](#blocklab-{name}) | {_cell(help_text)} |"
            for name, (help_text, _) in commands.items()]
    out.append("")
    top = [g for g in parser._action_groups if any(not isinstance(a, (argparse._SubParsersAction,
                                                                      argparse._HelpAction))
                                                  for a in g._group_actions)]
    if top:
        out.append("Top-level flags (before or after the command):\n")
        out += ["| flag | value | default | meaning |", "|---|---|---|---|"]
        for group in top:
            out += [r for r in _option_rows(parser, group) if "`--help`" not in r and "SubParsers" not in r]
        out.append("")
    listed: dict[tuple[str, tuple[str, ...]], tuple[str, str]] = {}
    for name, (help_text, sub) in commands.items():
        out.append(f"## `blocklab {name}`\n")
        out.append(_cell(sub.description or help_text) + "\n")
        for group in sub._action_groups:
            rows = [r for r in _option_rows(sub, group) if not r.startswith("| `-h`")]
            if not rows:
                continue
            title = group.title or "flags"
            heading = f"`blocklab {name}`: {title}"
            key = (title, tuple(rows))
            if key in listed:
                out.append(f"**{title}**: the same flags as [{listed[key][0]}](#{listed[key][1]}).\n")
                continue
            listed[key] = (f"`blocklab {name}`", _slug(heading))
            out.append(f"### {heading}\n")
            out += ["| flag | value | default | meaning |", "|---|---|---|---|", *rows, ""]
    emit("\n".join(out) + "\n", exact=True)


def api_reference(skip: tuple[str, ...] = ("blocklab.cli", "blocklab.__main__")) -> None:
    """The public API (blocklab.__all__) as a table, then one mkdocstrings section per module of the package
    (the CLI has its own page), so a new module or export appears without editing the page."""
    import importlib
    import pkgutil

    import blocklab

    out = ["| `import blocklab as bl` | defined in | what it is |", "|---|---|---|"]
    for name in blocklab.__all__:
        obj = getattr(blocklab, name)
        module = getattr(obj, "__module__", None)
        if module is None or not callable(obj) or module == "builtins":
            continue
        doc = (obj.__doc__ or "").strip().splitlines()[:1]
        anchor = f"{module}.{obj.__qualname__}"
        out.append(f"| [`bl.{name}`](#{anchor}) | `{module}` | {_cell(doc[0] if doc else '')} |")
    out.append("")
    modules = sorted(m.name for m in pkgutil.walk_packages(blocklab.__path__, "blocklab.")
                     if not m.name.startswith(skip))
    for module in modules:
        importlib.import_module(module)
        out += [f"## `{module}`\n", f"::: {module}", "    options:", "      show_root_heading: false",
                "      show_root_toc_entry: false", ""]
    emit("\n".join(out) + "\n", exact=True)


# ---- checks beyond cog ---------------------------------------------------------------------------


_FENCE = re.compile(r"^(`{3,})(\w*)\s*$")


def _fences(path: Path) -> Iterable[tuple[int, str, list[str], int]]:
    """(line of the opening fence, language, body lines, line after the closing fence) of every block."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m:
            j = i + 1
            while j < len(lines) and lines[j].strip() != m.group(1):
                j += 1
            yield i + 1, m.group(2), lines[i + 1:j], j + 1
            i = j
        i += 1


def shown_commands(path: Path) -> Iterable[tuple[int, list[str]]]:
    """Every `blocklab ...` command line in the page's bash/console blocks, as argv after `blocklab`."""
    for start, lang, body, _ in _fences(path):
        if lang not in ("bash", "console", "sh", "shell"):
            continue
        joined: list[tuple[int, str]] = []
        for k, line in enumerate(body):
            if joined and joined[-1][1].endswith("\\"):
                joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line.strip())
            else:
                joined.append((start + 1 + k, line))
        for number, line in joined:
            text = line.strip()
            if lang == "console":
                if not text.startswith("$ "):
                    continue
                text = text[2:]
            words = shlex.split(text, comments=True)
            at = next((k for k, w in enumerate(words) if w == "blocklab" or w.endswith("/blocklab")), None)
            if at is not None and (at == 0 or words[at - 1] == "-m" or words[at] != "blocklab"):
                yield number, words[at + 1:]


def check_commands(pages: list[str]) -> list[str]:
    """Problems: a shown blocklab command line that the parser refuses."""
    import contextlib
    import io

    parser = _parser()
    problems = []
    for page in pages:
        for number, words in shown_commands(ROOT / page):
            if "--help" in words or "-h" in words or "--version" in words:
                continue
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err):
                    parser.parse_args(words)
            except SystemExit as e:
                if e.code:
                    message = err.getvalue().strip().splitlines()[-1:] or ["(no message)"]
                    problems.append(f"{page}:{number}: `blocklab {shlex.join(words)}` does not parse: "
                                    f"{message[0]}")
    return problems


def check_python_blocks(pages: list[str]) -> list[str]:
    """Problems: a ```python block that no py_above() runs (unless marked `<!-- not run: why -->`)."""
    problems = []
    for page in pages:
        lines = (ROOT / page).read_text().splitlines()
        for start, lang, _, after in _fences(ROOT / page):
            if lang != "python":
                continue
            following = next((line for line in lines[after:] if line.strip()), "")
            if "[[[cog py_above(" not in following and "<!-- not run:" not in following:
                problems.append(f"{page}:{start}: this ```python block is not run: follow it with "
                                "<!-- [[[cog py_above() ]]] --> ... <!-- [[[end]]] -->")
    return problems


# ---- the command ---------------------------------------------------------------------------------


def _cog_args(mode: str, pages: list[str]) -> list[str]:
    args = ["cog", "-r", "-c", "-I", str(ROOT / "scripts"), "-p", "from docgen import *", "--verbosity=1"]
    if mode == "check":
        args = ["cog", "--check", "--diff", "-c", "-I", str(ROOT / "scripts"), "-p", "from docgen import *",
                "--check-fail-msg=run `make docs` and commit the pages"]
    return args + pages


def _split(pages: list[str], jobs: int) -> list[list[str]]:
    """Pages in `jobs` groups of about equal work (counted in blocks that run something), order kept."""
    runs = re.compile(r"\b(?:sh|py_above|setup)\(")
    cost = {page: 1 + len(runs.findall((ROOT / page).read_text())) for page in pages}
    groups: list[list[str]] = [[] for _ in range(jobs)]
    for page in sorted(pages, key=lambda p: -cost[p]):
        min(groups, key=lambda g: sum(cost[p] for p in g)).append(page)
    return [sorted(g, key=pages.index) for g in groups if g]


def main(argv: list[str] | None = None) -> int:
    """write | check | record, as in the module docstring."""
    global MODE
    parser = argparse.ArgumentParser(prog="docgen", description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["write", "check", "record"])
    parser.add_argument("names", nargs="*", help="pages (write, check) or records (record); default: all")
    parser.add_argument("--keep-measured", action="store_true",
                        help="write: keep the shown machine-dependent numbers of every block whose output "
                             "changed in nothing else (for a page written on a busy machine)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="pages generated in parallel, each group in its own session (default: 2 for "
                             "check; 1 for write, so measured times see no docs job beside them)")
    args = parser.parse_intermixed_args(argv)
    signal.signal(signal.SIGTERM, _stop)  # a stopped run stops its command and removes its scratch folder
    if args.keep_measured:
        global KEEP_MEASURED
        KEEP_MEASURED = True
        os.environ["DOCGEN_KEEP_MEASURED"] = "1"  # the parallel jobs' children read it
    os.chdir(ROOT)
    if args.mode == "record":
        MODE = "record"
        for name in args.names or list(RECORDED):
            record(name)
        return 0
    pages = args.names or PAGES
    jobs = args.jobs or (2 if args.mode == "check" else 1)
    started = time.monotonic()
    if jobs > 1 and len(pages) > 1:
        workers = [subprocess.Popen([sys.executable, __file__, args.mode, "--jobs", "1", *group])
                   for group in _split(pages, jobs)]
        status = max(w.wait() for w in workers)
        took = time.monotonic() - started
        print(f"docgen: {args.mode} of {len(pages)} pages in {jobs} jobs took {took:.0f} s", file=sys.stderr)
        return status
    MODE = os.environ["DOCGEN_MODE"] = args.mode
    sys.modules.setdefault("docgen", sys.modules[__name__])  # the pages' `from docgen import *` sees MODE
    from cogapp import Cog

    status = 0
    for page in pages:  # one page at a time, so a failing page does not stop the others
        status = max(status, Cog().main(_cog_args(args.mode, [page])))
    problems = check_commands(pages) + check_python_blocks(pages)
    for problem in problems:
        print(f"docgen: {problem}", file=sys.stderr)
    took = time.monotonic() - started
    print(f"docgen: {args.mode} of {', '.join(pages)} took {took:.0f} s", file=sys.stderr)
    return 1 if status or problems else 0


if __name__ == "__main__":
    sys.exit(main())
