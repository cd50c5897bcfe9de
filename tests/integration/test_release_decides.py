"""The pinned release decides, before any node is touched: `sglang-fleet check` refuses each
command line that the real SGLang 0.5.23 refuses after its parser (drawn from the `raise` and
`assert` statements of its resolution hooks), with exit 2, SGLang's own reason and the file
that raised it; each line's accepted twin (the same line, fixed) passes.

One inventory holds every line and every twin, one host each, and one `sglang-fleet check`
judges them all: the release's environment runs once for the whole table.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from sglang_fleet.known.catalogue import catalogue
from sglang_fleet.settings.server import owners_by_dest
from sglang_fleet.testfleet.local import BIN, REPO, ansible_env, make_fleet

pytestmark = pytest.mark.integration

VERSION = "0.5.23"
VALIDATION = "sglang/srt/arg_groups/validation_hook.py"
SERVING = "sglang/srt/arg_groups/serving_hook.py"
PARALLEL = "sglang/srt/arg_groups/parallel_hook.py"
TOPOLOGY = "sglang/srt/runtime_context.py"
KEY, CERT, CA = "/etc/sglang/tls.key", "/etc/sglang/tls.pem", "/etc/sglang/ca.pem"
TLS = ["--ssl-keyfile", KEY, "--ssl-certfile", CERT]
PORT = "{port}"  # the host's own --port

# (refused line, its accepted twin, the file SGLang raises in, its reason as it says it)
TABLE = [
    (["--page-size", "3", "--chunked-prefill-size", "8192"],
     ["--page-size", "4", "--chunked-prefill-size", "8192"], VALIDATION,
     "chunked_prefill_size must be divisible by page_size"),
    (["--retraction-policy", "priority"],
     ["--retraction-policy", "priority", "--enable-priority-scheduling"], VALIDATION,
     "--retraction-policy priority requires --enable-priority-scheduling"),
    (["--export-metrics-to-file"],
     ["--export-metrics-to-file", "--export-metrics-to-file-dir", "/var/log/sglang"],
     VALIDATION, "--export-metrics-to-file-dir is required"),
    (["--ssl-keyfile", KEY], TLS, SERVING, "--ssl-keyfile requires --ssl-certfile"),
    (["--ssl-certfile", CERT], TLS, SERVING, "--ssl-certfile requires --ssl-keyfile"),
    (["--ssl-ca-certs", CA], [*TLS, "--ssl-ca-certs", CA], SERVING,
     "--ssl-ca-certs has no effect without --ssl-certfile and --ssl-keyfile"),
    (["--enable-ssl-refresh"], [*TLS, "--enable-ssl-refresh"], SERVING,
     "--enable-ssl-refresh requires --ssl-certfile and --ssl-keyfile"),
    (["--gc-threshold", "700", "10", "10", "5"], ["--gc-threshold", "700", "10", "10"],
     VALIDATION, "gc_threshold, it must contain 1 to 3 integers"),
    (["--enable-two-batch-overlap"], ["--enable-two-batch-overlap", "--moe-a2a-backend",
                                      "deepep"], VALIDATION,
     "When enabling two batch overlap without an EP a2a backend"),
    (["--schedule-conservativeness", "-1"], ["--schedule-conservativeness", "0.5"],
     VALIDATION, "schedule_conservativeness must be non-negative"),
    (["--grpc-port", PORT], ["--grpc-port", "45999"], VALIDATION,
     "must differ from --port"),
    (["--grpc-port", "70000"], ["--grpc-port", "45998"], SERVING,
     "must be between 1 and 65535"),
    (["--grpc-response-timeout-secs", "0"], ["--grpc-response-timeout-secs", "30"], SERVING,
     "--grpc-response-timeout-secs must be positive"),
    (["--enable-http-worker-reuseport"],
     ["--enable-http-worker-reuseport", "--tokenizer-worker-num", "2"], SERVING,
     "--enable-http-worker-reuseport requires --tokenizer-worker-num > 1"),
    (["--asr-max-buffer-seconds", "0"], ["--asr-max-buffer-seconds", "30"], SERVING,
     "--asr-max-buffer-seconds must be positive"),
    (["--asr-max-concurrent-sessions", "0"], ["--asr-max-concurrent-sessions", "4"], SERVING,
     "--asr-max-concurrent-sessions must be positive"),
    (["--mm-preprocess-cache-size-mb", "-1"], ["--mm-preprocess-cache-size-mb", "64"],
     SERVING, "mm_preprocess_cache_size_mb must be non-negative"),
    (["--enable-priority-scheduling", "--schedule-policy", "random"],
     ["--enable-priority-scheduling", "--schedule-policy", "fcfs"], VALIDATION,
     "To use priority scheduling, schedule_policy must be 'fcfs' or 'lof'"),
    (["--prefill-decode-interval", "-1"], ["--prefill-decode-interval", "2"], VALIDATION,
     "--prefill-decode-interval must be non-negative"),
    (["--prefill-decode-interval-min-bs", "-1"], ["--prefill-decode-interval-min-bs", "2"],
     VALIDATION, "--prefill-decode-interval-min-bs must be non-negative"),
    (["--return-aux-hidden-state-layer-ids", "1"],
     ["--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3",
      "--return-aux-hidden-state-layer-ids", "1"], VALIDATION,
     "--return-aux-hidden-state-layer-ids requires --enable-return-aux-hidden-states"),
    (["--enable-return-aux-hidden-states"],
     ["--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3"], VALIDATION,
     "--enable-return-aux-hidden-states needs --speculative-algorithm"),
    (["--tokenizer-worker-num", "0"], ["--tokenizer-worker-num", "1"], VALIDATION,
     "Tokenizer worker num must >= 1"),
    (["--detokenizer-worker-num", "0"], ["--detokenizer-worker-num", "1"], VALIDATION,
     "Detokenizer worker num must >= 1"),
    (["--mm-processor-worker-num", "-1"], ["--mm-processor-worker-num", "0"], VALIDATION,
     "Multimodal processor worker num must >= 0"),
    (["--mm-io-worker-num", "-1"], ["--mm-io-worker-num", "0"], VALIDATION,
     "Multimodal I/O worker num must >= 0"),
    (["--base-gpu-id", "-1"], ["--base-gpu-id", "0"], VALIDATION,
     "base_gpu_id must be non-negative"),
    (["--gpu-id-step", "0"], ["--gpu-id-step", "1"], VALIDATION,
     "gpu_id_step must be positive"),
    (["--moe-dense-tp-size", "4"], ["--moe-dense-tp-size", "1"], VALIDATION,
     "moe_dense_tp_size only supports None, 1, or tp_size"),
    (["--served-model-name", "kimi:prod"], ["--served-model-name", "kimi-prod"], VALIDATION,
     "served_model_name cannot contain a colon"),
    (["--attn-dp-size", "3"], ["--attn-dp-size", "4"], PARALLEL, "AssertionError"),
    (["--attn-dp-size", "0"], ["--attn-dp-size", "1"], PARALLEL,
     "--attn-dp-size must be positive"),
    (["--ep-size", "3"], ["--ep-size", "4"], TOPOLOGY, "parallel topology is inconsistent"),
    (["--pp-max-micro-batch-size", "0"], ["--pp-max-micro-batch-size", "1"], VALIDATION,
     "pp_max_micro_batch_size must be a positive integer"),
    (["--disable-cuda-graph-padding", "--enable-torch-compile"], ["--enable-torch-compile"],
     VALIDATION, "--disable-cuda-graph-padding is incompatible with --enable-torch-compile"),
    (["--enable-pdmux"], ["--enable-pdmux", "--chunked-prefill-size", "-1",
                          "--disable-overlap-schedule"], VALIDATION,
     "PD-Multiplexing is not compatible with chunked prefill"),
    (["--sidecar-args", '["--verbose"]'],
     ["--sidecar", "tracer", "--sidecar-args", '["--verbose"]', "--grpc-port", "45990"],
     SERVING, "--sidecar-args requires --sidecar."),
    (["--prompt-tokens-buckets", "tse", "2", "3"],
     ["--prompt-tokens-buckets", "tse", "1000", "2", "8"], VALIDATION,
     "TSE rule requires exactly 4 parameters"),
    (["--prompt-tokens-buckets", "custom", "100", "100"],
     ["--prompt-tokens-buckets", "custom", "100", "200"], VALIDATION,
     "should not contain duplicates"),
    (["--generation-tokens-buckets", "bogus"], ["--generation-tokens-buckets", "default"],
     VALIDATION, "Unsupported --generation-tokens-buckets rule type"),
    (["--sampling-mask-max-tokens", "0"], ["--sampling-mask-max-tokens", "64"], VALIDATION,
     "--sampling-mask-max-tokens must be positive"),
    (["--load-format", "instanttensor", "--device", "cpu"], ["--load-format", "instanttensor"],
     VALIDATION, "InstantTensor requires a CUDA-compatible device"),
]


def host_vars(flags: list[str], port: int) -> dict:
    """A host's inventory variables for a line: the flags a setting owns set that setting (as
    an operator must), the others go in sglang_server_extra_args."""
    cat = catalogue(VERSION)
    owners = owners_by_dest(cat)
    out: dict = {}
    extra: list[str] = []
    i = 0
    while i < len(flags):
        option = cat.by_flag[flags[i]]
        values = []
        while i + 1 < len(flags) and option.takes_values and not flags[i + 1].startswith("--"):
            values.append(flags[i + 1].replace(PORT, str(port)))
            i += 1
        owner = owners.get(option.dest)
        if owner is None:
            extra += [flags[i - len(values)], *values]
        else:
            out[owner.variable] = yaml.safe_load(values[0]) if values else True
        i += 1
    if extra:
        out["sglang_server_extra_args"] = extra
    if "sglang_server_served_model_name" in out:  # it would name the deployment
        out["sglang_server_deployment_name"] = "kimi"
    return out


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """One `sglang-fleet check` of the whole table: host refused-N holds line N, accepted-N
    its twin. Returns the output by host, and the exit code."""
    tmp = tmp_path_factory.mktemp("release-decides")
    fleet = make_fleet(tmp, hosts=2 * len(TABLE))
    names = {}
    for n, (bad, good, _, _) in enumerate(TABLE):
        for kind, flags, host in (("refused", bad, fleet.hosts[2 * n]),
                                  ("accepted", good, fleet.hosts[2 * n + 1])):
            fleet.set_host_vars(host, host_vars(flags, fleet.port(host)))
            names[host] = f"{kind}-{n}"
    proc = subprocess.run(
        [str(BIN / "sglang-fleet"), "check", "-i", str(fleet.inventory), "-e",
         json.dumps(fleet.extra), "--run-dir", str(tmp / "run")], cwd=REPO, env=ansible_env(),
        capture_output=True, text=True, timeout=900)
    (tmp / "check.out").write_text(proc.stdout + proc.stderr)
    blocks: dict[str, str] = {}
    for block in re.split(r"^(?=refused \[)", proc.stdout, flags=re.M):
        match = re.match(r"refused \[([^\]]+)\]:", block)
        for host in match.group(1).split(", ") if match else ():
            blocks[names[host]] = block  # hosts refused alike share one block
    assert not fleet.root.exists(), "the check touched a node"
    return proc, blocks


def test_the_table_is_drawn_from_the_release_and_large_enough():
    assert len(TABLE) >= 40
    assert len({tuple(bad) for bad, *_ in TABLE}) == len(TABLE)


def test_check_refuses_the_table_with_exit_2_before_any_node(checked):
    proc, blocks = checked
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{len(TABLE)} of {2 * len(TABLE)} hosts have problems" in proc.stdout
    assert "no node was contacted" in proc.stdout


@pytest.mark.parametrize("n", range(len(TABLE)),
                         ids=[" ".join(bad)[:48] for bad, *_ in TABLE])
def test_each_line_is_refused_with_sglangs_reason_and_file(checked, n):
    _, blocks = checked
    bad, _, file, reason = TABLE[n]
    block = blocks.get(f"refused-{n}")
    assert block is not None, f"{bad} was not refused"
    assert f"SGLang {VERSION} refuses the command line" in block
    assert reason in block and f"({file}:" in block, block
    assert "Fix:" in block


@pytest.mark.parametrize("n", range(len(TABLE)),
                         ids=[" ".join(good)[:48] for _, good, *_ in TABLE])
def test_each_accepted_twin_passes(checked, n):
    _, blocks = checked
    assert f"accepted-{n}" not in blocks, blocks.get(f"accepted-{n}")
