"""SGLang's own refusals after its parser, against the real release: every check the controller
and the simulator make gives the verdict SGLang 0.5.23 gives (its final line, file and line),
and the node check, which asks the installed SGLang itself, refuses the same command lines.

The reference machine has no GPU: the probe answers the two questions SGLang's resolution asks
the machine (sglang_fleet.reference.catalogue_probe._answer_hardware) as an 8-GPU CUDA node
with 96 GB GPUs would; everything else the checks read comes from the arguments and the model's
config.json (a folder with Kimi-K2.5's language-model shape, refenv.sample_model_dir).
"""

from __future__ import annotations

import random
import re
import textwrap

import pytest

from sglang_fleet.known.catalogue import catalogue
from sglang_fleet.known.sglang_checks import CHECKS_0_5_23, STAGE_FRAMES, refusals
from sglang_fleet.node.deploy.argcheck import parse_args
from sglang_fleet.reference import refenv
from sglang_fleet.sim.args.server_args import prepare_server_args
from sglang_fleet.sim.engine.failures import HEADS_FRAMES, SGLangError

VERSION = "0.5.23"

# A command line for each check, which that check (and no earlier one) refuses.
CASE_OF_CHECK = {
    "prefill-transfer-backend": ["--tp-size", "8", "--disaggregation-mode", "prefill",
                                 "--disaggregation-transfer-backend", "fake"],
    "attn-dp-positive": ["--tp-size", "8", "--attn-dp-size", "0"],
    "dp-with-attn-dp": ["--tp-size", "8", "--dp-size", "2", "--attn-dp-size", "2"],
    "tp-divides-attn-dp": ["--tp-size", "8", "--attn-dp-size", "3"],
    "tp-pp-over-nodes": ["--tp-size", "16", "--nnodes", "3"],
    "pp-micro-batch": ["--tp-size", "8", "--pp-max-micro-batch-size", "0"],
    "graph-padding-vs-compile": ["--tp-size", "8", "--disable-cuda-graph-padding",
                                 "--enable-torch-compile"],
    "multi-node-dp": ["--tp-size", "16", "--dp-size", "2", "--nnodes", "2"],
    "base-gpu-id": ["--tp-size", "8", "--base-gpu-id", "-1"],
    "gpu-id-step": ["--tp-size", "8", "--gpu-id-step", "0"],
    "moe-dense-tp": ["--tp-size", "8", "--moe-dense-tp-size", "4"],
    "served-name-colon": ["--tp-size", "8", "--served-model-name", "kimi:prod"],
    "tokenizer-workers": ["--tp-size", "8", "--tokenizer-worker-num", "0"],
    "detokenizer-workers": ["--tp-size", "8", "--detokenizer-worker-num", "0"],
    "mm-processor-workers": ["--tp-size", "8", "--mm-processor-worker-num", "-1"],
    "mm-io-workers": ["--tp-size", "8", "--mm-io-worker-num", "-1"],
    "parallel-topology": ["--tp-size", "8", "--ep-size", "3"],
}

# Every post-parse check of SGLang 0.5.23, and who refuses it: the controller (every host,
# before any node is touched), the node check (the installed SGLang's own verdict, before
# anything on the node changes) and the simulator. Each cell is "yes" or says why not.
TABLE = {
    **{check.id: ("yes", "yes", "yes") for check in CHECKS_0_5_23},
    "model: attention heads / attention TP (models/deepseek_v2.py:2057, llama.py:183)": (
        "yes, for a model it knows (data/models.yml); others: no, it has no config.json",
        "yes: the node's config.json (module_utils/gpu/modelfit)",
        "yes: at model load, with SGLang's traceback"),
    "model: key/value heads / TP (models/llama.py:189,193)": (
        "yes, for a model it knows", "yes: the node's config.json",
        "no: its stand-in models are MLA or carry no KV-head split"),
    "model: experts / EP": (
        "yes, for a model it knows", "yes: the node's config.json",
        "no: it builds no expert layers"),
    "model: layers / PP (distributed/utils.py get_pp_indices)": (
        "yes, for a model it knows", "yes: the node's config.json",
        "no: it builds no pipeline stages"),
    "model: weights per GPU / GPU memory x --mem-fraction-static": (
        "yes, for a model it knows and a GPU it knows (or sglang_server_gpu_memory_gb)",
        "yes: the checkpoint's size on disk, the GPUs' memory from NVML",
        "no: its memory use comes from its profile"),
    "every other raise/assert of the resolution's hooks (sglang/srt/arg_groups/*.py)": (
        "no: they read the model's config and the hardware, which the controller does not have",
        "yes: the installed SGLang resolves the exact command line on the node",
        "no: the simulator models the checks above only"),
}


