"""The pinned release decides: its own resolution pipeline on each host's exact command line,
on the controller, before any node is touched.

Each host's LaunchSpec build leaves a case (`case_of`): the rendered command line (secrets as
placeholders), the facts the toolkit has for what only the node knows (the GPUs' memory and
compute capability from the inventory's hardware, the model's config.json from the known-model
table), and which inventory variable set each SGLang option. `judge` runs every case of one
release in ONE run of that release's environment (catalogue_probe.py `check`: parse, resolve,
check_server_args, publish), and keeps each verdict in the controller's cache, keyed by what
the release reads. `problems` turns a refusal into the host's error: SGLang's own message,
file and line, the inventory variable behind it and the fix.

What cannot be decided before the load stays the toolkit's own (sglang_checks).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sglang_fleet.known import release_cache
from sglang_fleet.known.models import known_model

# The value a secret option is given on the controller: the real one never leaves the vault.
SECRET_PLACEHOLDER = "sglang-fleet-secret-placeholder"
MODEL_TOKEN = "<model>"  # replaced by the controller's copy of the model's config folder
# A release's checks read these as names of the node's files: there, not here.
NODE_FILE_DESTS = ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs", "tokenizer_path",
                   "chat_template", "completion_template", "json_model_override_args_file",
                   "load_balance_method_config", "kv_events_config")
# An MLA model of the DeepSeek-V3 family as transformers' DeepseekV3Config takes it; the known
# model's own shape replaces the fields that decide layouts.
_MLA_BASE = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "first_k_dense_replace": 1, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "n_group": 1, "topk_group": 1, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 163840,
    "max_position_embeddings": 262144, "rope_theta": 50000.0, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid",
    "topk_method": "noaux_tc", "norm_topk_prob": True, "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
}
_MHA_BASE = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "intermediate_size": 14336,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False, "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
}


def read_model_config(path: str) -> dict[str, Any]:
    """An operator's copy of a model's config.json (the file, or the folder that holds it);
    ValueError says why it is not usable."""
    file = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot be read on the controller ({exc.strerror})") from None
    except ValueError as exc:
        raise ValueError(f"is not JSON ({exc})") from None
    if not isinstance(config, dict) or not config.get("architectures"):
        raise ValueError("is not a model's config.json (it has no architectures)")
    return config


def model_config(model_path: str | None, copy: str | None = None
                 ) -> tuple[dict[str, Any] | None, str]:
    """The config.json SGLang's resolution reads for this model, and where it came from: the
    operator's copy, else one with the known model's shape."""
    if copy:
        return read_model_config(copy), f"sglang_server_model_config ({copy})"
    model = known_model(model_path)
    if model is None:
        return None, (f"the controller has no config.json for model {model_path!r} (not in "
                      "data/models.yml): set sglang_server_model_config to a copy of it")
    shape = {"num_attention_heads": model.num_attention_heads,
             "num_key_value_heads": model.num_key_value_heads,
             "num_hidden_layers": model.num_hidden_layers}
    if model.attention == "MLA":
        config = {**_MLA_BASE, **shape, "n_routed_experts": model.n_routed_experts or 0}
    else:
        config = {**_MHA_BASE, **shape, "hidden_size": 128 * model.num_attention_heads}
    return config, f"the known model {model.name}'s shape (data/models.yml)"


def case_of(version: str, argv: list[Any], model: tuple[dict[str, Any] | None, str],
            sources: dict[str, list[Any]], gpu_memory_bytes: int | None,
            capability: str | None) -> dict[str, Any]:
    """One host's question to its release, as plain data (Ansible carries it as a fact).
    `model`: the config.json and where it came from (model_config); `sources`: SGLang
    destination -> [inventory variable, the value as shown]."""
    config, config_source = model
    words: list[str] = []
    for i, item in enumerate(argv):
        if isinstance(item, dict):
            words.append(SECRET_PLACEHOLDER)
        elif i and argv[i - 1] == "--model-path":
            words.append(MODEL_TOKEN)
        else:
            words.append(str(item))
    unchecked = []
    if config is None:
        unchecked.append(f"SGLang's resolution (it reads the model's config.json): "
                         f"{config_source}")
    if gpu_memory_bytes is None:
        unchecked.append("the defaults SGLang sizes from GPU memory: the GPU model is not "
                         "known (set sglang_server_gpu_memory_gb)")
    if capability is None:
        unchecked.append("the choices SGLang makes by GPU architecture: set "
                         "sglang_server_gpu_compute_capability")
    return {"version": version, "argv": words, "model_config": config,
            "model_config_source": config_source,
            "gpu_memory_mb": gpu_memory_bytes / (1 << 20) if gpu_memory_bytes else None,
            "capability": [int(x) for x in capability.split(".")[:2]] if capability else None,
            "sources": sources, "unchecked": unchecked}


# ---- asking the release --------------------------------------------------------------------

def _model_dir(config: dict[str, Any]) -> Path:
    text = json.dumps(config, indent=1, sort_keys=True) + "\n"
    folder = release_cache.root() / "models" / hashlib.sha256(text.encode()).hexdigest()[:16]
    path = folder / "config.json"
    if not path.exists() or path.read_text() != text:
        release_cache.write_json(path, config)
    return folder


def probe_case(case: dict[str, Any]) -> dict[str, Any]:
    """What catalogue_probe.py `check` takes for one case."""
    config = case["model_config"]
    folder = str(_model_dir(config)) if config else "/nonexistent-model"
    argv = [folder if w == MODEL_TOKEN else w for w in case["argv"]]
    node_paths = [argv[i + 1] for i, w in enumerate(argv[:-1])
                  if w.lstrip("-").replace("-", "_") in NODE_FILE_DESTS]
    return {"argv": argv, "gpu_memory_mb": case["gpu_memory_mb"],
            "capability": case["capability"], "node_paths": sorted(set(node_paths)),
            "parse_only": config is None}


@dataclass(frozen=True)
class Asked:
    host: str
    question: dict[str, Any]
    key: str
    shifted_key: str | None  # where an accepted verdict also serves other ports


def _probe_version() -> str:
    text = resources.files("sglang_fleet.known").joinpath("catalogue_probe.py").read_text()
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _key(version: str, question: dict[str, Any]) -> str:
    blob = json.dumps([version, _probe_version(), question], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


_PORT_FLAG = re.compile(r"^--[a-z-]*port$")
CANONICAL_LOWEST_PORT = 30000


def _port_shifted(question: dict[str, Any]) -> dict[str, Any] | None:
    """The question with every port moved by one offset, the lowest to 30000: SGLang's
    resolution compares ports with each other and with their range, so a line it accepts is
    accepted at any offset that keeps them in range. Lets an accepted verdict serve the same
    fleet on other ports (None: no ports, or one out of range)."""
    argv = list(question["argv"])
    places: list[tuple[int, str]] = []
    for i, word in enumerate(argv[:-1]):
        value = argv[i + 1]
        if _PORT_FLAG.match(word) and value.isdigit():
            places.append((i + 1, ""))
        elif word == "--dist-init-addr" and value.rpartition(":")[2].isdigit():
            places.append((i + 1, value.rpartition(":")[0] + ":"))
    ports = [int(argv[i][len(prefix):]) for i, prefix in places]
    if not ports or not all(1 <= port <= 65535 for port in ports):
        return None
    shift = CANONICAL_LOWEST_PORT - min(ports)
    if max(ports) + shift > 65535:
        return None
    for (i, prefix), port in zip(places, ports, strict=True):
        argv[i] = f"{prefix}{port + shift}"
    return {**question, "argv": argv}


def _cached(version: str, key: str) -> dict[str, Any] | None:
    path = release_cache.root() / "verdicts" / version / f"{key}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def judge(cases: dict[str, dict[str, Any]], quiet: bool = True) -> dict[str, dict[str, Any]]:
    """Each host's verdict from its pinned release: the cache's where it has one, else one
    run of each release's environment for all of that release's hosts together. A release
    whose environment cannot be built gives each of its hosts {"ok": False, "build_error"}."""
    from sglang_fleet.known import refenv

    verdicts: dict[str, dict[str, Any]] = {}
    pending: dict[str, list[Asked]] = {}
    for host, case in cases.items():
        question = probe_case(case)
        key = _key(case["version"], question)
        shifted = _port_shifted(question)
        also = _key(case["version"], shifted) if shifted else None
        hit = _cached(case["version"], key)
        accepted = _cached(case["version"], also) if also and hit is None else None
        if hit is not None:
            verdicts[host] = hit
            _remember_config(case, key, question)
        elif accepted is not None and also and accepted.get("ok"):
            verdicts[host] = accepted
            _remember_config(case, also, question)
        else:
            pending.setdefault(case["version"], []).append(Asked(host, question, key, also))
    for version, asked in pending.items():
        try:
            env = refenv.ensure(version, quiet=quiet)
            answers = env.check([a.question for a in asked])
        except refenv.RefEnvError as exc:
            for a in asked:
                verdicts[a.host] = {"ok": False, "build_error": str(exc)}
            continue
        for a, answer in zip(asked, answers, strict=True):
            answer = {k: answer.get(k) for k in ("ok", "error", "raised_at")}
            folder = release_cache.root() / "verdicts" / version
            release_cache.write_json(folder / f"{a.key}.json", answer)
            if answer["ok"] and a.shifted_key:
                release_cache.write_json(folder / f"{a.shifted_key}.json", answer)
            verdicts[a.host] = answer
            _remember_config(cases[a.host], a.key, a.question)
    return verdicts


# ---- the verdict, read by a simulated server -----------------------------------------------
# A simulated server runs on the controller's machine: it finds the verdict on its own command
# line by the configuration hash its environment carries (SGLANG_FLEET_CONFIG), instead of
# running the pipeline again (seconds of CPU per server). The case of a simulated server holds
# that hash ("sim_config", spec.py); judge records which verdict it got.

def _config_file(version: str, config_hash: str) -> Path:
    return release_cache.root() / "verdicts" / version / "configs" / f"{config_hash}.json"


def _remember_config(case: dict[str, Any], key: str, question: dict[str, Any]) -> None:
    if case.get("sim_config"):
        release_cache.write_json(_config_file(case["version"], case["sim_config"]),
                                 {"key": key, "parse_only": question["parse_only"]})


def config_verdict(version: str, config_hash: str | None
                   ) -> tuple[dict[str, Any] | None, str]:
    """The release's verdict on a deployed configuration's command line, with "parse_only"
    (only its parser ran: the controller had no config.json for the model); else None and
    why there is none, in a sentence."""
    if not config_hash:
        return None, ("no configuration hash (SGLANG_FLEET_CONFIG): a server not started by "
                      "a deploy")
    where = _config_file(version, config_hash)
    try:
        entry = json.loads(where.read_text())
        key, parse_only = str(entry["key"]), bool(entry.get("parse_only"))
    except (OSError, ValueError, KeyError, TypeError):
        return None, (f"no verdict of SGLang {version} on configuration {config_hash} in "
                      f"{where.parent}")
    verdict = _cached(version, key)
    if verdict is None:
        return None, f"its verdict {key} is missing from {where.parent.parent}"
    return {**verdict, "parse_only": parse_only}, ""


# ---- the verdict, said to the operator -----------------------------------------------------

def _mentioned_dests(verdict: dict[str, Any], flag_dests: dict[str, str],
                     known: set[str]) -> list[str]:
    """The SGLang arguments a refusal names, in order: as flags or `cfg.<name>` in its
    message and statement, or by their own name (`known`: the command line's)."""
    raised = verdict.get("raised_at") or {}
    text = " ".join((verdict.get("error") or []) + [raised.get("statement") or "",
                                                    raised.get("code") or ""])
    found: list[str] = []
    for match in re.finditer(r"--[a-z0-9][a-z0-9-]*|\b[a-z][a-z0-9_]*\b", text):
        word = match.group(0)
        # SGLang names the expert-parallel size moe_ep_size where it resolves it.
        dest = flag_dests.get(word) if word.startswith("--") else (
            word if word in known else word.removeprefix("moe_"))
        if dest in known and dest not in found:
            found.append(dest)
    return found


def refused_by(case: dict[str, Any], verdict: dict[str, Any],
               flag_dests: dict[str, str]) -> list[tuple[str, str]]:
    """The inventory variables (and their values as shown) behind a refusal: those that set
    the arguments it names, first named first; else extra_args, else the release itself."""
    sources = case["sources"]
    named: list[tuple[str, str]] = []
    for dest in _mentioned_dests(verdict, flag_dests, set(sources)):
        pair = (sources[dest][0], sources[dest][1])
        if pair not in named:
            named.append(pair)
    if named:
        return named
    extra = [(v, s) for v, s in sources.values() if v == "sglang_server_extra_args"]
    return extra[:1] or [("sglang_server_version", repr(case["version"]))]


def describe(verdict: dict[str, Any]) -> str:
    """SGLang's final line and where it raised, on one line."""
    line = " ".join(verdict.get("error") or ["refused"]).replace("\n", "; ")
    raised = verdict.get("raised_at")
    if raised:
        where = f"{raised['file']}:{raised['line']}"
        return f"{line} ({where}: {raised['code']})" if line.endswith("Error") else \
            f"{line} ({where})"
    return line


def needs_gpu_build(verdict: dict[str, Any]) -> bool:
    """Not SGLang's verdict on the line: its resolution imports a module only a GPU build of
    SGLang has, which a CPU-only controller cannot load."""
    return " ".join(verdict.get("error") or []).startswith(("ModuleNotFoundError",
                                                           "ImportError"))


def problems(host: str, case: dict[str, Any], verdict: dict[str, Any],
             flag_dests: dict[str, str]) -> tuple[list[str], list[str]]:
    """The host's errors and notes from its release's verdict."""
    version = case["version"]
    notes = [f"host {host}: not checked by SGLang {version} for lack of a fact: {n}"
             for n in case["unchecked"]]
    if verdict.get("build_error"):
        return [_refusal(host, "sglang_server_version", repr(version),
                         f"SGLang {version}'s own checks could not run: "
                         f"{verdict['build_error']}",
                         f"sglang-fleet release add {version} (with --wheelhouse DIR where the "
                         "registry is out of reach)")], notes
    if verdict.get("ok"):
        return [], notes
    final = " ".join(verdict.get("error") or [])
    if needs_gpu_build(verdict):
        raised = verdict.get("raised_at") or {}
        return [], notes + [f"host {host}: not checked by SGLang {version}'s resolution: it "
                            f"imports what a CPU-only controller cannot load ({final}, "
                            f"{raised.get('file')}:{raised.get('line')}); its parser and the "
                            f"toolkit's own checks ran"]
    named = refused_by(case, verdict, flag_dests)
    (variable, shown), others = named[0], named[1:]
    stage = "its parser" if case["model_config"] is None else "its argument resolution"
    also = f" (with {', '.join(f'{v}={s}' for v, s in others)})" if others else ""
    return [_refusal(host, variable, shown,
                     f"SGLang {version} refuses the command line in {stage}, before any "
                     f"worker starts{also}: {describe(verdict)}",
                     f"change {' or '.join(v for v, _ in named)} as SGLang's reason says, or "
                     f"pin a release that accepts the line")], notes


def _refusal(host: str, variable: str, shown: str, problem: str, fix: str) -> str:
    # The form of every host's refusal (settings.problems.SpecError, a floor above this one).
    return f"host {host}: {variable}={shown}: {problem}. Fix: {fix}"


def batch_problems(cases: dict[str, dict[str, Any]]) -> dict[str, dict[str, list[str]]]:
    """Every host's errors and notes from its pinned release, all hosts of one release asked
    in one run of its environment."""
    from sglang_fleet.known.catalogue import catalogue

    verdicts = judge(cases)
    out = {}
    for host, case in cases.items():
        flag_dests = {f: o.dest for f, o in catalogue(case["version"]).by_flag.items()}
        errors, notes = problems(host, case, verdicts[host], flag_dests)
        out[host] = {"errors": errors, "notes": notes}
    return out