@pytest.fixture(scope="module")
def env():
    return refenv.ensure(VERSION, quiet=True)


@pytest.fixture(scope="module")
def model_dir(env):
    return str(refenv.sample_model_dir())


def random_layouts() -> list[list[str]]:
    """Parallel layouts drawn at random over the sizes operators use."""
    draw = random.Random(25)
    cases = []
    for _ in range(60):
        flags = ["--tp-size", str(draw.choice([1, 2, 3, 4, 6, 8, 16]))]
        for flag, sizes in (("--dp-size", [1, 1, 2, 3]), ("--attn-dp-size", [1, 1, 2, 3, 4]),
                            ("--ep-size", [1, 1, 2, 3, 4, 8, 16]), ("--nnodes", [1, 1, 2, 3]),
                            ("--pp-size", [1, 1, 2])):
            size = draw.choice(sizes)
            if size > 1:
                flags += [flag, str(size)]
        if "--nnodes" in flags:
            flags += ["--dist-init-addr", "127.0.0.1:20000"]
        cases.append(flags)
    return cases


KIMI_TP3 = ["--tp-size", "3"]


@pytest.fixture(scope="module")
def real(env, model_dir):
    """SGLang's verdict on every case of this module, in one probe run (each run imports
    SGLang, torch and transformers: seconds)."""
    cases = {**{("check", k): v for k, v in CASE_OF_CHECK.items()},
             **{("random", i): v for i, v in enumerate(random_layouts())},
             ("kimi", "tp3"): KIMI_TP3}
    verdicts = env.probe("check", [{"argv": ["--model-path", model_dir, *flags]}
                                   for flags in cases.values()])
    return dict(zip(cases, verdicts, strict=True))


def ours(model_dir: str, flags: list[str]):
    values = vars(catalogue(VERSION).parse(["--model-path", model_dir, *flags]))
    found = refusals(VERSION, values)
    return found[0] if found else None


@pytest.mark.parametrize("check", [c.id for c in CHECKS_0_5_23])
def test_each_check_gives_sglangs_own_verdict(check, real, model_dir):
    verdict = real[("check", check)]
    assert not verdict["ok"], f"SGLang {VERSION} accepts {CASE_OF_CHECK[check]}"
    refusal = ours(model_dir, CASE_OF_CHECK[check])
    assert refusal is not None and refusal.check == check
    assert verdict["error"] == [refusal.final_line]
    raised = verdict["raised_at"]
    assert (raised["file"], raised["line"]) == (refusal.source, refusal.line)
    assert raised["code"] == refusal.code
    # The simulator: the same error, raised as SGLang raises it.
    args = prepare_server_args(["--model-path", model_dir, *CASE_OF_CHECK[check]])
    with pytest.raises(SGLangError) as sim:
        args.resolve_once()
        args.check_server_args()
    assert sim.value.final_line == refusal.final_line


def test_random_parallel_layouts_get_the_same_verdict_from_both(real, model_dir):
    """SGLang and the controller accept and refuse the same layouts, with the same first
    reason."""
    refused = 0
    for i, flags in enumerate(random_layouts()):
        verdict = real[("random", i)]
        refusal = ours(model_dir, flags)
        first = refusal.final_line if refusal else None
        # Only the checks the controller models: anything else would be a row of TABLE.
        real_line = None if verdict["ok"] else verdict["error"][0]
        assert real_line == first, (flags, real_line, first)
        refused += bool(first)
    assert 10 < refused < 50  # both sides refuse and accept in earnest


def test_each_frame_of_the_simulators_tracebacks_is_sglangs(env):
    """The statements the simulator prints above each refusal are at those lines of the
    release's files."""
    frames = {(f.file, f.line, f.code) for stage in STAGE_FRAMES.values() for f in stage}
    frames |= {(c.source, c.line, c.code) for c in CHECKS_0_5_23}
    frames |= {(c.pipeline_call.file, c.pipeline_call.line, c.pipeline_call.code)
               for c in CHECKS_0_5_23 if c.pipeline_call}
    frames |= {(file, line, code) for stack in HEADS_FRAMES.values()
               for file, line, _, code in stack}
    for file, line, code in sorted(frames):
        text = (env.sglang_dir / file).read_text().splitlines()[line - 1].strip()
        assert text == code, f"{file}:{line} holds {text!r}, not {code!r}"


def test_kimi_at_tp_3_passes_sglangs_argument_checks_and_fails_at_model_load(real, model_dir):
    """SGLang's resolution accepts it: the heads assertion comes once the model is built, an
    hour into a 1T-parameter start. The controller refuses it by the model's shape
    (tests/unit/test_refusals_before_cost.py), not by these checks."""
    assert real[("kimi", "tp3")]["ok"], real[("kimi", "tp3")]
    assert ours(model_dir, KIMI_TP3) is None


def test_the_node_check_refuses_what_the_installed_sglang_refuses(env, model_dir, tmp_path):
    """The node check's own parse step (module_utils/deploy/argcheck.parse_args) on the real
    package: its post-parse checks run, and the refusal is SGLang's final line and where it
    raised."""
    # The node's hardware answers, as the probe gives them (a real node answers itself).
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent("""
        import sglang.srt.utils.common as common
        common.get_device = lambda *a, **k: "cuda"
        common.get_device_memory_capacity = lambda *a, **k: 96 * 1024
    """))
    python = str(env.python)
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={env.sglang_dir}:{tmp_path} exec {python} "
                       '"$@"\n')
    wrapper.chmod(0o755)
    parser = "sglang.srt.server_args:prepare_server_args"
    base = ["--model-path", model_dir]
    assert parse_args(str(wrapper), parser, base + ["--tp-size", "8"]) is None
    message, rc = parse_args(str(wrapper), parser,
                             base + CASE_OF_CHECK["tokenizer-workers"])
    assert rc == 1
    assert message == ("SGLang rejected the rendered arguments: AssertionError: Tokenizer "
                       "worker num must >= 1 (sglang/srt/arg_groups/validation_hook.py:273)")


def test_the_table_covers_every_check_and_says_why_not(env):
    for check in CHECKS_0_5_23:
        assert check.id in TABLE
    for row, cells in TABLE.items():
        assert len(cells) == 3
        for cell in cells:
            assert cell.startswith("yes") or cell.startswith("no: "), (row, cell)
    # The row for the rest stays honest: the release has far more refusals than modelled.
    hooks = sorted((env.sglang_dir / "sglang" / "srt" / "arg_groups").glob("*.py"))
    statements = sum(len(re.findall(r"^\s*(raise \w*Error|assert )", p.read_text(), re.M))
                     for p in hooks)
    assert statements > 5 * len(CHECKS_0_5_23)


def test_the_nine_combinations_of_the_issue_are_refused_by_sglang(real):
    """tp 8 with attention DP 3, DP attention at 3, attention DP with replicas, EP 3, EP 16,
    a served name with a colon, TP 16 over 3 nodes, zero tokenizer workers, padding off with
    torch.compile: SGLang itself refuses each (the controller's agreement is above)."""
    for check in ("tp-divides-attn-dp", "dp-with-attn-dp", "parallel-topology",
                  "served-name-colon", "tp-pp-over-nodes", "tokenizer-workers",
                  "graph-padding-vs-compile", "multi-node-dp"):
        assert not real[("check", check)]["ok"], check
